//! Versioned sagas: each task runs to its end on the definition it started
//! with, several versions run side by side, a task whose version no
//! worker has is parked and never run on another version's code, and
//! registration mistakes are refused when the engine is built.

mod common;

use std::time::Duration;

use common::redis_server::TestRedis;
use common::Journal;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use saga_runtime::Error;

/// Version 1 of `transfer`: debit, then credit. In the deployment being
/// replaced, `credit` waits until its worker shuts down, so tasks are
/// caught mid-flight by the upgrade.
struct TransferV1 {
    journal: Journal,
    hold_credit: bool,
}

#[saga(name = "transfer")]
impl TransferV1 {
    #[saga_step(1)]
    async fn debit(&self, cents: u64) -> Result<u64, StepError> {
        self.journal.record("v1 debit");
        Ok(cents)
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 5, backoff = constant, base_delay_ms = 10)]
    async fn credit(&self, cents: u64, ctx: &StepContext) -> Result<String, StepError> {
        if self.hold_credit {
            ctx.cancelled().await;
            return Err(StepError::transient("interrupted"));
        }
        self.journal.record("v1 credit");
        Ok(format!("v1 moved {cents}"))
    }
}

/// Version 2: a fraud check between debit and credit, a new output type.
struct TransferV2 {
    journal: Journal,
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Receipt {
    cents: u64,
    checked: bool,
}

#[saga(name = "transfer", version = 2)]
#[cancellable]
impl TransferV2 {
    #[saga_step(1)]
    async fn debit(&self, cents: u64) -> Result<u64, StepError> {
        self.journal.record("v2 debit");
        Ok(cents)
    }

    #[saga_step(2)]
    async fn check_fraud(&self, cents: u64) -> Result<u64, StepError> {
        self.journal.record("v2 check");
        Ok(cents)
    }

    #[saga_step(3)]
    async fn credit(&self, cents: u64) -> Result<Receipt, StepError> {
        self.journal.record("v2 credit");
        Ok(Receipt {
            cents,
            checked: true,
        })
    }
}

/// Version 2 again, under another type: a mistake the builder refuses.
struct TransferV2Again;

#[saga(name = "transfer", version = 2)]
impl TransferV2Again {
    #[saga_step(1)]
    async fn debit(&self, cents: u64) -> Result<u64, StepError> {
        Ok(cents)
    }
}

/// Version 3 with version 1's steps: a bump without a change.
struct TransferV3SameAsV1;

#[saga(name = "transfer", version = 3)]
impl TransferV3SameAsV1 {
    #[saga_step(1)]
    async fn debit(&self, cents: u64) -> Result<u64, StepError> {
        Ok(cents)
    }

    #[saga_step(2)]
    async fn credit(&self, cents: u64) -> Result<String, StepError> {
        Ok(cents.to_string())
    }
}

/// Version 1 edited in place (a step added) without a version bump.
struct TransferV1Edited;

#[saga(name = "transfer")]
impl TransferV1Edited {
    #[saga_step(1)]
    async fn debit(&self, cents: u64) -> Result<u64, StepError> {
        Ok(cents)
    }

    #[saga_step(2)]
    async fn audit(&self, cents: u64) -> Result<u64, StepError> {
        Ok(cents)
    }

