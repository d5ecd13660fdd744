//! Attempts that hang, retries that wait, and the keys a step hands to
//! the services it calls; timed exactly under tokio's paused clock.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Journal;
use saga_runtime::prelude::*;
use saga_runtime::AuditAction;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Its first call never returns (and ignores cancellation).
struct HangsOnce {
    journal: Journal,
    calls: Arc<AtomicUsize>,
}

#[saga(name = "hangs-once")]
impl HangsOnce {
    #[saga_step(1, timeout_ms = 1000)]
    #[retry_policy(max_retries = 1, backoff = constant, base_delay_ms = 500, on_exhausted = fail)]
    async fn call(&self, n: u32) -> Result<u32, StepError> {
        self.journal.record("call");
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            std::future::pending::<()>().await;
        }
        Ok(n)
    }
}

#[tokio::test(start_paused = true)]
async fn a_hung_attempt_times_out_gets_its_grace_and_is_retried_exactly_on_schedule() {
    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(HangsOnce {
            journal: journal.clone(),
            calls: Arc::default(),
        })
        .stop_grace(Duration::from_millis(200))
        .workers(1)
        .build()
        .await
        .unwrap();
    let id = engine.start::<HangsOnce>(7).await.unwrap();
    let task = tokio::time::timeout(Duration::from_secs(60), engine.wait(id))
        .await
        .expect("a hung step must not hang its task")
        .unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.steps[0].attempt_count, 2);
    // Timeout 1000 ms + grace 200 ms + backoff 500 ms.
    assert_eq!(journal.gaps_ms("call"), [1700]);
    let failure = task
        .audit_log
        .iter()
        .find(|e| matches!(e.action, AuditAction::AttemptFailed { .. }))
        .unwrap();
    assert_eq!(
        failure.action,
        AuditAction::AttemptFailed {
            retry_in_ms: Some(500),
            permanent: false
        }
    );
    assert_eq!(
        failure.error.as_deref(),
        Some("attempt timed out after 1s and was cancelled")
    );
}

/// Honours cancellation (and its timeout) through `ctx.cancelled()`.
struct Polite {
    journal: Journal,
}

