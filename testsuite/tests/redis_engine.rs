//! The engine on Redis: a server restart mid-run, a long step keeping its
//! lease, cancellation across engines, and bad input dead-lettered.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::{QueueMessage, WorkItem};
use saga_runtime::prelude::*;
use sagas_tests::chaos::{check_task, Chaos, ChaosConfig};
use sagas_tests::double::Double;

async fn backend(redis: &TestRedis) -> RedisBackend {
    let config = RedisConfig {
        visibility_timeout: Duration::from_millis(800),
        block: Duration::from_millis(200),
        ..RedisConfig::default()
    };
    RedisBackend::connect_with(&redis.url(), config)
        .await
        .unwrap()
}

/// Polls until every task is terminal; tolerates Redis being down meanwhile.
async fn all_finished(
    engine: &Engine,
    saga: &str,
    count: usize,
    within: Duration,
) -> Vec<TaskInstance> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(tasks) = engine.tasks_of(saga).await {
            if tasks.len() == count && tasks.iter().all(|t| t.status.is_terminal()) {
                return tasks;
            }
        }
        assert!(
            Instant::now() < deadline,
            "tasks did not finish in {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_reconnect_after_a_redis_restart_and_every_task_finishes() {
    let mut redis = TestRedis::start();
    let mut recorder = redis::Client::open(redis.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let chaos = ChaosConfig {
        max_work: Duration::from_millis(30),
        failure_rate: 0.0,
        record: true,
        poison: None,
    };
    let engine = Engine::builder()
        .backend(backend(&redis).await)
        .saga(Chaos::new(recorder.clone(), "in-process", chaos))
        .lock_ttl(Duration::from_millis(1500))
        .workers(4)
        .build()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..60u64 {
        ids.push(engine.start::<Chaos>(n).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let done_before = engine
        .tasks_of("chaos")
        .await
        .unwrap()
        .iter()
        .filter(|t| t.status.is_terminal())
        .count();
    assert!(done_before < ids.len(), "restart must happen mid-run");
    redis.restart();

    let tasks = all_finished(&engine, "chaos", ids.len(), Duration::from_secs(60)).await;
    for task in &tasks {
        assert_eq!(task.status, TaskStatus::Completed);
        let executions = Chaos::executions(&mut recorder, task.id).await.unwrap();
        check_task(task, &executions).unwrap();
    }
}

struct Slow {
    calls: Arc<AtomicUsize>,
}

#[saga]
#[cancellable]
impl Slow {
    #[saga_step(1)]
    async fn crunch(&self, ms: u64, ctx: &StepContext) -> Result<u64, StepError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::select! {
            _ = ctx.cancelled() => Err(StepError::permanent("cancelled mid-crunch")),
            _ = tokio::time::sleep(Duration::from_millis(ms)) => Ok(ms),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_longer_than_the_lock_ttl_keeps_its_lease_and_runs_once() {
    let redis = TestRedis::start();
    let calls = Arc::new(AtomicUsize::new(0));
    // Two engines (as two processes would) compete for the same queue.
    let mut engines = Vec::new();
    for _ in 0..2 {
        engines.push(
            Engine::builder()
                .backend(backend(&redis).await)
                .saga(Slow {
                    calls: calls.clone(),
                })
                // A step three times as long as its lease. (A worker gives
                // a step up when it cannot renew the lease in time, so the
                // lease must leave the heartbeat room on a loaded machine.)
                .lock_ttl(Duration::from_secs(1))
                .workers(2)
                .build()
                .await
                .unwrap(),
        );
    }
    let id = engines[0].start::<Slow>(3000).await.unwrap();
    let task = engines[1].wait(id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the lease was extended; nobody else ran the step"
    );
    assert_eq!(task.steps[0].attempt_count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_requested_in_one_process_reaches_a_step_running_in_another() {
    let redis = TestRedis::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let worker = Engine::builder()
        .backend(backend(&redis).await)
        .saga(Slow {
            calls: calls.clone(),
        })
        .workers(1)
        .build()
        .await
        .unwrap();
    let client = Engine::builder()
        .backend(backend(&redis).await)
        .saga(Slow {
            calls: Arc::default(),
        })
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = client.start::<Slow>(60_000).await.unwrap();
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked = Instant::now();
    assert_eq!(
        client.cancel::<Slow>(id).await.unwrap(),
        CancelResult::Cancelled
    );
    let task = client.wait(id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Cancelled);
    assert_eq!(
        task.steps[0].error.as_deref(),
        Some("cancelled: cancelled mid-crunch")
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "cancellation arrived promptly"
    );
    drop(worker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_on_the_stream_is_dead_lettered_and_other_tasks_finish() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(backend(&redis).await)
        .saga(Double)
        // The message for an unknown saga goes back twice (1 s, 2 s) for a
        // worker that knows it, then is dead-lettered.
        .max_deliveries(2)
        .timeout_poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let backend = engine.backend().clone();

    // A malformed entry written straight onto the stream by another producer.
    let mut conn = redis.conn();
    let _: String = redis::cmd("XADD")
        .arg("saga:{saga:0}:queue")
        .arg("*")
        .arg("payload")
        .arg("{oops")
        .query(&mut conn)
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg("saga:{saga:0}:queue")
        .arg("*")
        .arg("unexpected")
        .arg("field")
        .query(&mut conn)
        .unwrap();
    let stray = TaskId::new();
    backend
        .enqueue(&[WorkItem::Saga(QueueMessage {
            task_id: stray,
            saga: "no-such-saga".into(),
            seq: 0,
        })])
        .await
        .unwrap();
    let bad = TaskInstance::new(
        "double",
        serde_json::json!("three"),
        [("double".to_owned(), 1)],
    );
    backend
        .create_task(
            &bad,
            &QueueMessage {
                task_id: bad.id,
                saga: "double".into(),
                seq: 0,
            },
        )
        .await
        .unwrap();
    let good: Vec<TaskId> =
        futures::future::try_join_all((0..10).map(|n| engine.start::<Double>(n)))
            .await
            .unwrap();

    for (n, id) in good.iter().enumerate() {
        assert_eq!(
            engine
                .wait(*id)
                .await
                .unwrap()
                .output_as::<u32>()
                .unwrap()
                .unwrap(),
            n as u32 * 2
        );
    }
    assert_eq!(
        engine.wait(bad.id).await.unwrap().status,
        TaskStatus::DeadLettered
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let letters = loop {
        let letters = engine
            .dead_letters(Default::default())
            .await
            .unwrap()
            .letters;
        if letters.len() == 4 || Instant::now() > deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let reasons: Vec<&str> = letters.iter().map(|l| l.reason.as_str()).collect();
    assert_eq!(letters.len(), 4, "{reasons:?}");
    assert_eq!(
        reasons
            .iter()
            .filter(|r| r.starts_with("malformed message"))
            .count(),
        2,
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("unknown saga `no-such-saga`")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("does not deserialize as `u32`")),
        "{reasons:?}"
    );
    assert!(
        letters.iter().any(|l| l.payload == "{oops"),
        "the raw payload is kept"
    );
}
