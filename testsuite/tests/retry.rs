//! Retry policies: exact schedules under tokio's paused clock, attempt
//! counts, permanent errors and the three `on_exhausted` actions.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use common::{status_changes, Journal};
use saga_runtime::prelude::*;
use saga_runtime::AuditAction;

/// Fails its first `fail_first` calls with a transient error.
struct Exponential {
    journal: Journal,
    fail_first: usize,
}

#[saga(name = "exponential")]
impl Exponential {
    #[saga_step(1)]
    #[retry_policy(max_retries = 5, backoff = exponential, base_delay_ms = 200, on_exhausted = fail)]
    async fn call(&self, n: u32, ctx: &StepContext) -> Result<u32, StepError> {
        let before = self.journal.record("call");
        assert_eq!(
            ctx.attempt() as usize,
            before + 1,
            "ctx.attempt() counts calls"
        );
        if before < self.fail_first {
            return Err(StepError::transient(format!("503 #{}", before + 1)));
        }
        Ok(n * 2)
    }
}

struct Linear {
    journal: Journal,
}

#[saga]
impl Linear {
    #[saga_step(1)]
    #[retry_policy(max_retries = 4, backoff = linear, base_delay_ms = 200, on_exhausted = fail)]
    async fn call(&self, _n: u32) -> Result<u32, StepError> {
        self.journal.record("call");
        Err(StepError::transient("down"))
    }
}

struct ConstantZero {
    journal: Journal,
}

#[saga]
impl ConstantZero {
    #[saga_step(1)]
    #[retry_policy(max_retries = 1, backoff = constant, base_delay_ms = 0, on_exhausted = fail)]
    async fn call(&self, _n: u32) -> Result<u32, StepError> {
        self.journal.record("call");
        Err(StepError::transient("declined?"))
    }
}

struct Capped {
    journal: Journal,
}

#[saga]
impl Capped {
    #[saga_step(1)]
    #[retry_policy(max_retries = 5, backoff = exponential, base_delay_ms = 100, max_delay_ms = 300, on_exhausted = fail)]
    async fn call(&self, _n: u32) -> Result<u32, StepError> {
        self.journal.record("call");
        Err(StepError::transient("down"))
    }
}

