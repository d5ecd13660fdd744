//! A message that aborts its worker process, against a real redis-server
//! and a worker process that dies each time: the messages in flight beside
//! it are cut short too, but once recovered each runs alone, so the culprit
//! crashes alone and is parked at the delivery cap while the innocent ones
//! lose nothing (no delivery toward their cap, no attempt of their retry
//! budget).

mod common;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use sagas::chaos::{Chaos, ChaosConfig};

/// A chaos-worker process, killed when dropped (a failed assertion must
/// not leave it running).
struct Worker(Child);

impl Worker {
    fn exited(&mut self) -> bool {
        self.0.try_wait().unwrap().is_some()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_worker(url: &str, envs: &[(&str, &str)]) -> Worker {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_chaos-worker"));
    cmd.env("REDIS_URL", url).env("RUST_LOG", "off");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    Worker(cmd.spawn().expect("spawn chaos-worker"))
}

/// An engine that starts and reads tasks, running no workers.
async fn client(redis: &TestRedis) -> Engine {
    let recorder = redis::Client::open(redis.url().as_str())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let chaos = ChaosConfig {
        max_work: Duration::ZERO,
        failure_rate: 0.0,
        record: false,
        poison: None,
    };
    let config = RedisConfig {
        visibility_timeout: Duration::from_millis(500),
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    };
    Engine::builder()
        .backend(
            RedisBackend::connect_with(&redis.url(), config)
                .await
                .unwrap(),
        )
        .saga(Chaos::new(recorder, "client", chaos))
        .workers(0)
        .build()
        .await
        .unwrap()
}

/// 40 good tasks and one whose step aborts the process, on a worker that
/// runs 8 messages at once: before recovered messages ran alone, each
/// crash cost the tasks in flight beside the culprit an attempt and a
/// delivery, and some ended `Compensated` or parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_costs_the_tasks_beside_it_nothing() {
    let redis = TestRedis::start();
    let url = redis.url();
    let client = client(&redis).await;
    let mut good = Vec::new();
    for n in 1..=20u64 {
        good.push(client.start::<Chaos>(n).await.unwrap());
    }
    let poison = client.start::<Chaos>(666).await.unwrap();
    for n in 21..=40u64 {
        good.push(client.start::<Chaos>(n).await.unwrap());
    }
    let envs = [
        ("WORKERS", "1"),
        ("CONCURRENCY", "8"),
        ("POISON", "666"),
        ("MAX_DELIVERIES", "4"),
        ("VISIBILITY_MS", "500"),
        ("MAX_WORK_MS", "300"),
        ("FAILURE_RATE", "0"),
        ("RECORD", "0"),
        ("HOUSEKEEPING_MS", "200"),
        ("IDLE_CONSUMER_MS", "1000"),
    ];
    let mut worker = spawn_worker(&url, &envs);
    let mut crashes = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let mut open = 0;
        for id in good.iter().chain([&poison]) {
            let task = client.task(*id).await.unwrap().unwrap();
            open += usize::from(!task.status.is_terminal());
        }
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} tasks still open after {crashes} crashes"
        );
        if worker.exited() {
            crashes += 1;
            worker = spawn_worker(&url, &envs);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(worker);
    let task = client.task(poison).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::DeadLettered, "{task:#?}");
    let reason = task.error.clone().unwrap_or_default();
    assert!(reason.contains("without completing"), "{reason}");
    assert!(
        crashes >= 4,
        "each delivery of the culprit crashed ({crashes})"
    );
    let mut charged = Vec::new();
    for id in &good {
        let task = client.task(*id).await.unwrap().unwrap();
        assert_eq!(task.status, TaskStatus::Completed, "innocent: {task:#?}");
        // No step failed: each counted exactly one attempt, whatever
        // crashes cut some short.
        for step in &task.steps {
            if step.attempt_count - step.retry_base != 1 {
                charged.push((task.id, step.name.clone(), step.attempt_count));
            }
        }
    }
    assert!(
        charged.is_empty(),
        "innocent tasks were charged attempts: {charged:?}"
    );
    let letters = client
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    assert_eq!(letters.len(), 1, "only the culprit: {letters:#?}");
    assert_eq!(letters[0].task_id, Some(poison));
}

/// The same for a process manager: one handler aborts the process on one
/// message among 20 good ones, each of which takes a while, so several are
/// in flight beside the culprit. Before recovered messages ran alone, a
/// good message was dead-lettered beside the poison one in about half the
/// runs (its deliveries spent by the culprit's crashes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_handler_costs_the_messages_beside_it_nothing() {
    use sagas::crashy::{Crashy, Job};
    let redis = TestRedis::start();
    let url = redis.url();
    let config = RedisConfig {
        visibility_timeout: Duration::from_millis(500),
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    };
    let client = Engine::builder()
        .backend(RedisBackend::connect_with(&url, config).await.unwrap())
        .process_manager(Crashy { poison: None })
        .workers(0)
        .build()
        .await
        .unwrap();
    let job = |n: u64| Job {
        id: format!("job-{n}"),
        n,
        work_ms: 300,
    };
    for n in 1..=10 {
        client.publish(job(n)).await.unwrap();
    }
    client.publish(job(666)).await.unwrap();
    for n in 11..=20 {
        client.publish(job(n)).await.unwrap();
    }
    let envs = [
        ("PROCESS", "1"),
        ("PM_POISON", "666"),
        ("WORKERS", "1"),
        ("CONCURRENCY", "8"),
        ("MAX_DELIVERIES", "4"),
        ("VISIBILITY_MS", "500"),
        ("RECORD", "0"),
        ("HOUSEKEEPING_MS", "200"),
        ("IDLE_CONSUMER_MS", "1000"),
    ];
    let mut worker = spawn_worker(&url, &envs);
    let mut crashes = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    let applied = loop {
        let letters = client
            .dead_letters(Default::default())
            .await
            .unwrap()
            .letters;
        let mut applied = Vec::new();
        for n in 1..=20u64 {
            let instance = client
                .process_instance::<Crashy>(&format!("job-{n}"))
                .await
                .unwrap();
            if instance.is_some_and(|i| i.state["applied"] == n) {
                applied.push(n);
            }
        }
        if !letters.is_empty() && applied.len() + letters.len() >= 21 {
            assert_eq!(letters.len(), 1, "only the culprit: {letters:#?}");
            assert!(letters[0].payload.contains("job-666"), "{letters:#?}");
            break applied;
        }
        assert!(
            Instant::now() < deadline,
            "{} applied, {} dead-lettered after {crashes} crashes",
            applied.len(),
            letters.len()
        );
        if worker.exited() {
            crashes += 1;
            worker = spawn_worker(&url, &envs);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    drop(worker);
    assert_eq!(applied.len(), 20, "every good message applied: {applied:?}");
    assert!(
        crashes >= 4,
        "each delivery of the culprit crashed ({crashes})"
    );
}
