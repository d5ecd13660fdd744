//! Operator actions: a task that ended needing an operator
//! (`CompensationFailed`, `DeadLettered`) is marked resolved by hand, with
//! who and why in its audit log, on the in-memory backend and on a real
//! redis-server.

mod common;

use std::time::Duration;

use common::ops_sagas::{Fine, Parked, Stuck};
use common::redis_server::TestRedis;
use saga_runtime::prelude::*;
use saga_runtime::{AuditAction, DeadLetterFilter, Error, Intervention, StepStatus, TaskFilter};

/// Like `Stuck`, but its warehouse comes back once `FIXED` is set: three
/// steps, so the retried compensation goes on to the step before it.
static FIXED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

struct Flaky {
    journal: common::Journal,
}

#[saga(name = "flaky")]
impl Flaky {
    #[saga_step(1)]
    async fn hold(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[compensate(hold)]
    async fn unhold(&self, _n: u32) -> Result<(), StepError> {
        self.journal.record("unhold");
        Ok(())
    }

    #[saga_step(2)]
    #[compensation_retry_policy(max_retries = 1, backoff = constant, base_delay_ms = 0)]
    async fn reserve(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[compensate(reserve)]
    async fn release(&self, _n: u32) -> Result<(), StepError> {
        self.journal.record("release");
        match FIXED.load(std::sync::atomic::Ordering::SeqCst) {
            true => Ok(()),
            false => Err(StepError::transient("the warehouse API is down")),
        }
    }

    #[saga_step(3)]
    async fn charge(&self, _n: u32) -> Result<u32, StepError> {
        Err(StepError::permanent("card declined"))
    }
}

async fn engine(redis: Option<&TestRedis>) -> Engine {
    let builder = Engine::builder()
        .saga(Stuck)
        .saga(Parked)
        .saga(Fine)
        .saga(Flaky {
            journal: JOURNAL.with(|j| j.clone()),
        });
    let builder = match redis {
        Some(redis) => builder.backend(redis.backend().await),
        None => builder,
    };
    builder.build().await.unwrap()
}

async fn a_compensation_failed_task_is_resolved_with_who_and_why(engine: Engine) {
    let id = engine.start::<Stuck>(1).await.unwrap();
    let ended = engine.wait(id).await.unwrap();
    assert_eq!(ended.status, TaskStatus::CompensationFailed);

    let resolved = engine
        .resolve(
            id,
            Intervention::new("ana@ops", "released the hold in the WMS"),
        )
        .await
        .unwrap();
    assert_eq!(resolved.status, TaskStatus::Resolved);
    let stored = engine.task(id).await.unwrap().unwrap();
    assert_eq!(stored.status, TaskStatus::Resolved);
    let entry = stored
        .audit_log
        .iter()
        .find(|e| e.action == AuditAction::Resolved)
        .expect("a Resolved audit entry");
    let details: serde_json::Value =
        serde_json::from_str(entry.details.as_deref().unwrap()).unwrap();
    assert_eq!(
        details,
        serde_json::json!({
            "by": "ana@ops",
            "note": "released the hold in the WMS",
            "was": "CompensationFailed",
        })
    );
    assert!(stored.audit_log.iter().any(|e| e.action
        == AuditAction::StatusChanged {
            from: TaskStatus::CompensationFailed,
            to: TaskStatus::Resolved,
        }));

    // Listed under its new status only.
    let listed = |status| {
        let engine = engine.clone();
        async move {
            engine
                .tasks(TaskFilter::new().saga("stuck").status(status))
                .await
                .unwrap()
                .tasks
                .into_iter()
                .map(|t| t.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(TaskStatus::Resolved).await, [id]);
    assert!(listed(TaskStatus::CompensationFailed).await.is_empty());

    // Once is enough.
    let again = engine.resolve(id, Intervention::new("bob", "again")).await;
    assert!(
        matches!(
            again,
            Err(Error::NotResolvable {
                status: TaskStatus::Resolved,
                ..
            })
        ),
        "{again:?}"
    );
}

async fn only_tasks_needing_an_operator_are_resolved(engine: Engine) {
    let id = engine.start::<Fine>(1).await.unwrap();
    assert_eq!(engine.wait(id).await.unwrap().status, TaskStatus::Completed);
    let err = engine
        .resolve(id, Intervention::new("ana", "nothing to do"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotResolvable {
                status: TaskStatus::Completed,
                ..
            }
        ),
        "{err}"
    );
    assert!(err
        .to_string()
        .contains("operator actions apply to tasks that ended"));
    let err = engine
        .retry_compensation(id, Intervention::new("ana", "?"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotResolvable {
                status: TaskStatus::Completed,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        engine.task(id).await.unwrap().unwrap().status,
        TaskStatus::Completed
    );

    let unknown = TaskId::new();
    let err = engine
        .resolve(unknown, Intervention::new("ana", "?"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::TaskNotFound(t) if t == unknown),
        "{err}"
    );
}

async fn a_resolved_dead_lettered_task_is_not_requeued(engine: Engine) {
    let id = engine.start::<Parked>(1).await.unwrap();
    assert_eq!(
        engine.wait(id).await.unwrap().status,
        TaskStatus::DeadLettered
    );
    let letter = engine
        .dead_letters(DeadLetterFilter::new())
        .await
        .unwrap()
        .letters
        .into_iter()
        .find(|l| l.task_id == Some(id))
        .expect("its dead letter");
    engine
        .resolve(id, Intervention::new("ana", "replayed the call by hand"))
        .await
        .unwrap();
    let err = engine.requeue(&letter.id).await.unwrap_err();
    assert!(matches!(err, Error::ResolvedTask(t) if t == id), "{err}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        engine.task(id).await.unwrap().unwrap().status,
        TaskStatus::Resolved
    );
}

thread_local! {
    static JOURNAL: common::Journal = common::Journal::default();
}

async fn a_failed_compensation_runs_again_once_fixed(engine: Engine) {
    FIXED.store(false, std::sync::atomic::Ordering::SeqCst);
    let id = engine.start::<Flaky>(1).await.unwrap();
    let ended = engine.wait(id).await.unwrap();
    assert_eq!(ended.status, TaskStatus::CompensationFailed);
    let failed_attempts = ended.steps[1].compensation_attempts;
    assert_eq!(failed_attempts, 2, "one try and one retry");
    assert_eq!(ended.steps[0].status, StepStatus::Completed, "not reached");

    FIXED.store(true, std::sync::atomic::Ordering::SeqCst);
    let retried = engine
        .retry_compensation(id, Intervention::new("ana@ops", "warehouse API is back"))
        .await
        .unwrap();
    assert_eq!(retried.status, TaskStatus::Compensating);
    let done = engine.wait(id).await.unwrap();
    assert_eq!(done.status, TaskStatus::Compensated);
    assert_eq!(done.steps[1].status, StepStatus::Compensated);
    assert_eq!(done.steps[1].compensation_attempts, failed_attempts + 1);
    assert_eq!(
        done.steps[0].status,
        StepStatus::Compensated,
        "then the step before"
    );
    let entry = done
        .audit_log
        .iter()
        .find(|e| e.action == AuditAction::CompensationRetried)
        .expect("who and why");
    assert!(entry.details.as_deref().unwrap().contains("ana@ops"));
}

#[tokio::test(start_paused = true)]
async fn in_memory() {
    a_failed_compensation_runs_again_once_fixed(engine(None).await).await;
    a_compensation_failed_task_is_resolved_with_who_and_why(engine(None).await).await;
    only_tasks_needing_an_operator_are_resolved(engine(None).await).await;
    a_resolved_dead_lettered_task_is_not_requeued(engine(None).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let redis = TestRedis::start();
    a_failed_compensation_runs_again_once_fixed(engine(Some(&redis)).await).await;
    a_compensation_failed_task_is_resolved_with_who_and_why(engine(Some(&redis)).await).await;
    only_tasks_needing_an_operator_are_resolved(engine(Some(&redis)).await).await;
    a_resolved_dead_lettered_task_is_not_requeued(engine(Some(&redis)).await).await;
}
