//! Group commit on Redis: the task writes of concurrent tasks share script
//! calls, and sharing a call changes nothing about any one write.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::TestRedis;
use futures::future::join_all;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::{BackendError, TaskStore};
use saga_runtime::prelude::*;
use saga_runtime::testing::conformance::{message, task};

struct Three {
    done: Arc<AtomicU64>,
}

#[saga(name = "three")]
impl Three {
    #[saga_step(1)]
    async fn one(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(2)]
    async fn two(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(3)]
    async fn three(&self, n: u64) -> Result<u64, StepError> {
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(n)
    }
}

fn config() -> RedisConfig {
    RedisConfig {
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    }
}

/// 64 tasks in flight at once: their writes go in shared calls, so the
/// engine makes fewer script calls than it has writes to make (one by one
/// it made four per task, reads apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_tasks_share_write_calls() {
    let redis = TestRedis::start();
    let done = Arc::new(AtomicU64::new(0));
    let engine = |workers| {
        let (url, done) = (redis.url(), done.clone());
        async move {
            Engine::builder()
                .backend(RedisBackend::connect_with(&url, config()).await.unwrap())
                .saga(Three { done })
                .workers(workers)
                .worker_concurrency(16)
                .build()
                .await
                .unwrap()
        }
    };
    let client = engine(0).await;
    const TASKS: u64 = 400;
    let mut ids = Vec::new();
    for n in 0..TASKS {
        ids.push(client.start::<Three>(n).await.unwrap());
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut redis.conn())
        .unwrap();
    let pool = engine(4).await;
    tokio::time::timeout(Duration::from_secs(60), async {
        while done.load(Ordering::Relaxed) < TASKS {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("every task ends");
    for id in &ids {
        assert_eq!(
            client.wait(*id).await.unwrap().status,
            TaskStatus::Completed
        );
    }
    pool.shutdown().await;
    // Every script call, reads included, against the four writes per task
    // (start of step 1, two going-ons, the commit) the tasks needed.
    let calls = redis.command_calls("evalsha");
    let writes = TASKS * 4;
    assert!(
        calls < writes,
        "{calls} script calls for {writes} task writes and the reads: writes are not shared"
    );
}

/// Writes that share a call still answer one by one: a write that fails
/// (its audit list is damaged, so Redis raises in the middle of its
/// script) fails alone, and its neighbours' writes land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_write_does_not_fail_the_writes_it_shares_a_call_with() {
    let redis = TestRedis::start();
    let backend = RedisBackend::connect_with(&redis.url(), config())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    let mut leases = Vec::new();
    for _ in 0..16 {
        let mut t = task("s");
        backend.create_task(&t, &message(&t)).await.unwrap();
        let locked = backend
            .lock_and_load(t.id, Duration::from_secs(30))
            .await
            .unwrap()
            .expect("free");
        t = locked.task.expect("created");
        t.status = TaskStatus::Running;
        leases.push(locked.lease);
        tasks.push(t);
    }
    // The first eight load the scripts (a first call is refused with
    // NOSCRIPT and made again), so that the count below is of calls alone.
    let warm_up: Vec<_> = tasks
        .drain(8..)
        .zip(leases.drain(8..))
        .map(|(t, lease)| {
            let backend = &backend;
            async move {
                backend
                    .record_attempt(&t, TaskStatus::Pending, &lease, "one:1")
                    .await
            }
        })
        .collect();
    for result in join_all(warm_up).await {
        result.expect("a write on an intact task lands");
    }
    // The fourth task's audit list becomes a string: its next append
    // raises WRONGTYPE inside the script.
    let damaged = tasks[3].id;
    let audit_key = redis
        .keys()
        .into_iter()
        .find(|k| k.ends_with(&format!(":task:{damaged}")))
        .expect("the damaged task's record")
        .replace(":task:", ":audit:");
    let _: () = redis::cmd("SET")
        .arg(&audit_key)
        .arg("not a list")
        .query(&mut redis.conn())
        .unwrap();
    for t in &mut tasks {
        t.audit(saga_runtime::AuditEntry::new(
            saga_runtime::AuditAction::StepCompleted,
        ));
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut redis.conn())
        .unwrap();
    let results = join_all(
        tasks
            .iter()
            .zip(&leases)
            .map(|(t, lease)| backend.record_attempt(t, TaskStatus::Pending, lease, "one:1")),
    )
    .await;
    assert!(
        redis.command_calls("evalsha") < 8,
        "the writes were sent one by one: nothing was shared ({} calls)",
        redis.command_calls("evalsha")
    );
    for (t, result) in tasks.iter().zip(&results) {
        if t.id == damaged {
            assert!(
                matches!(result, Err(BackendError::Rejected(_))),
                "the damaged task's write: {result:?}"
            );
        } else {
            let (version, claimed) = result.as_ref().expect("an intact task's write lands");
            assert_eq!((*version, *claimed), (t.version + 1, true));
            let stored = backend.load_task(t.id).await.unwrap().unwrap();
            assert_eq!(stored.status, TaskStatus::Running);
            assert_eq!(stored.audit_log.len(), t.audit_log.len());
        }
    }
}
