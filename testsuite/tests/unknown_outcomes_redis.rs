//! A step whose outcome was lost is compensated too, against a private
//! redis-server: an `undo-worker` process takes the money in `charge` and
//! is SIGKILLed before the write that would record it; then the task is
//! cancelled, or `charge` fails for good in this process, and `refund`
//! (which takes `Outcome<Charge, Order>`) is called with
//! `Outcome::Unknown(order)` and the step's idempotency key, before the
//! completed `reserve` is released.

mod common;

#[path = "support/undo_pay.rs"]
mod undo_pay;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use undo_pay::{Order, UndoPay, CHARGED, LOG};

/// The lease and the visibility timeout of both processes.
const LEASE: Duration = Duration::from_millis(1000);

/// An `undo-worker` process, SIGKILLed when dropped (a failed assertion
/// must not leave it running).
struct Worker(Child);

impl Worker {
    fn spawn(redis: &TestRedis) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_undo-worker"))
            .env("REDIS_URL", redis.url())
            .env("LEASE_MS", LEASE.as_millis().to_string())
            .env("RUST_LOG", "off")
            .spawn()
            .expect("spawn undo-worker");
        Worker(child)
    }

    /// SIGKILL, and wait for the process to be gone.
    fn kill(&mut self) {
        self.0.kill().expect("SIGKILL undo-worker");
        self.0.wait().expect("reap undo-worker");
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// This process's engine on the test server: no workers until
/// `run_workers` (the task's first attempt is the worker process's).
async fn engine(redis: &TestRedis, decline: bool) -> Engine {
    let config = RedisConfig {
        visibility_timeout: LEASE,
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    };
    let recorder = redis::Client::open(redis.url().as_str())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    Engine::builder()
        .backend(
            RedisBackend::connect_with(&redis.url(), config)
                .await
                .unwrap(),
        )
        .saga(UndoPay {
            recorder,
            hang_after_charge: false,
            decline,
        })
        .lock_ttl(LEASE)
        .workers(0)
        .build()
        .await
        .unwrap()
}

fn list(redis: &TestRedis, key: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(&mut redis.conn())
        .unwrap()
}

/// Starts a task, lets the worker process take the money in `charge`,
/// and SIGKILLs it there: the attempt's start is recorded, its outcome
/// never is.
async fn charge_then_kill(redis: &TestRedis, engine: &Engine) -> TaskId {
    let id = engine
        .start::<UndoPay>(Order { id: 7, cents: 1200 })
        .await
        .unwrap();
    let mut worker = Worker::spawn(redis);
    let deadline = Instant::now() + Duration::from_secs(30);
    while list(redis, CHARGED).is_empty() {
        assert!(Instant::now() < deadline, "the worker never charged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.kill();
    let task = engine.task(id).await.unwrap().unwrap();
    let charge = task.step("charge").unwrap();
    assert_eq!(
        (charge.status, charge.attempt_count),
        (StepStatus::Running, 1),
        "killed inside the attempt, before its outcome was written"
    );
    id
}

/// Runs this process's workers until the task ends; returns it.
async fn run_to_the_end(engine: &Engine, id: TaskId) -> TaskInstance {
    let workers = tokio::spawn({
        let engine = engine.clone();
        async move { engine.run_workers(1).await }
    });
    let task = tokio::time::timeout(Duration::from_secs(60), engine.wait(id))
        .await
        .expect("the task did not end within 60 s")
        .unwrap();
    engine.shutdown().await;
    let _ = workers.await;
    task
}

fn books(id: TaskId) -> Vec<String> {
    vec![
        format!("charged 1200 under {id}:charge"),
        format!("refunded whatever {id}:charge took, for order 7 of 1200"),
        "released 7".to_owned(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_lost_with_a_killed_worker_is_refunded_by_its_key_when_the_task_is_cancelled() {
    let redis = TestRedis::start();
    let engine = engine(&redis, false).await;
    let id = charge_then_kill(&redis, &engine).await;
    assert_eq!(
        engine.cancel::<UndoPay>(id).await.unwrap(),
        CancelResult::Cancelled
    );
    let task = run_to_the_end(&engine, id).await;

    assert_eq!(task.status, TaskStatus::Cancelled, "{task:#?}");
    assert_eq!(list(&redis, LOG), books(id), "{task:#?}");
    let charge = task.step("charge").unwrap();
    assert_eq!(charge.status, StepStatus::Compensated);
    assert_eq!(charge.lost_outcomes, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_lost_with_a_killed_worker_is_refunded_by_its_key_when_its_retry_fails_for_good() {
    let redis = TestRedis::start();
    let engine = engine(&redis, true).await;
    let id = charge_then_kill(&redis, &engine).await;
    let task = run_to_the_end(&engine, id).await;

    assert_eq!(task.status, TaskStatus::Compensated, "{task:#?}");
    assert_eq!(list(&redis, LOG), books(id), "{task:#?}");
    let charge = task.step("charge").unwrap();
    assert_eq!(charge.status, StepStatus::Compensated);
    assert_eq!((charge.attempt_count, charge.lost_outcomes), (2, 1));
}
