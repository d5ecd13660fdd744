//! What a worker does with a message for a saga version it does not run:
//! hand it to an engine that runs it, or park the task with a true reason.

use super::Stopped;
use crate::backend::{BackendError, Delivery, QueueMessage, Settle, TaskCommit};
use crate::metrics;
use crate::metrics::DeadLetterKind;
use crate::saga::state_machine as sm;
use crate::worker::lease::LeaseGuard;
use crate::worker::runtime::Runtime;
use std::sync::Arc;

/// A message this worker cannot handle but another version may: a saga
/// it does not run (a rolling deploy that adds one), a task started with
/// other steps, a record it cannot parse.
///
/// When another live engine announced that it runs what the task needs
/// (`runner`, one of the forms `Runners::announce_sagas` records), the
/// message goes back at once as an *answered* delivery: during a rolling
/// deploy an engine that lacks a version is handed its tasks' messages as
/// often as the one that has it, and counting those hand-backs would park
/// runnable tasks as poison with a reason (a crash) that is false.
///
/// Otherwise it goes back with growing delays (1 s, 2 s, 4 s, ... up to 5
/// minutes) for a worker that can; each such hand-back counts as an
/// unanswered delivery, so a message no worker ever handles is, at the
/// delivery cap, dead-lettered and its task parked `DeadLettered`
/// (waitable, listable, and requeueable once a compatible version is
/// deployed), with a reason that says no live engine runs it.
pub(super) async fn another_version(
    rt: &Arc<Runtime>,
    delivery: &Delivery,
    message: &QueueMessage,
    why: String,
    runner: Option<String>,
) {
    let announced = match &runner {
        Some(run) => match rt.runners().saga_runner_alive(run).await {
            Ok(alive) => Some(alive),
            Err(error) => {
                tracing::debug!(%error, "could not tell whether another engine runs it");
                None
            }
        },
        None => None,
    };
    if announced == Some(true) {
        tracing::debug!(task_id = %message.task_id, "{why}; run by another live engine: handed back");
        return crate::worker::release(rt, delivery, rt.settings.lock_retry_delay).await;
    }
    if delivery.deliveries <= rt.settings.max_deliveries {
        let delay = crate::worker::another_version_delay(delivery.deliveries);
        tracing::warn!(task_id = %message.task_id, ?delay, "{why}; handed back for a worker that can handle it");
        if let Err(error) = rt.backend.defer(delivery, delay).await {
            tracing::debug!(%error, "handing the message back failed; it is redelivered after the visibility timeout");
        }
        return;
    }
    let waited: u64 = (1..delivery.deliveries)
        .map(|n| crate::worker::another_version_delay(n).as_secs())
        .sum();
    let nobody = match announced {
        Some(_) => "no live engine announces that it runs it, and none",
        None => "no worker able to handle it",
    };
    let reason = format!(
        "{why}; {nobody} took the message in {} deliveries over about {waited} s: requeue it once a compatible version is deployed",
        delivery.deliveries - 1,
    );
    match park(rt, delivery, message, &reason).await {
        Ok(true) => {}
        // No task to park, or one this worker cannot even read: the
        // message goes to the dead-letter queue on its own.
        Ok(false) | Err(Stopped::Failed(BackendError::Corrupt(_))) => {
            crate::worker::dead_letter(rt, delivery, reason, Some(message.task_id)).await
        }
        Err(error) => {
            tracing::warn!(%error, "parking the task failed; the message comes back");
            crate::worker::release(rt, delivery, rt.settings.lock_retry_delay).await;
        }
    }
}

/// Parks the task `message` is for as `DeadLettered` with `reason`, and the
/// message with it, in one commit. `Ok(false)` when there is nothing to
/// park (no such task, ended, or the message is stale).
pub(in crate::worker) async fn park(
    rt: &Arc<Runtime>,
    delivery: &Delivery,
    message: &QueueMessage,
    reason: &str,
) -> Result<bool, Stopped> {
    let Some(locked) = rt
        .backend
        .lock_and_load(message.task_id, rt.lease_ttl())
        .await?
    else {
        return Ok(false);
    };
    let guard = LeaseGuard::new(rt, &locked.lease);
    let Some(mut task) = locked
        .task
        .filter(|t| t.seq == message.seq && !t.status.is_terminal())
    else {
        guard.release().await;
        return Ok(false);
    };
    let stored = task.status;
    sm::park(&mut task, reason);
    let mut guard = guard;
    rt.backend
        .commit(TaskCommit {
            task: &task,
            stored_status: stored,
            lease: &locked.lease,
            next: None,
            settle: Settle::DeadLetter(delivery, reason),
            unless_cancelled: false,
            expire_after: rt.settings.retention_for(task.status),
        })
        .await??;
    guard.disarm();
    metrics::dead_lettered(DeadLetterKind::Saga);
    metrics::task_parked(&task.saga);
    Ok(true)
}
