//! `#[cancellable]`: cancelling signals the running step's token, records the
//! cancellation and compensates the completed steps in reverse order.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{status_changes, Journal};
use saga_runtime::prelude::*;
use saga_runtime::AuditAction;
use tokio::sync::Notify;

struct Render {
    journal: Journal,
    rendering: Arc<Notify>,
    observed_cancel: Arc<AtomicBool>,
}

#[cancellable]
#[saga(name = "render")]
impl Render {
    #[saga_step(1)]
    async fn reserve(&self, job: String) -> Result<String, StepError> {
        self.journal.record("reserve");
        Ok(job)
    }

    #[compensate(reserve)]
    async fn release(&self, _job: String) -> Result<(), StepError> {
        self.journal.record("release");
        Ok(())
    }

    // An hour-long render: longer than the engine's default attempt
    // timeout (5 minutes), so it says how long it may take.
    #[saga_step(2, timeout_ms = 7_200_000)]
    async fn render(&self, job: String, ctx: &StepContext) -> Result<String, StepError> {
        self.journal.record("render");
        self.rendering.notify_one();
        tokio::select! {
            _ = ctx.cancelled() => {
                self.observed_cancel.store(true, Ordering::SeqCst);
                Err(StepError::permanent("render aborted"))
            }
            _ = tokio::time::sleep(Duration::from_secs(3600)) => Ok(format!("{job}.mp4")),
        }
    }

    #[compensate(render)]
    async fn discard(&self, _video: String) -> Result<(), StepError> {
        self.journal.record("discard");
        Ok(())
    }
}

