//! The one-step saga the fault tests start by the hundred, and the waits
//! they check it with: written once, for every test binary and store.

use std::time::Duration;

use saga_runtime::prelude::*;

/// Doubles its input in one step.
pub struct Double;

#[saga(name = "double")]
impl Double {
    #[saga_step(1)]
    async fn double(&self, n: u32) -> Result<u32, StepError> {
        Ok(n * 2)
    }
}

/// Waits for a task with a deadline, so a stalled engine fails the test
/// instead of hanging it.
pub async fn finish(engine: &Engine, id: TaskId, within: Duration) -> TaskInstance {
    match tokio::time::timeout(within, engine.wait(id)).await {
        Ok(task) => task.unwrap(),
        Err(_) => panic!(
            "task {id} did not finish within {within:?}: {:#?}",
            engine.task(id).await
        ),
    }
}

/// Starts a `Double` task for each input; returns each input with its task.
pub async fn start_doubles(engine: &Engine, inputs: std::ops::Range<u32>) -> Vec<(u32, TaskId)> {
    let mut ids = Vec::new();
    for n in inputs {
        ids.push((n, engine.start::<Double>(n).await.unwrap()));
    }
    ids
}

/// Every task completed with its input doubled.
pub async fn all_doubled(engine: &Engine, ids: &[(u32, TaskId)], within: Duration) {
    for (n, id) in ids {
        let task = finish(engine, *id, within).await;
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
        assert_eq!(task.output_as::<u32>().unwrap().unwrap(), n * 2);
    }
}

/// [`all_doubled`], each in one attempt: no fault cost any task a retry.
pub async fn all_doubled_once(engine: &Engine, ids: &[(u32, TaskId)], within: Duration) {
    all_doubled(engine, ids, within).await;
    for (_, id) in ids {
        let task = engine.task(*id).await.unwrap().expect("finished");
        assert_eq!(task.steps[0].attempt_count, 1, "{task:#?}");
    }
}