#[tokio::test(start_paused = true)]
async fn exponential_schedule_is_200_400_800_1600_3200_ms_and_counts_six_calls() {
    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(Exponential {
            journal: journal.clone(),
            fail_first: usize::MAX,
        })
        .build()
        .await
        .unwrap();
    let id = engine.start::<Exponential>(1).await.unwrap();
    let task = engine.wait(id).await.unwrap();

    assert_eq!(journal.gaps_ms("call"), [200, 400, 800, 1600, 3200]);
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(
        task.steps[0].attempt_count, 6,
        "max_retries = 5 means six calls"
    );
    assert_eq!(task.steps[0].error.as_deref(), Some("503 #6"));
    let delays: Vec<_> = task
        .audit_log
        .iter()
        .filter_map(|e| match e.action {
            AuditAction::AttemptFailed { retry_in_ms, .. } => Some(retry_in_ms),
            _ => None,
        })
        .collect();
    assert_eq!(
        delays,
        [
            Some(200),
            Some(400),
            Some(800),
            Some(1600),
            Some(3200),
            None
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn linear_schedule_is_200_400_600_800_ms() {
    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(Linear {
            journal: journal.clone(),
        })
        .build()
        .await
        .unwrap();
    let task = engine
        .wait(engine.start::<Linear>(1).await.unwrap())
        .await
        .unwrap();
    assert_eq!(journal.gaps_ms("call"), [200, 400, 600, 800]);
    assert_eq!(task.steps[0].attempt_count, 5);
}

#[tokio::test(start_paused = true)]
async fn constant_zero_retries_at_once_and_max_delay_caps_the_schedule() {
    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(ConstantZero {
            journal: journal.clone(),
        })
        .saga(Capped {
            journal: Journal::default(),
        })
        .build()
        .await
        .unwrap();
    let task = engine
        .wait(engine.start::<ConstantZero>(1).await.unwrap())
        .await
        .unwrap();
    assert_eq!(journal.gaps_ms("call"), [0]);
    assert_eq!(task.steps[0].attempt_count, 2);

    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(Capped {
            journal: journal.clone(),
        })
        .build()
        .await
        .unwrap();
    engine
        .wait(engine.start::<Capped>(1).await.unwrap())
        .await
        .unwrap();
    assert_eq!(journal.gaps_ms("call"), [100, 200, 300, 300, 300]);
}

#[tokio::test(start_paused = true)]
async fn a_step_that_recovers_completes_with_its_attempts_recorded() {
    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(Exponential {
            journal: journal.clone(),
            fail_first: 2,
        })
        .build()
        .await
        .unwrap();
    let task = engine
        .wait(engine.start::<Exponential>(21).await.unwrap())
        .await
        .unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.output_as::<u32>().unwrap().unwrap(), 42);
    assert_eq!(journal.gaps_ms("call"), [200, 400]);
    assert_eq!(task.steps[0].attempt_count, 3);
    assert_eq!(task.steps[0].status, StepStatus::Completed);
    assert_eq!(
        status_changes(&task),
        [
            (TaskStatus::Pending, TaskStatus::Running),
            (TaskStatus::Running, TaskStatus::Completed)
        ]
    );
}

/// Two steps; step 2's behaviour is switchable; step 1 has a compensation.
struct Checkout {
    journal: Journal,
    permanent: bool,
    healthy: Arc<AtomicBool>,
}

#[saga]
impl Checkout {
    #[saga_step(1)]
    async fn reserve(&self, n: u32) -> Result<u32, StepError> {
        self.journal.record("reserve");
        Ok(n)
    }

    #[compensate(reserve)]
    async fn release(&self, _n: u32) -> Result<(), StepError> {
        self.journal.record("release");
        Ok(())
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 50)]
    async fn charge(&self, n: u32) -> Result<u32, StepError> {
        self.journal.record("charge");
        if self.healthy.load(Ordering::SeqCst) {
            Ok(n)
        } else if self.permanent {
            Err(StepError::permanent("card declined"))
        } else {
            Err(StepError::transient("gateway timeout"))
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_skips_the_remaining_retries_and_compensates() {
    let journal = Journal::default();
    let saga = Checkout {
        journal: journal.clone(),
        permanent: true,
        healthy: Arc::default(),
    };
    let engine = Engine::builder().saga(saga).build().await.unwrap();
    let task = engine
        .wait(engine.start::<Checkout>(1).await.unwrap())
        .await
        .unwrap();
    assert_eq!(journal.labels(), ["reserve", "charge", "release"]);
    assert_eq!(task.status, TaskStatus::Compensated);
    assert_eq!(task.steps[1].attempt_count, 1);
    assert_eq!(task.steps[1].status, StepStatus::Failed);
    assert!(task.audit_log.iter().any(|e| e.action
        == AuditAction::AttemptFailed {
            retry_in_ms: None,
            permanent: true
        }));
    assert_eq!(
        status_changes(&task),
        [
            (TaskStatus::Pending, TaskStatus::Running),
            (TaskStatus::Running, TaskStatus::Compensating),
            (TaskStatus::Compensating, TaskStatus::Compensated),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn on_exhausted_compensate_is_the_default() {
    let journal = Journal::default();
    let saga = Checkout {
        journal: journal.clone(),
        permanent: false,
        healthy: Arc::default(),
    };
    let engine = Engine::builder().saga(saga).build().await.unwrap();
    let task = engine
        .wait(engine.start::<Checkout>(1).await.unwrap())
        .await
        .unwrap();
    assert_eq!(task.status, TaskStatus::Compensated);
    assert_eq!(journal.count("charge"), 4);
    assert_eq!(journal.count("release"), 1);
    assert_eq!(task.steps[0].status, StepStatus::Compensated);
}

struct FailFast {
    journal: Journal,
}

#[saga]
impl FailFast {
    #[saga_step(1)]
    async fn reserve(&self, n: u32) -> Result<u32, StepError> {
        self.journal.record("reserve");
        Ok(n)
    }

    #[compensate(reserve)]
    async fn release(&self, _n: u32) -> Result<(), StepError> {
        self.journal.record("release");
        Ok(())
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 1, backoff = constant, base_delay_ms = 0, on_exhausted = fail)]
    async fn charge(&self, _n: u32) -> Result<u32, StepError> {
        self.journal.record("charge");
        Err(StepError::transient("gateway timeout"))
    }
}

#[tokio::test(start_paused = true)]
async fn on_exhausted_fail_marks_failed_without_compensating() {
    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(FailFast {
            journal: journal.clone(),
        })
        .build()
        .await
        .unwrap();
    let task = engine
        .wait(engine.start::<FailFast>(1).await.unwrap())
        .await
        .unwrap();
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(journal.labels(), ["reserve", "charge", "charge"]);
    assert_eq!(
        task.steps[0].status,
        StepStatus::Completed,
        "nothing compensated"
    );
    assert!(task.error.as_deref().unwrap().contains("gateway timeout"));
}

struct Parked {
    calls: Arc<AtomicUsize>,
    healthy: Arc<AtomicBool>,
}

#[saga]
impl Parked {
    #[saga_step(1)]
    #[retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 10, on_exhausted = dead_letter)]
    async fn export(&self, n: u32, ctx: &StepContext) -> Result<String, StepError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.healthy.load(Ordering::SeqCst) {
            Ok(format!("{n}@{}", ctx.attempt()))
        } else {
            Err(StepError::transient("ftp down"))
        }
    }
}

#[tokio::test(start_paused = true)]
async fn on_exhausted_dead_letter_parks_the_task_until_an_operator_requeues_it() {
    let calls = Arc::new(AtomicUsize::new(0));
    let healthy = Arc::new(AtomicBool::new(false));
    let engine = Engine::builder()
        .saga(Parked {
            calls: calls.clone(),
            healthy: healthy.clone(),
        })
        .build()
        .await
        .unwrap();
    let id = engine.start::<Parked>(7).await.unwrap();
    let task = engine.wait(id).await.unwrap();
    assert_eq!(task.status, TaskStatus::DeadLettered);
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    let letters = engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].task_id, Some(id));
    assert!(
        letters[0].reason.contains("step `export`") && letters[0].reason.contains("ftp down"),
        "{}",
        letters[0].reason
    );

    healthy.store(true, Ordering::SeqCst);
    engine.requeue(&letters[0].id).await.unwrap();
    let task = engine.wait(id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(
        task.output_as::<String>().unwrap().unwrap(),
        "7@4",
        "attempt numbers keep counting"
    );
    assert!(engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters
        .is_empty());
    assert!(task
        .audit_log
        .iter()
        .any(|e| e.action == AuditAction::Requeued));
    assert!(matches!(
        engine.requeue(&letters[0].id).await,
        Err(saga_runtime::Error::DeadLetterNotFound(_))
    ));
}
