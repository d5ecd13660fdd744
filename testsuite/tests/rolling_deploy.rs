//! A rolling deploy against a real redis-server: engines running different
//! sets of a saga's versions side by side. An engine handed a task of a
//! version it lacks hands the message back at once and uncounted while
//! another live engine runs that version, so no runnable task is parked
//! as poison; a task whose version no live engine runs is parked, after a
//! bounded wait, with a reason that says so.

mod common;

use std::time::Duration;

use common::redis_server::TestRedis;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;

/// Version 1 of `ship`: one step.
struct ShipV1;

#[saga(name = "ship")]
impl ShipV1 {
    #[saga_step(1)]
    async fn pack(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
}

/// Version 2: another step.
struct ShipV2;

#[saga(name = "ship", version = 2)]
impl ShipV2 {
    #[saga_step(1)]
    async fn pack(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }

    #[saga_step(2)]
    async fn label(&self, n: u64) -> Result<u64, StepError> {
        Ok(n + 1)
    }
}

async fn backend(redis: &TestRedis) -> RedisBackend {
    let config = RedisConfig {
        visibility_timeout: Duration::from_secs(2),
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    };
    RedisBackend::connect_with(&redis.url(), config)
        .await
        .unwrap()
}

/// 120 tasks of v1 and v2 beside an engine running both and one running
/// v2 only, at a delivery cap of 4: the v2-only engine is handed v1 tasks
/// about as often as the other one, and before its hand-backs were
/// uncounted, 13 to 18 of them were parked as poison ("delivered N times
/// without completing").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_deploy_parks_no_runnable_task() {
    let redis = TestRedis::start();
    let both = Engine::builder()
        .backend(backend(&redis).await)
        .saga(ShipV1)
        .saga(ShipV2)
        .max_deliveries(4)
        .workers(4)
        .build()
        .await
        .unwrap();
    let v2_only = Engine::builder()
        .backend(backend(&redis).await)
        .saga(ShipV2)
        .max_deliveries(4)
        .workers(4)
        .build()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..60u64 {
        ids.push((1, both.start::<ShipV1>(n).await.unwrap()));
        ids.push((2, v2_only.start::<ShipV2>(n).await.unwrap()));
    }
    let mut parked = Vec::new();
    for (version, id) in &ids {
        let task = tokio::time::timeout(Duration::from_secs(60), both.wait(*id))
            .await
            .expect("every task ends")
            .unwrap();
        assert_eq!(task.saga_version, *version);
        if task.status != TaskStatus::Completed {
            parked.push((task.status, task.error));
        }
    }
    assert!(
        parked.is_empty(),
        "{} of 120 not completed: {parked:#?}",
        parked.len()
    );
    assert!(both
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters
        .is_empty());
    both.shutdown().await;
    v2_only.shutdown().await;
}

/// A v1 task while no live engine runs v1 (the engine that started it runs
/// no workers): parked by the v2-only engine once its delivery cap is
/// spent, with a reason that says no live engine runs it, not a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_no_live_engine_runs_is_parked_with_a_true_reason() {
    let redis = TestRedis::start();
    let starter = Engine::builder()
        .backend(backend(&redis).await)
        .saga(ShipV1)
        .saga(ShipV2)
        .workers(0)
        .build()
        .await
        .unwrap();
    let v2_only = Engine::builder()
        .backend(backend(&redis).await)
        .saga(ShipV2)
        .max_deliveries(2)
        .workers(1)
        .build()
        .await
        .unwrap();
    let id = starter.start::<ShipV1>(7).await.unwrap();
    // While it waits, what reads as plain Pending says why.
    let waiting = starter.task(id).await.unwrap().expect("the task");
    let why = starter.stalled(&waiting).await.unwrap();
    assert!(
        why.as_deref().is_some_and(
            |w| w.contains("no live engine announces that it runs saga `ship` version 1")
        ),
        "{why:?}"
    );
    // Version 2 is run by a live engine (once it has announced it).
    let mut of_v2 = waiting.clone();
    of_v2.saga_version = 2;
    of_v2.fingerprint = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while starter.stalled(&of_v2).await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "v2 never announced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let task = tokio::time::timeout(Duration::from_secs(30), v2_only.wait(id))
        .await
        .expect("parked within the bounded wait (1 s + 2 s of hand-backs)")
        .unwrap();
    assert_eq!(task.status, TaskStatus::DeadLettered, "{task:#?}");
    assert_eq!(
        starter.stalled(&task).await.unwrap(),
        None,
        "parked: it waits for an operator, said by its status"
    );
    let reason = task.error.unwrap_or_default();
    assert!(
        reason.contains("runs on version 1 of saga `ship`, which this worker does not have"),
        "{reason}"
    );
    assert!(
        reason.contains("no live engine announces that it runs it"),
        "{reason}"
    );
    assert!(!reason.contains("without completing"), "{reason}");
    assert!(
        task.steps.iter().all(|s| s.attempt_count == 0),
        "{:#?}",
        task.steps
    );
    v2_only.shutdown().await;
}
