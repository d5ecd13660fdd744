//! Reconciliation: finding external resources that no live task references.
//!
//! A step can create a resource (an uploaded object, a reserved seat) and the
//! worker can die before the step's completion is recorded; a compensation can
//! fail and leave one behind. Over time such orphans accumulate. `#[saga]`
//! generates, per saga, a `{Saga}Reconciliation` trait (Generation Gap): the
//! user implements how to list resources, which keys a step output references
//! and what to do with orphans; the provided methods run the scan.
//!
//! A resource is *referenced* when the recorded output of a completed step of a
//! live task names it. Live: `Pending`, `Running`, `Completed`, `Compensating`
//! and `DeadLettered` (an operator may requeue it). Outputs of tasks that ended
//! `Compensated`, `Cancelled`, `Failed` or `CompensationFailed`, and of steps
//! that were compensated, reference nothing.
//!
//! A step that has created a resource but not yet recorded its output makes
//! that resource look orphaned for a moment: `handle_orphans` should spare
//! young resources (compare their age with the longest step duration).

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::engine::Engine;
use crate::error::BoxError;
use crate::model::task::{StepStatus, TaskStatus};

/// The default interval between two scans: six hours.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(6 * 60 * 60);

/// What one scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Resources listed.
    pub resources: usize,
    /// Tasks of the saga considered live.
    pub live_tasks: usize,
    /// Distinct keys referenced by live tasks' step outputs.
    pub referenced_keys: usize,
    /// Resources handed to `handle_orphans`.
    pub orphans: usize,
}

/// A failed scan. `?` converts any error into it.
pub struct ReconcileError(BoxError);

impl ReconcileError {
    /// Wraps any error (or message).
    pub fn new(error: impl Into<BoxError>) -> Self {
        ReconcileError(error.into())
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for ReconcileError {
    fn from(error: E) -> Self {
        ReconcileError(Box::new(error))
    }
}

impl fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for ReconcileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

fn is_live(status: TaskStatus) -> bool {
    matches!(
        status,
        TaskStatus::Pending
            | TaskStatus::Running
            | TaskStatus::Completed
            | TaskStatus::Compensating
            | TaskStatus::DeadLettered
    )
}

/// Splits `resources` into orphans, using the step outputs of the live tasks
/// of `saga`. `referenced` maps one step output (step number, JSON) to the keys
/// it references; the generated trait decodes the JSON into the typed
/// `{Saga}StepOutput` enum there.
///
/// The enum is `version`'s: a live task of another version of the saga
/// (during an upgrade) has outputs it cannot read, or would misread, and a
/// resource only that task uses would look orphaned. The scan then fails
/// and deletes nothing until those tasks have ended.
pub async fn find_orphans<R, K>(
    engine: &Engine,
    saga: &str,
    version: u32,
    resources: Vec<R>,
    key_of: impl Fn(&R) -> K,
    mut referenced: impl FnMut(u32, Value) -> Result<Vec<K>, ReconcileError>,
) -> Result<(Vec<R>, ReconcileReport), ReconcileError>
where
    K: Eq + Hash,
{
    let tasks = engine.tasks_of(saga).await.map_err(ReconcileError::new)?;
    let mut report = ReconcileReport {
        resources: resources.len(),
        ..ReconcileReport::default()
    };
    let mut keys = HashSet::new();
    for task in tasks.into_iter().filter(|t| is_live(t.status)) {
        if task.saga_version != version {
            return Err(ReconcileError::new(format!(
                "task {} of saga `{saga}` runs on version {}, and this reconciliation reads \
                 version {version}'s step outputs: nothing is deleted while tasks of another \
                 version are live",
                task.id, task.saga_version
            )));
        }
        report.live_tasks += 1;
        for step in task.steps {
            if step.status != StepStatus::Completed {
                continue;
            }
            if let Some(output) = step.output {
                keys.extend(referenced(step.order, output)?);
            }
        }
    }
    report.referenced_keys = keys.len();
    let orphans: Vec<R> = resources
        .into_iter()
        .filter(|r| !keys.contains(&key_of(r)))
        .collect();
    report.orphans = orphans.len();
    Ok((orphans, report))
}

/// Runs `cycle` every `interval` until `shutdown` fires. A failing cycle is
/// logged and the next one runs as scheduled: one bad scan (a listing that
/// timed out) must not stop reconciliation for good.
pub async fn run_every<F, Fut>(
    interval: Duration,
    shutdown: CancellationToken,
    saga: &str,
    mut cycle: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<ReconcileReport, ReconcileError>>,
{
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            result = cycle() => match result {
                Ok(report) if report.orphans > 0 => tracing::warn!(saga, ?report, "reconciliation found orphaned resources"),
                Ok(report) => tracing::debug!(saga, ?report, "reconciliation found no orphans"),
                Err(error) => tracing::error!(saga, %error, "reconciliation cycle failed; the next one runs as scheduled"),
            },
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// Decoding a step output for `referenced_keys` failed (the stored JSON does
/// not match the step's output type any more).
#[doc(hidden)]
pub fn decode_error(saga: &str, order: u32, error: impl fmt::Display) -> ReconcileError {
    ReconcileError::new(format!(
        "saga `{saga}`: the recorded output of step {order} does not deserialize: {error}"
    ))
}