    #[saga_step(3)]
    async fn credit(&self, cents: u64) -> Result<String, StepError> {
        Ok(cents.to_string())
    }
}

fn v1(journal: &Journal) -> TransferV1 {
    TransferV1 {
        journal: journal.clone(),
        hold_credit: false,
    }
}

fn v2(journal: &Journal) -> TransferV2 {
    TransferV2 {
        journal: journal.clone(),
    }
}

#[test]
fn the_version_and_fingerprint_are_generated() {
    let (one, two) = (TransferV1::definition(), TransferV2::definition());
    assert_eq!((one.name, one.version), ("transfer", 1));
    assert_eq!((two.name, two.version), ("transfer", 2));
    assert_ne!(one.fingerprint, two.fingerprint);
    // Only the steps count: another type with the same steps and types
    // has the same fingerprint, one with a step more does not.
    assert_eq!(
        TransferV3SameAsV1::definition().fingerprint,
        one.fingerprint
    );
    assert_ne!(TransferV1Edited::definition().fingerprint, one.fingerprint);
}

#[tokio::test]
async fn two_versions_run_side_by_side_each_task_on_its_own() {
    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(v1(&journal))
        .saga(v2(&journal))
        .build()
        .await
        .unwrap();
    let old = engine.start::<TransferV1>(5).await.unwrap();
    let new = engine.start::<TransferV2>(7).await.unwrap();

    assert_eq!(
        engine.wait_output::<TransferV1>(old).await.unwrap(),
        "v1 moved 5"
    );
    assert_eq!(
        engine.wait_output::<TransferV2>(new).await.unwrap(),
        Receipt {
            cents: 7,
            checked: true
        }
    );
    let (old, new) = (
        engine.task(old).await.unwrap().unwrap(),
        engine.task(new).await.unwrap().unwrap(),
    );
    assert_eq!(old.saga_version, 1);
    assert_eq!(new.saga_version, 2);
    assert_eq!(
        old.fingerprint.as_deref(),
        Some(TransferV1::definition().fingerprint_hex().as_str())
    );
    assert_eq!(journal.count("v1 debit") + journal.count("v1 credit"), 2);
    assert_eq!(journal.count("v2 check"), 1);
    // Listing and routes see one saga, at its newest version.
    let sagas = engine.sagas();
    assert_eq!(sagas.len(), 1);
    assert_eq!(sagas[0].version, 2);
}

/// A task answers to its own version: another version's typed output (which
/// might decode by accident) and another version's `#[cancellable]` do not
/// apply to it.
#[tokio::test]
async fn typed_results_and_cancellation_follow_the_tasks_version() {
    let journal = Journal::default();
    let engine = Engine::builder()
        .saga(TransferV1 {
            journal: journal.clone(),
            hold_credit: true,
        })
        .saga(v2(&journal))
        .build()
        .await
        .unwrap();
    let old = engine.start::<TransferV1>(5).await.unwrap();
    common::eventually(|| journal.count("v1 debit") == 1).await;

    match engine.output::<TransferV2>(old).await {
        Err(Error::WrongSaga {
            expected, actual, ..
        }) => assert_eq!(
            (expected.as_str(), actual.as_str()),
            ("transfer v2", "transfer")
        ),
        other => panic!("a v1 task read as v2: {other:?}"),
    }
    // v2 is `#[cancellable]`, v1 is not: the v1 task is not cancelled.
    let result = engine.cancel::<TransferV2>(old).await.unwrap();
    assert!(
        matches!(result, CancelResult::NotCancellable(_)),
        "{result:?}"
    );
    assert!(engine
        .task(old)
        .await
        .unwrap()
        .unwrap()
        .cancelled_at
        .is_none());
}

#[tokio::test]
async fn registration_mistakes_are_refused_at_build() {
    let journal = Journal::default();
    let twice = Engine::builder()
        .saga(v2(&journal))
        .saga(TransferV2Again)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(&twice, Error::DuplicateSaga(name) if name == "transfer"),
        "{twice}"
    );

    let same = Engine::builder()
        .saga(v1(&journal))
        .saga(TransferV3SameAsV1)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            same,
            Error::SameSagaDefinition {
                saga: "transfer",
                versions: (1, 3)
            }
        ),
        "{same}"
    );
    assert!(same.to_string().contains("have the same steps"), "{same}");

    let only_v1 = Engine::builder().saga(v1(&journal)).build().await.unwrap();
    let missing = only_v1.start::<TransferV2>(1).await.unwrap_err();
    assert!(
        matches!(
            &missing,
            Error::UnknownSagaVersion {
                saga: "transfer",
                version: 2,
                registered
            } if registered == &[1]
        ),
        "{missing}"
    );
}

async fn redis_backend(redis: &TestRedis) -> RedisBackend {
    let config = RedisConfig {
        visibility_timeout: Duration::from_secs(1),
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    };
    RedisBackend::connect_with(&redis.url(), config)
        .await
        .unwrap()
}

