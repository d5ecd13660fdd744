//! `#[circuit_breaker]`: opens after N failed calls, rejects without calling
//! the step (and without consuming retries), lets one probe through after the
//! break, closes on success and reopens on failure. Shared by every task of
//! the saga step.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use saga_runtime::prelude::*;
use saga_runtime::AuditAction;

struct Webhook {
    calls: Arc<AtomicUsize>,
    up: Arc<AtomicBool>,
}

#[saga(name = "webhook")]
impl Webhook {
    #[saga_step(1)]
    #[retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 100, on_exhausted = fail)]
    #[circuit_breaker(failure_threshold = 3, duration_secs = 30)]
    async fn notify(&self, n: u32) -> Result<u32, StepError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.up.load(Ordering::SeqCst) {
            Ok(n)
        } else {
            Err(StepError::transient("connection refused"))
        }
    }
}

#[tokio::test(start_paused = true)]
async fn breaker_opens_rejects_probes_once_closes_and_reopens() {
    let calls = Arc::new(AtomicUsize::new(0));
    let up = Arc::new(AtomicBool::new(false));
    let engine = Engine::builder()
        .saga(Webhook {
            calls: calls.clone(),
            up: up.clone(),
        })
        .workers(1)
        .build()
        .await
        .unwrap();
    let run = |n| {
        let engine = engine.clone();
        async move {
            engine
                .wait(engine.start::<Webhook>(n).await.unwrap())
                .await
                .unwrap()
        }
    };

    // Task 1: three failed calls (one call + two retries) reach the threshold.
    let t1 = run(1).await;
    assert_eq!(
        (t1.status, t1.steps[0].attempt_count),
        (TaskStatus::Failed, 3)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // Task 2, another task of the same step: rejected at once, step not called,
    // no retry consumed.
    let before = tokio::time::Instant::now();
    let t2 = run(2).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "open circuit must not call the step"
    );
    assert_eq!(t2.status, TaskStatus::Failed);
    assert_eq!(t2.steps[0].attempt_count, 0);
    assert!(t2
        .audit_log
        .iter()
        .any(|e| e.action == AuditAction::CircuitOpen));
    assert!(t2.steps[0]
        .error
        .as_deref()
        .unwrap()
        .contains("circuit breaker is open"));
    assert!(
        before.elapsed() < Duration::from_millis(100),
        "rejection waits for no backoff"
    );

    // After the break: one probe goes through; it fails, so the circuit
    // reopens at once (no second call, no retry).
    tokio::time::sleep(Duration::from_secs(30)).await;
    let t3 = run(3).await;
    assert_eq!(calls.load(Ordering::SeqCst), 4, "exactly one probe call");
    assert_eq!(t3.steps[0].attempt_count, 1);
    let t4 = run(4).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "reopened after the failed probe"
    );
    assert_eq!(t4.steps[0].attempt_count, 0);

    // After another break, a successful probe closes the circuit.
    up.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(run(5).await.status, TaskStatus::Completed);
    assert_eq!(run(6).await.status, TaskStatus::Completed);
    assert_eq!(calls.load(Ordering::SeqCst), 6);
}

#[tokio::test(start_paused = true)]
async fn a_success_resets_the_consecutive_failure_count() {
    let calls = Arc::new(AtomicUsize::new(0));
    let up = Arc::new(AtomicBool::new(true));
    let engine = Engine::builder()
        .saga(Webhook {
            calls: calls.clone(),
            up: up.clone(),
        })
        .workers(1)
        .build()
        .await
        .unwrap();
    // Two failures, then success on the last retry: the count resets.
    up.store(false, Ordering::SeqCst);
    let id = engine.start::<Webhook>(1).await.unwrap();
    common::eventually(|| calls.load(Ordering::SeqCst) == 2).await;
    up.store(true, Ordering::SeqCst);
    assert_eq!(engine.wait(id).await.unwrap().status, TaskStatus::Completed);
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // So the next task gets all three of its calls before the circuit opens
    // (without the reset, 2 + 1 failures would open it after its first call).
    up.store(false, Ordering::SeqCst);
    let task = engine
        .wait(engine.start::<Webhook>(2).await.unwrap())
        .await
        .unwrap();
    assert_eq!(task.steps[0].attempt_count, 3);
    assert_eq!(calls.load(Ordering::SeqCst), 6);
}