async fn engine() -> (Engine, Journal, Arc<Notify>, Arc<AtomicBool>) {
    let journal = Journal::default();
    let rendering = Arc::new(Notify::new());
    let observed = Arc::new(AtomicBool::new(false));
    let engine = Engine::builder()
        .saga(Render {
            journal: journal.clone(),
            rendering: rendering.clone(),
            observed_cancel: observed.clone(),
        })
        .build()
        .await
        .unwrap();
    (engine, journal, rendering, observed)
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_running_step_signals_it_then_compensates_completed_steps() {
    let (engine, journal, rendering, observed) = engine().await;
    let id = engine.start::<Render>("intro".into()).await.unwrap();
    rendering.notified().await;

    assert_eq!(
        engine.cancel::<Render>(id).await.unwrap(),
        CancelResult::Cancelled
    );
    let task = engine.wait(id).await.unwrap();

    assert!(
        observed.load(Ordering::SeqCst),
        "the running step saw its token fire"
    );
    assert_eq!(task.status, TaskStatus::Cancelled);
    assert_eq!(
        journal.labels(),
        ["reserve", "render", "release"],
        "only the completed step is compensated"
    );
    assert_eq!(task.steps[0].status, StepStatus::Compensated);
    assert_eq!(task.steps[1].status, StepStatus::Failed);
    assert!(task.cancelled_at.is_some());
    assert!(task
        .audit_log
        .iter()
        .any(|e| e.action == AuditAction::CancellationRequested));
    assert_eq!(
        status_changes(&task),
        [
            (TaskStatus::Pending, TaskStatus::Running),
            (TaskStatus::Running, TaskStatus::Compensating),
            (TaskStatus::Compensating, TaskStatus::Cancelled),
        ]
    );
    assert_eq!(
        engine.cancel::<Render>(id).await.unwrap(),
        CancelResult::AlreadyCancelled
    );
}

#[tokio::test(start_paused = true)]
async fn a_second_cancel_while_compensating_is_already_cancelled() {
    let (engine, _journal, rendering, _) = engine().await;
    let id = engine.start::<Render>("intro".into()).await.unwrap();
    rendering.notified().await;
    assert_eq!(
        engine.cancel::<Render>(id).await.unwrap(),
        CancelResult::Cancelled
    );
    assert_eq!(
        engine.cancel::<Render>(id).await.unwrap(),
        CancelResult::AlreadyCancelled
    );
    engine.wait(id).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn completed_and_unknown_tasks_are_reported_as_such() {
    let (engine, _journal, rendering, _) = engine().await;
    assert_eq!(
        engine.cancel::<Render>(TaskId::new()).await.unwrap(),
        CancelResult::NotFound
    );

    // A render that finishes: let its hour pass.
    let id = engine.start::<Render>("short".into()).await.unwrap();
    rendering.notified().await;
    let task = engine.wait(id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.output_as::<String>().unwrap().unwrap(), "short.mp4");
    assert_eq!(
        engine.cancel::<Render>(id).await.unwrap(),
        CancelResult::AlreadyCompleted
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_before_any_step_runs_ends_cancelled_without_running_steps() {
    let journal = Journal::default();
    let rendering = Arc::new(Notify::new());
    let backend = saga_runtime::backend::memory::MemoryBackend::new();
    let client = Engine::builder()
        .backend(backend.clone())
        .saga(Render {
            journal: journal.clone(),
            rendering: rendering.clone(),
            observed_cancel: Arc::default(),
        })
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = client.start::<Render>("queued".into()).await.unwrap();
    assert_eq!(
        client.cancel::<Render>(id).await.unwrap(),
        CancelResult::Cancelled
    );

    let _workers = Engine::builder()
        .backend(backend)
        .saga(Render {
            journal: journal.clone(),
            rendering,
            observed_cancel: Arc::default(),
        })
        .build()
        .await
        .unwrap();
    let task = client.wait(id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Cancelled);
    assert!(journal.labels().is_empty(), "no step ran");
}

/// Its last step asks another engine (as another process would) to cancel
/// the task, then completes at once, before any heartbeat could relay it.
struct LastMinute {
    journal: Journal,
    client: Engine,
}

#[cancellable]
#[saga]
impl LastMinute {
    #[saga_step(1)]
    async fn book(&self, n: u32) -> Result<u32, StepError> {
        self.journal.record("book");
        Ok(n)
    }

    #[compensate(book)]
    async fn unbook(&self, _n: u32) -> Result<(), StepError> {
        self.journal.record("unbook");
        Ok(())
    }

    #[saga_step(2)]
    async fn confirm(&self, n: u32, ctx: &StepContext) -> Result<u32, StepError> {
        let result = self
            .client
            .cancel::<LastMinute>(ctx.task_id())
            .await
            .unwrap();
        assert_eq!(result, CancelResult::Cancelled);
        self.journal.record("confirm");
        Ok(n)
    }

    #[compensate(confirm)]
    async fn unconfirm(&self, _n: u32) -> Result<(), StepError> {
        self.journal.record("unconfirm");
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn an_accepted_cancellation_is_never_overtaken_by_completion() {
    let backend = saga_runtime::backend::memory::MemoryBackend::new();
    let client = Engine::builder()
        .backend(backend.clone())
        .workers(0)
        .build()
        .await
        .unwrap();
    let journal = Journal::default();
    let worker = Engine::builder()
        .backend(backend)
        .saga(LastMinute {
            journal: journal.clone(),
            client: client.clone(),
        })
        .workers(1)
        .build()
        .await
        .unwrap();
    let id = worker.start::<LastMinute>(1).await.unwrap();
    let task = worker.wait(id).await.unwrap();
    assert_eq!(
        task.status,
        TaskStatus::Cancelled,
        "the caller was told Cancelled"
    );
    assert_eq!(journal.labels(), ["book", "confirm", "unconfirm", "unbook"]);
    assert_eq!(
        client.cancel::<LastMinute>(id).await.unwrap(),
        CancelResult::AlreadyCancelled
    );
}

/// Its first step's compensation fails twice, then succeeds, under a
/// policy that waits a second between attempts; its second step waits to
/// be cancelled.
struct Undoable {
    undo_calls: Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
    waiting: Arc<Notify>,
}

#[cancellable]
#[saga(name = "undoable")]
impl Undoable {
    #[saga_step(1)]
    #[compensation_retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 1000)]
    async fn hold(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[compensate(hold)]
    async fn unhold(&self, _n: u32) -> Result<(), StepError> {
        let mut calls = self.undo_calls.lock().unwrap();
        calls.push(tokio::time::Instant::now());
        match calls.len() {
            1 | 2 => Err(StepError::transient("the provider is busy")),
            _ => Ok(()),
        }
    }

    #[saga_step(2)]
    async fn wait(&self, n: u32, ctx: &StepContext) -> Result<u32, StepError> {
        self.waiting.notify_one();
        ctx.cancelled().await;
        Err(StepError::permanent(format!("cancelled at {n}")))
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_tasks_compensation_retries_wait_out_their_backoff() {
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let waiting = Arc::new(Notify::new());
    let engine = Engine::builder()
        .saga(Undoable {
            undo_calls: calls.clone(),
            waiting: waiting.clone(),
        })
        .build()
        .await
        .unwrap();
    let id = engine.start::<Undoable>(1).await.unwrap();
    waiting.notified().await;
    assert_eq!(
        engine.cancel::<Undoable>(id).await.unwrap(),
        CancelResult::Cancelled
    );
    let task = engine.wait(id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Cancelled);
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls.len(),
        3,
        "two failed compensation attempts, then one that succeeded"
    );
    // The cancellation is applied at once; the compensation's own policy
    // (a second between attempts) still governs its retries.
    for pair in calls.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= Duration::from_secs(1) && gap < Duration::from_millis(1100),
            "compensation retried {gap:?} after the last attempt, not after its 1 s backoff"
        );
    }
    assert_eq!(task.steps[0].compensation_attempts, 3);
}
