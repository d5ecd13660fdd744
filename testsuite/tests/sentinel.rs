//! Redis Sentinel: the backend finds the primary through the sentinels and
//! follows it through a failover (its primary SIGKILLed mid-run, the
//! replica promoted); every task still ends, each step's effect once.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::redis_sentinel::{TestSentinel, SERVICE};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;

/// Three steps of 40 ms, retried (an attempt whose worker lost its lease in
/// the failover is a failed attempt); the last step's effects are counted
/// by input.
struct Slow {
    done: Arc<Mutex<HashMap<u64, usize>>>,
}

#[saga(name = "slow")]
impl Slow {
    #[saga_step(1)]
    #[retry_policy(max_retries = 10, backoff = constant, base_delay_ms = 100)]
    async fn one(&self, n: u64) -> Result<u64, StepError> {
        tokio::time::sleep(Duration::from_millis(40)).await;
        Ok(n)
    }
    #[saga_step(2)]
    #[retry_policy(max_retries = 10, backoff = constant, base_delay_ms = 100)]
    async fn two(&self, n: u64) -> Result<u64, StepError> {
        tokio::time::sleep(Duration::from_millis(40)).await;
        Ok(n)
    }
    #[saga_step(3)]
    #[retry_policy(max_retries = 10, backoff = constant, base_delay_ms = 100)]
    async fn three(&self, n: u64) -> Result<u64, StepError> {
        tokio::time::sleep(Duration::from_millis(40)).await;
        *self.done.lock().unwrap().entry(n).or_default() += 1;
        Ok(n)
    }
}

fn config() -> RedisConfig {
    RedisConfig {
        visibility_timeout: Duration::from_millis(1500),
        block: Duration::from_millis(100),
        response_timeout: Duration::from_secs(2),
        ..RedisConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_ends_across_a_failover() {
    let mut deployment = TestSentinel::start();
    let urls = deployment.sentinel_urls();
    let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
    let done = Arc::new(Mutex::new(HashMap::new()));
    let engine = Engine::builder()
        .backend(
            RedisBackend::connect_sentinel(&sentinels, SERVICE, config())
                .await
                .unwrap(),
        )
        .saga(Slow { done: done.clone() })
        .workers(2)
        .worker_concurrency(4)
        .build()
        .await
        .unwrap();
    const TASKS: u64 = 40;
    let mut ids = Vec::new();
    for n in 0..TASKS {
        ids.push(engine.start::<Slow>(n).await.unwrap());
    }
    // What was acknowledged up to here survives the failover (replication
    // is asynchronous: writes after this point may be lost with the
    // primary, and the engine redoes the steps they recorded).
    let replicated = tokio::task::block_in_place(|| {
        deployment.wait_replicated();
        // Let the workers be mid-run when the primary dies.
        std::thread::sleep(Duration::from_millis(300));
        let old = deployment.kill_primary();
        let new = deployment.wait_failover(old);
        // The old primary comes back (empty: no persistence) a moment
        // later, as a restarted process does; the sentinels demote it.
        std::thread::sleep(Duration::from_millis(1500));
        deployment.restart(old);
        (old, new)
    });
    // A task started after the failover runs on the new primary.
    let late = engine.start::<Slow>(TASKS).await.unwrap();
    ids.push(late);
    for id in &ids {
        let late = *id == late;
        let task = match tokio::time::timeout(Duration::from_secs(60), engine.wait(*id)).await {
            Ok(Ok(task)) => task,
            Ok(Err(e)) => panic!("task {id} (late: {late}): {e} {replicated:?}"),
            Err(_) => panic!("task {id} did not end after the failover {replicated:?}"),
        };
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
    }
    let done = done.lock().unwrap().clone();
    for n in 0..=TASKS {
        assert!(
            done.get(&n).copied().unwrap_or(0) >= 1,
            "task {n}'s last step never ran: {done:?}"
        );
    }
    // The same deployment through a URL (what `sagactl` and the examples
    // take): it finds the new primary and the tasks on it.
    let hosts: Vec<String> = urls
        .iter()
        .map(|u| {
            u.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    let url = format!("redis+sentinel://{}/{SERVICE}", hosts.join(","));
    let via_url = RedisBackend::attach(&url, config()).await.unwrap();
    let task = saga_runtime::backend::TaskStore::load_task(&via_url, late)
        .await
        .unwrap()
        .expect("the task started after the failover, found through the URL");
    assert_eq!(task.status, TaskStatus::Completed);
    engine.shutdown().await;
}
