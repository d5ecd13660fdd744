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

// ---- `when_open = wait` in an outage longer than many breaks ----

/// A dependency down until `up` is set, and every call it got: the
/// task's number, and whether the dependency was up.
#[derive(Default)]
struct Dependency {
    up: AtomicBool,
    calls: std::sync::Mutex<Vec<(u32, bool)>>,
    /// The one task the dependency refuses even when up (`u32::MAX`: none).
    refuses: std::sync::atomic::AtomicU32,
    undone: AtomicUsize,
}

struct Booking {
    dep: Arc<Dependency>,
}

/// `reserve` always works and is undone by `release`; `notify` calls the
/// dependency behind a breaker that parks tasks: an exhausted `notify`
/// compensates, and the compensation shows up in `undone`.
#[saga(name = "booking")]
impl Booking {
    #[saga_step(1)]
    async fn reserve(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[compensate(reserve)]
    async fn release(&self, _n: u32) -> Result<(), StepError> {
        self.dep.undone.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 100)]
    #[circuit_breaker(failure_threshold = 3, duration_secs = 1, when_open = wait)]
    async fn notify(&self, n: u32) -> Result<u32, StepError> {
        let up = self.dep.up.load(Ordering::SeqCst);
        self.dep.calls.lock().unwrap().push((n, up));
        if up && self.dep.refuses.load(Ordering::SeqCst) != n {
            Ok(n)
        } else {
            Err(StepError::transient("connection refused"))
        }
    }
}

async fn booking_engine(dep: &Arc<Dependency>) -> Engine {
    Engine::builder()
        .saga(Booking { dep: dep.clone() })
        .workers(2)
        .worker_concurrency(4)
        .build()
        .await
        .unwrap()
}

/// 1 s breaks, `max_retries = 3`, a 20 s outage, 10 tasks: a failed
/// half-open probe costs its task nothing (it is recorded and the task is
/// parked again), so no task is compensated, all complete once the
/// dependency is back, and each spent at most the one attempt it made
/// before the breaker opened. Before, each probe spent a retry of the task
/// that made it, and the tasks that probed most were compensated.
#[tokio::test(start_paused = true)]
async fn a_waiting_breaker_compensates_nothing_in_an_outage_of_twenty_breaks() {
    let dep = Arc::new(Dependency {
        refuses: u32::MAX.into(),
        ..Dependency::default()
    });
    let engine = booking_engine(&dep).await;
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(engine.start::<Booking>(n).await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    dep.up.store(true, Ordering::SeqCst);
    let down = dep.calls.lock().unwrap().iter().filter(|c| !c.1).count();
    let (mut free_probes, mut counted) = (0, 0);
    for id in ids {
        let task = tokio::time::timeout(Duration::from_secs(10), engine.wait(id))
            .await
            .expect("every parked task finishes within a few breaks")
            .unwrap();
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
        let rec = &task.steps[1];
        assert!(
            rec.attempts_in_budget() <= 2,
            "the outage spent at most the attempt made before the breaker \
             opened (and the successful one): {task:#?}"
        );
        let free = task
            .audit_log
            .iter()
            .filter(|e| {
                e.details
                    .as_deref()
                    .is_some_and(|d| d.contains("probe failed"))
            })
            .count() as u32;
        assert_eq!(
            rec.attempts_in_budget(),
            rec.attempt_count - free,
            "only failed probes are not counted: {task:#?}"
        );
        free_probes += free as usize;
        counted += (rec.attempts_in_budget() - 1) as usize;
    }
    eprintln!("{down} calls while down: {counted} counted, {free_probes} failed probes");
    assert_eq!(dep.undone.load(Ordering::SeqCst), 0, "nothing was undone");
    assert_eq!(
        counted + free_probes,
        down,
        "each call while down is one or the other"
    );
    // The outage was probed all along, about one probe a break (a failed
    // prober waits a break and a half, so they overlap): not one call per
    // parked task per break.
    assert!((10..=20).contains(&free_probes), "{free_probes} probes");
}

/// A step that fails for one task only, while the breaker stays closed
/// (the other tasks' successes reset its count), still spends its retries
/// and is compensated: waiting is for outages, not for a bad input.
#[tokio::test(start_paused = true)]
async fn a_step_failing_for_one_task_only_still_exhausts_its_retries() {
    let dep = Arc::new(Dependency {
        refuses: 7.into(),
        ..Dependency::default()
    });
    dep.up.store(true, Ordering::SeqCst);
    let engine = booking_engine(&dep).await;
    let bad = engine.start::<Booking>(7).await.unwrap();
    let mut good = Vec::new();
    for n in 100..140 {
        good.push(engine.start::<Booking>(n).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let task = engine.wait(bad).await.unwrap();
    assert_eq!(task.status, TaskStatus::Compensated, "{task:#?}");
    assert_eq!(task.steps[1].attempt_count, 4, "{task:#?}");
    assert!(!task
        .audit_log
        .iter()
        .any(|e| e.action == AuditAction::CircuitOpen));
    assert_eq!(dep.undone.load(Ordering::SeqCst), 1);
    for id in good {
        assert_eq!(engine.wait(id).await.unwrap().status, TaskStatus::Completed);
    }
}
