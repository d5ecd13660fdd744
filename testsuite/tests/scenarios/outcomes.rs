//! A step whose outcome was lost is compensated too, on every store: an
//! `undo-worker` process on the store takes the money in `charge` and is
//! SIGKILLed before the write that would record it; then the task is
//! cancelled, or `charge` fails for good in this process, and `refund`
//! (which takes `Outcome<Charge, Order>`) is called with
//! `Outcome::Unknown(order)` and the step's idempotency key, before the
//! completed `reserve` is released.
//!
//! What the bodies did (the payment provider's books) is pushed onto a
//! Redis of its own, out of the store's way.

#[path = "../support/undo_pay.rs"]
mod undo_pay;

use std::process::Command;
use std::time::{Duration, Instant};

use saga_runtime::prelude::*;
use undo_pay::{Order, UndoPay, CHARGED, LOG};

use super::rig::{Rig, Worker};
use crate::common::stores::ScenarioStore;

/// The lease and the visibility timeout of both processes.
const LEASE: Duration = Duration::from_millis(1000);

/// An `undo-worker` process on the rig's store, recording on its Redis;
/// SIGKILLed when dropped (a failed assertion must not leave it running).
fn spawn_worker<S: ScenarioStore>(rig: &Rig<S>) -> Worker {
    let child = Command::new(env!("CARGO_BIN_EXE_undo-worker"))
        .env("BACKEND_URL", rig.store.url())
        .env("RECORD_URL", rig.record.url())
        .env("LEASE_MS", LEASE.as_millis().to_string())
        .env("POLL_MS", "50")
        .env("RUST_LOG", "off")
        .spawn()
        .expect("spawn undo-worker");
    Worker(child)
}

/// SIGKILLs the worker, and waits for the process to be gone.
fn kill(worker: &mut Worker) {
    worker.0.kill().expect("SIGKILL undo-worker");
    worker.0.wait().expect("reap undo-worker");
}

/// This process's engine on the rig's store: no workers until
/// `run_workers` (the task's first attempt is the worker process's).
async fn engine<S: ScenarioStore>(rig: &Rig<S>, decline: bool) -> Engine {
    Engine::builder()
        .backend_arc(rig.store.backend(LEASE).await)
        .saga(UndoPay {
            recorder: rig.recorder().await,
            hang_after_charge: false,
            decline,
        })
        .lock_ttl(LEASE)
        .workers(0)
        .build()
        .await
        .unwrap()
}

fn list<S: ScenarioStore>(rig: &Rig<S>, key: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(&mut rig.record.conn())
        .unwrap()
}

/// Starts a task, lets the worker process take the money in `charge`,
/// and SIGKILLs it there: the attempt's start is recorded, its outcome
/// never is.
async fn charge_then_kill<S: ScenarioStore>(rig: &Rig<S>, engine: &Engine) -> TaskId {
    let id = engine
        .start::<UndoPay>(Order { id: 7, cents: 1200 })
        .await
        .unwrap();
    let mut worker = spawn_worker(rig);
    let deadline = Instant::now() + Duration::from_secs(30);
    while list(rig, CHARGED).is_empty() {
        assert!(Instant::now() < deadline, "the worker never charged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kill(&mut worker);
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
    let started = Instant::now();
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
    println!(
        "the task ended {:?} after this process's workers started",
        started.elapsed()
    );
    task
}

fn books(id: TaskId) -> Vec<String> {
    vec![
        format!("charged 1200 under {id}:charge"),
        format!("refunded whatever {id}:charge took, for order 7 of 1200"),
        "released 7".to_owned(),
    ]
}

/// The worker dies with the charge taken; the task is cancelled: the
/// charge is refunded by its key, then the reservation released.
pub async fn a_charge_lost_with_a_killed_worker_is_refunded_by_its_key_when_the_task_is_cancelled<
    S: ScenarioStore,
>() {
    let rig = Rig::<S>::start();
    let engine = engine(&rig, false).await;
    let id = charge_then_kill(&rig, &engine).await;
    assert_eq!(
        engine.cancel::<UndoPay>(id).await.unwrap(),
        CancelResult::Cancelled
    );
    let task = run_to_the_end(&engine, id).await;

    assert_eq!(task.status, TaskStatus::Cancelled, "{task:#?}");
    assert_eq!(list(&rig, LOG), books(id), "{task:#?}");
    let charge = task.step("charge").unwrap();
    assert_eq!(charge.status, StepStatus::Compensated);
    assert_eq!(charge.lost_outcomes, 1);
}

/// The worker dies with the charge taken; its retry in this process is
/// declined for good: the lost charge is refunded by its key all the same.
pub async fn a_charge_lost_with_a_killed_worker_is_refunded_by_its_key_when_its_retry_fails_for_good<
    S: ScenarioStore,
>() {
    let rig = Rig::<S>::start();
    let engine = engine(&rig, true).await;
    let id = charge_then_kill(&rig, &engine).await;
    let task = run_to_the_end(&engine, id).await;

    assert_eq!(task.status, TaskStatus::Compensated, "{task:#?}");
    assert_eq!(list(&rig, LOG), books(id), "{task:#?}");
    let charge = task.step("charge").unwrap();
    assert_eq!(charge.status, StepStatus::Compensated);
    assert_eq!((charge.attempt_count, charge.lost_outcomes), (2, 1));
}
