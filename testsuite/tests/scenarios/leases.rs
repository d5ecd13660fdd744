//! A running step's lease, on every store, with two engines standing in
//! for two processes: the heartbeat keeps a step three times as long as
//! its lease from being taken over (it runs once), and is how a
//! cancellation requested through another engine reaches the step.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use saga_runtime::prelude::*;

use crate::common::stores::ScenarioStore;

/// The visibility timeout of every engine here (shorter than the lease).
const VISIBILITY: Duration = Duration::from_millis(800);

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

/// A step three times as long as its lease: the lease is extended while
/// it runs, so the other engine competing for the queue never runs it.
pub async fn a_step_longer_than_the_lock_ttl_keeps_its_lease_and_runs_once<S: ScenarioStore>() {
    let store = S::start();
    let calls = Arc::new(AtomicUsize::new(0));
    // Two engines (as two processes would) compete for the same queue.
    let mut engines = Vec::new();
    for _ in 0..2 {
        engines.push(
            Engine::builder()
                .backend_arc(store.backend(VISIBILITY).await)
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
    let started = Instant::now();
    let id = engines[0].start::<Slow>(3000).await.unwrap();
    let task = engines[1].wait(id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the lease was extended; nobody else ran the step"
    );
    assert_eq!(task.steps[0].attempt_count, 1);
    println!(
        "the 3 s step completed {:?} after its start",
        started.elapsed()
    );
}

/// A cancellation asked for through an engine that runs no workers
/// reaches the step running in the other one, within its heartbeat.
pub async fn cancellation_requested_in_one_process_reaches_a_step_running_in_another<
    S: ScenarioStore,
>() {
    let store = S::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let worker = Engine::builder()
        .backend_arc(store.backend(VISIBILITY).await)
        .saga(Slow {
            calls: calls.clone(),
        })
        .workers(1)
        .build()
        .await
        .unwrap();
    let client = Engine::builder()
        .backend_arc(store.backend(VISIBILITY).await)
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
    println!("the cancellation reached the step in {:?}", asked.elapsed());
    drop(worker);
}
