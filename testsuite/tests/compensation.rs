//! Compensation: exactly the completed steps, in reverse order, under the
//! compensation retry policy; a compensation that keeps failing ends in the
//! terminal `CompensationFailed` with an audit entry, and nothing loops.

mod common;

use std::time::Duration;

use common::{status_changes, Journal};
use saga_runtime::prelude::*;
use saga_runtime::AuditAction;

/// Four steps, each with a compensation; step `fail_at` always fails.
struct Pipeline {
    journal: Journal,
    fail_at: u32,
}

impl Pipeline {
    fn step(&self, n: u32, value: u32) -> Result<u32, StepError> {
        self.journal.record(format!("step{n}"));
        if n == self.fail_at {
            Err(StepError::permanent(format!("step {n} broke")))
        } else {
            Ok(value + 1)
        }
    }
}

#[saga]
impl Pipeline {
    #[saga_step(1)]
    async fn one(&self, v: u32) -> Result<u32, StepError> {
        self.step(1, v)
    }
    #[compensate(one)]
    async fn undo_one(&self, _v: u32) -> Result<(), StepError> {
        self.journal.record("undo1");
        Ok(())
    }
    #[saga_step(2)]
    async fn two(&self, v: u32) -> Result<u32, StepError> {
        self.step(2, v)
    }
    #[compensate(two)]
    async fn undo_two(&self, _v: u32) -> Result<(), StepError> {
        self.journal.record("undo2");
        Ok(())
    }
    #[saga_step(3)]
    async fn three(&self, v: u32) -> Result<u32, StepError> {
        self.step(3, v)
    }
    #[compensate(three)]
    async fn undo_three(&self, _v: u32) -> Result<(), StepError> {
        self.journal.record("undo3");
        Ok(())
    }
    #[saga_step(4)]
    async fn four(&self, v: u32) -> Result<u32, StepError> {
        self.step(4, v)
    }
    #[compensate(four)]
    async fn undo_four(&self, _v: u32) -> Result<(), StepError> {
        self.journal.record("undo4");
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn failure_at_each_position_compensates_exactly_the_completed_steps_in_reverse() {
    for fail_at in 1..=4u32 {
        let journal = Journal::default();
        let engine = Engine::builder()
            .saga(Pipeline {
                journal: journal.clone(),
                fail_at,
            })
            .build()
            .await
            .unwrap();
        let task = engine
            .wait(engine.start::<Pipeline>(0).await.unwrap())
            .await
            .unwrap();

        let mut expected: Vec<String> = (1..=fail_at).map(|n| format!("step{n}")).collect();
        expected.extend((1..fail_at).rev().map(|n| format!("undo{n}")));
        assert_eq!(journal.labels(), expected, "failing at step {fail_at}");
        assert_eq!(task.status, TaskStatus::Compensated);
        for (i, rec) in task.steps.iter().enumerate() {
            let n = i as u32 + 1;
            let want = match n.cmp(&fail_at) {
                std::cmp::Ordering::Less => StepStatus::Compensated,
                std::cmp::Ordering::Equal => StepStatus::Failed,
                std::cmp::Ordering::Greater => StepStatus::Pending,
            };
            assert_eq!(rec.status, want, "step {n} when failing at {fail_at}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn all_steps_completing_compensates_nothing() {
    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(Pipeline {
            journal: journal.clone(),
            fail_at: 0,
        })
        .build()
        .await
        .unwrap();
    let task = engine
        .wait(engine.start::<Pipeline>(0).await.unwrap())
        .await
        .unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.output_as::<u32>().unwrap().unwrap(), 4);
    assert_eq!(journal.labels(), ["step1", "step2", "step3", "step4"]);
}

/// Step 1's compensation always fails; it has its own retry policy.
struct Stuck {
    journal: Journal,
}

#[saga]
impl Stuck {
    #[saga_step(1)]
    #[retry_policy(max_retries = 5, backoff = exponential, base_delay_ms = 200)]
    #[compensation_retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 1000)]
    async fn upload(&self, key: String) -> Result<String, StepError> {
        self.journal.record("upload");
        Ok(key)
    }

    #[compensate(upload)]
    async fn delete_upload(&self, key: String, ctx: &StepContext) -> Result<(), StepError> {
        self.journal.record("delete");
        assert_eq!(ctx.step(), "delete_upload");
        Err(StepError::transient(format!("s3 timeout deleting {key}")))
    }

    #[saga_step(2)]
    async fn pay(&self, _key: String) -> Result<u32, StepError> {
        Err(StepError::permanent("card declined"))
    }
}

#[tokio::test(start_paused = true)]
async fn failed_compensation_retries_under_its_own_policy_then_escalates_once() {
    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(Stuck {
            journal: journal.clone(),
        })
        .build()
        .await
        .unwrap();
    let id = engine.start::<Stuck>("zips/1.zip".into()).await.unwrap();
    let task = engine.wait(id).await.unwrap();

    assert_eq!(task.status, TaskStatus::CompensationFailed);
    assert_eq!(
        journal.gaps_ms("delete"),
        [1000, 1000],
        "compensation policy, not the step's"
    );
    let rec = &task.steps[0];
    assert_eq!(rec.status, StepStatus::CompensationFailed);
    assert_eq!(rec.compensation_attempts, 3);
    assert_eq!(
        rec.compensation_error.as_deref(),
        Some("s3 timeout deleting zips/1.zip")
    );
    assert_eq!(rec.trace_id.as_deref(), Some(task.trace_id.as_str()));

    let entries: Vec<_> = task
        .audit_log
        .iter()
        .filter(|e| e.action == AuditAction::CompensationFailed)
        .collect();
    assert_eq!(entries.len(), 1);
    let entry = entries[0];
    assert_eq!(entry.step.as_deref(), Some("upload"));
    assert_eq!(
        entry.error.as_deref(),
        Some("s3 timeout deleting zips/1.zip")
    );
    assert_eq!(entry.trace_id.as_deref(), Some(task.trace_id.as_str()));
    let details: serde_json::Value =
        serde_json::from_str(entry.details.as_deref().unwrap()).unwrap();
    assert_eq!(details["step"], "upload");
    assert_eq!(details["attempt_count"], 1);
    assert_eq!(details["compensation_attempts"], 3);
    assert_eq!(details["trace_id"], task.trace_id.as_str());
    assert_eq!(
        status_changes(&task).last(),
        Some(&(TaskStatus::Compensating, TaskStatus::CompensationFailed))
    );

    // Terminal: nothing retries it, however long we wait.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(journal.count("delete"), 3);
    assert_eq!(engine.task(id).await.unwrap().unwrap(), task);
}

/// Without `#[compensation_retry_policy]`, the step's own policy applies.
struct Fallback {
    journal: Journal,
}

#[saga]
impl Fallback {
    #[saga_step(1)]
    #[retry_policy(max_retries = 1, backoff = linear, base_delay_ms = 300)]
    async fn reserve(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[compensate(reserve)]
    async fn release(&self, _n: u32) -> Result<(), StepError> {
        self.journal.record("release");
        Err(StepError::transient("still locked"))
    }

    #[saga_step(2)]
    async fn ship(&self, _n: u32) -> Result<u32, StepError> {
        Err(StepError::permanent("no stock"))
    }
}

#[tokio::test(start_paused = true)]
async fn compensation_falls_back_to_the_step_retry_policy() {
    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(Fallback {
            journal: journal.clone(),
        })
        .build()
        .await
        .unwrap();
    let task = engine
        .wait(engine.start::<Fallback>(1).await.unwrap())
        .await
        .unwrap();
    assert_eq!(task.status, TaskStatus::CompensationFailed);
    assert_eq!(journal.gaps_ms("release"), [300]);
}