/// A running deployment is upgraded from v1 to v2 with tasks in flight:
/// the old deployment stops mid-step; the new one, running both versions,
/// finishes the old tasks on v1's code and runs new tasks on v2's; a later
/// deployment without v1 parks a v1 task instead of running v2's steps on
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_deployment_upgrades_from_v1_to_v2_with_tasks_in_flight() {
    let redis = TestRedis::start();
    let journal = Journal::default();

    // The old deployment: v1 only, its credit step stuck.
    let old_deployment = Engine::builder()
        .backend(redis_backend(&redis).await)
        .saga(TransferV1 {
            journal: journal.clone(),
            hold_credit: true,
        })
        .shutdown_grace(Duration::from_millis(100))
        // One worker per task: each goes on from debit into the stuck
        // credit with the task it holds.
        .workers(4)
        .build()
        .await
        .unwrap();
    let mut in_flight = Vec::new();
    for cents in 1..=4 {
        in_flight.push(old_deployment.start::<TransferV1>(cents).await.unwrap());
    }
    common::eventually(|| journal.count("v1 debit") == 4).await;
    old_deployment.shutdown().await;
    for id in &in_flight {
        let task = old_deployment.task(*id).await.unwrap().unwrap();
        assert!(!task.status.is_terminal(), "{task:#?}");
        assert_eq!(task.steps[0].status, StepStatus::Completed);
        assert_ne!(task.steps[1].status, StepStatus::Completed);
    }
    drop(old_deployment);

    // The new deployment: both versions; new tasks start on v2.
    let new_deployment = Engine::builder()
        .backend(redis_backend(&redis).await)
        .saga(v1(&journal))
        .saga(v2(&journal))
        .workers(2)
        .build()
        .await
        .unwrap();
    let mut fresh = Vec::new();
    for cents in 10..=12 {
        fresh.push(new_deployment.start::<TransferV2>(cents).await.unwrap());
    }
    for (id, cents) in in_flight.iter().zip(1..) {
        let output = tokio::time::timeout(
            Duration::from_secs(20),
            new_deployment.wait_output::<TransferV1>(*id),
        )
        .await
        .expect("an old task finishes")
        .unwrap();
        assert_eq!(output, format!("v1 moved {cents}"));
        let task = new_deployment.task(*id).await.unwrap().unwrap();
        assert_eq!(task.saga_version, 1);
        assert_eq!(task.steps.len(), 2, "never given v2's steps");
    }
    for (id, cents) in fresh.iter().zip(10..) {
        let receipt = tokio::time::timeout(
            Duration::from_secs(20),
            new_deployment.wait_output::<TransferV2>(*id),
        )
        .await
        .expect("a new task finishes")
        .unwrap();
        assert_eq!(receipt.cents, cents);
    }
    // v1's debit ran once per old task (its completion was recorded before
    // the upgrade) and v2's steps ran only for the new ones.
    assert_eq!(journal.count("v1 debit"), 4);
    assert_eq!(journal.count("v1 credit"), 4);
    assert_eq!(journal.count("v2 debit"), 3);
    assert_eq!(journal.count("v2 credit"), 3);

    // A v1 task left when v1 is retired is parked, not run on v2.
    let straggler = new_deployment.start::<TransferV1>(99).await.unwrap();
    new_deployment.shutdown().await;
    let v2_only = Engine::builder()
        .backend(redis_backend(&redis).await)
        .saga(v2(&journal))
        .max_deliveries(2)
        .workers(1)
        .build()
        .await
        .unwrap();
    let parked = tokio::time::timeout(Duration::from_secs(20), v2_only.wait(straggler))
        .await
        .expect("the straggler is parked")
        .unwrap();
    assert_eq!(parked.status, TaskStatus::DeadLettered, "{parked:#?}");
    let reason = parked.error.unwrap_or_default();
    assert!(
        reason.contains("runs on version 1 of saga `transfer`, which this worker does not have"),
        "{reason}"
    );
    assert_eq!(journal.count("v2 debit"), 3, "no v2 step ran on a v1 task");
    assert!(v2_only
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters
        .iter()
        .any(|l| l.task_id == Some(straggler)));
}

/// A definition edited in place (same version, other steps) does not run
/// the tasks started on the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definition_changed_without_a_version_bump_does_not_run_old_tasks() {
    let redis = TestRedis::start();
    let journal = Journal::default();
    let before = Engine::builder()
        .backend(redis_backend(&redis).await)
        .saga(v1(&journal))
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = before.start::<TransferV1>(3).await.unwrap();
    let after = Engine::builder()
        .backend(redis_backend(&redis).await)
        .saga(TransferV1Edited)
        .max_deliveries(2)
        .workers(1)
        .build()
        .await
        .unwrap();
    let task = tokio::time::timeout(Duration::from_secs(20), after.wait(id))
        .await
        .expect("parked")
        .unwrap();
    assert_eq!(task.status, TaskStatus::DeadLettered, "{task:#?}");
    assert!(task.steps.iter().all(|s| s.attempt_count == 0), "{task:#?}");
    let reason = task.error.unwrap_or_default();
    assert!(reason.contains("without a version bump"), "{reason}");
    assert_eq!(journal.count("v1 debit"), 0);
}