#[saga(name = "polite")]
impl Polite {
    #[saga_step(1, timeout_ms = 300)]
    #[retry_policy(max_retries = 0, backoff = constant, base_delay_ms = 0, on_exhausted = fail)]
    async fn call(&self, n: u32, ctx: &StepContext) -> Result<u32, StepError> {
        tokio::select! {
            _ = ctx.cancelled() => {
                self.journal.record("asked to stop");
                Err(StepError::transient("stopped"))
            }
            _ = tokio::time::sleep(Duration::from_secs(10)) => Ok(n),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_attempt_sees_ctx_cancelled_and_its_failure_is_transient() {
    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(Polite {
            journal: journal.clone(),
        })
        .build()
        .await
        .unwrap();
    let started = Instant::now();
    let task = engine
        .wait(engine.start::<Polite>(1).await.unwrap())
        .await
        .unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(300));
    assert_eq!(journal.labels(), ["asked to stop"]);
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(
        task.steps[0].error.as_deref(),
        Some("attempt timed out after 300ms and was cancelled")
    );
}

/// A step that ignores cancellation entirely.
struct Stubborn {
    started: Arc<Notify>,
}

#[cancellable]
#[saga(name = "stubborn")]
impl Stubborn {
    #[saga_step(1)]
    async fn reserve(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[compensate(reserve)]
    async fn release(&self, _n: u32) -> Result<(), StepError> {
        Ok(())
    }

    #[saga_step(2, timeout_ms = 3_600_000)]
    async fn hang(&self, _n: u32) -> Result<u32, StepError> {
        self.started.notify_one();
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_hung_step_ends_the_task_within_the_grace() {
    let started = Arc::new(Notify::new());
    let engine = Engine::builder()
        .saga(Stubborn {
            started: started.clone(),
        })
        .stop_grace(Duration::from_millis(250))
        .build()
        .await
        .unwrap();
    let id = engine.start::<Stubborn>(1).await.unwrap();
    started.notified().await;
    let asked = Instant::now();
    assert_eq!(
        engine.cancel::<Stubborn>(id).await.unwrap(),
        CancelResult::Cancelled
    );
    let task = engine.wait(id).await.unwrap();
    assert_eq!(asked.elapsed(), Duration::from_millis(250));
    assert_eq!(task.status, TaskStatus::Cancelled);
    assert_eq!(task.steps_with(StepStatus::Compensated), ["reserve"]);
    assert!(
        task.steps[1]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("did not stop within 250ms")),
        "{:?}",
        task.steps[1].error
    );
}

/// Fails its first call; the retry waits 10 s.
struct SlowRetry {
    journal: Journal,
    calls: Arc<AtomicUsize>,
}

#[saga(name = "slow-retry")]
impl SlowRetry {
    #[saga_step(1)]
    #[retry_policy(max_retries = 1, backoff = constant, base_delay_ms = 10_000)]
    async fn call(&self, n: u32) -> Result<u32, StepError> {
        self.journal.record("slow");
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(StepError::transient("503"));
        }
        Ok(n)
    }
}

struct Quick {
    journal: Journal,
}

#[saga(name = "quick")]
impl Quick {
    #[saga_step(1)]
    async fn call(&self, n: u32) -> Result<u32, StepError> {
        self.journal.record("quick");
        Ok(n)
    }
}

#[tokio::test(start_paused = true)]
async fn a_backoff_is_a_scheduled_message_not_a_busy_worker_or_a_held_lock() {
    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(SlowRetry {
            journal: journal.clone(),
            calls: Arc::default(),
        })
        .saga(Quick {
            journal: journal.clone(),
        })
        .workers(1)
        .build()
        .await
        .unwrap();
    let t0 = Instant::now();
    let slow = engine.start::<SlowRetry>(1).await.unwrap();
    common::eventually(|| journal.count("slow") == 1).await;
    let quick = engine.start::<Quick>(2).await.unwrap();
    engine.wait(quick).await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "the only worker was free during the backoff ({:?})",
        t0.elapsed()
    );
    let waiting = engine.task(slow).await.unwrap().unwrap();
    assert_eq!(waiting.steps[0].status, StepStatus::Pending);
    assert!(waiting.steps[0].next_attempt_at.is_some());
    let locked = engine
        .backend()
        .lock_and_load(slow, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("nobody holds the task's lock during its backoff");
    engine.backend().unlock(&locked.lease).await.unwrap();

    let done = engine.wait(slow).await.unwrap();
    assert_eq!(done.status, TaskStatus::Completed);
    assert_eq!(journal.gaps_ms("slow"), [10_000]);
    assert!(done.steps[0].next_attempt_at.is_none());
}

/// Records the keys each attempt was given.
struct Payment {
    keys: Arc<Mutex<Vec<(String, String)>>>,
}

#[saga(name = "payment")]
impl Payment {
    #[saga_step(1)]
    #[retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 100)]
    async fn charge(&self, cents: u32, ctx: &StepContext) -> Result<u32, StepError> {
        let mut keys = self.keys.lock().unwrap();
        keys.push((ctx.idempotency_key(), ctx.attempt_key()));
        if keys.len() < 3 {
            // The charge went through, but the reply was lost.
            return Err(StepError::transient("timed out waiting for the provider"));
        }
        Ok(cents)
    }
}

#[tokio::test(start_paused = true)]
async fn the_idempotency_key_is_the_same_for_every_attempt_of_a_step() {
    let keys = Arc::new(Mutex::new(Vec::new()));
    let engine = Engine::builder()
        .saga(Payment { keys: keys.clone() })
        .build()
        .await
        .unwrap();
    let id = engine.start::<Payment>(1200).await.unwrap();
    engine.wait(id).await.unwrap();
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 3);
    let stable = format!("{id}:charge");
    assert!(
        keys.iter().all(|(key, _)| *key == stable),
        "a retried charge carries the same key: {keys:?}"
    );
    let attempts: Vec<&str> = keys.iter().map(|(_, a)| a.as_str()).collect();
    assert_eq!(
        attempts,
        [
            format!("{id}:charge:1"),
            format!("{id}:charge:2"),
            format!("{id}:charge:3")
        ]
    );
}
