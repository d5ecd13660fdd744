//! Writing what an attempt came to: the commit that ends a delivery, and
//! the retries that ride out a dropped connection.

use super::{Run, Stopped};
use crate::backend::{
    BackendError, Next, QueueMessage, Settle, TaskCommit, TaskRefusal, TaskWrite,
};
use crate::metrics;
use crate::metrics::DeadLetterKind;
use crate::model::task::{TaskInstance, TaskStatus};
use crate::saga::state_machine as sm;
use crate::saga::state_machine::{NextMove, Transition};
use std::time::Duration;

/// A write made under the run's lease, as [`Run::persist`] saw it land.
pub(super) enum Landed<T> {
    /// Its reply: what the write returns.
    Replied(T),
    /// An earlier try landed and its reply was lost: the version it wrote.
    ReplyLost(u64),
}

impl Run<'_> {
    /// Writes the outcome, the next message, the acknowledgement (or dead
    /// letter) and the lease's release at once. A guarded write (one that
    /// would end a running task, or make it wait for a delayed message) is
    /// refused while a cancellation is recorded; the cancellation is then
    /// applied instead.
    pub(super) async fn commit(
        &self,
        mut task: TaskInstance,
        stored: TaskStatus,
        transition: Transition,
    ) -> Result<(), Stopped> {
        let Transition {
            next,
            dead_letter,
            guard,
        } = transition;
        let guarded = guard.is_some();
        let written = self
            .write(&mut task, stored, next, dead_letter.as_deref(), guarded)
            .await;
        match (written, guard) {
            // Only a guarded commit is refused for a cancellation: the
            // task as it was before the outcome begins its cancellation.
            (Err(Stopped::Refused(TaskRefusal::CancelRequested { at })), Some(before)) => {
                let mut task = *before;
                sm::begin_cancel(&mut task, self.def, at);
                let next = if task.status.is_terminal() {
                    NextMove::Stop
                } else {
                    NextMove::Now
                };
                self.write(&mut task, stored, next, None, false).await
            }
            (written, _) => written,
        }
    }

    pub(super) async fn write(
        &self,
        task: &mut TaskInstance,
        stored: TaskStatus,
        next: NextMove,
        dead_letter: Option<&str>,
        unless_cancelled: bool,
    ) -> Result<(), Stopped> {
        self.leave_limits(task);
        let delay = match next {
            NextMove::Stop => None,
            NextMove::Now => Some(Duration::ZERO),
            NextMove::After(delay) => Some(delay),
        };
        let next = delay.map(|delay| {
            task.seq += 1;
            Next {
                message: QueueMessage {
                    task_id: task.id,
                    saga: task.saga.clone(),
                    seq: task.seq,
                },
                delay,
            }
        });
        let settle = match dead_letter {
            Some(reason) => Settle::DeadLetter(self.delivery, reason),
            None => Settle::Ack(self.delivery),
        };
        let commit = TaskCommit {
            task,
            stored_status: stored,
            lease: self.lease,
            next,
            settle,
            unless_cancelled,
            expire_after: self.rt.settings.retention_for(task.status),
        };
        // Written now, or by an earlier try whose reply was lost: either way
        // the commit landed.
        let landed: Landed<u64> = self
            .persist(task.id, task.version, || {
                self.rt.backend.commit(commit.clone())
            })
            .await??;
        task.audit_saved();
        let (Landed::Replied(version) | Landed::ReplyLost(version)) = landed;
        task.steps_saved(version);
        if dead_letter.is_some() {
            metrics::dead_lettered(DeadLetterKind::Saga);
        }
        if task.status.is_terminal() {
            metrics::task_finished(self.def.name, task.status);
            tracing::info!(task_id = %task.id, saga = self.def.name, status = %task.status, "task finished");
        }
        Ok(())
    }

    /// Runs a write of the task made under this delivery's lease, riding
    /// out a dropped connection: the write is tried again a few times, and
    /// a retry refused with a version conflict is checked against the
    /// store, because the earlier try may have landed with its reply lost.
    /// Under our lease nobody else writes the task, so a stored version one
    /// past ours is our own write: [`Landed::ReplyLost`].
    ///
    /// Without this a blip between a step's call and its commit would make
    /// the redelivery see an attempt that "never reported back", and a step
    /// without retries would fail its task over a network hiccup.
    pub(super) async fn persist<T, F, Fut>(
        &self,
        id: crate::model::task::TaskId,
        version: u64,
        mut write: F,
    ) -> Result<TaskWrite<Landed<T>>, BackendError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<TaskWrite<T>, BackendError>>,
    {
        const DELAYS_MS: [u64; 6] = [0, 10, 50, 100, 250, 500];
        let mut retried = false;
        for delay in DELAYS_MS {
            match write().await {
                Ok(Err(TaskRefusal::Conflict { actual, .. }))
                    if retried && actual == version + 1 =>
                {
                    tracing::debug!(task_id = %id, "an earlier try of the write landed; its reply was lost");
                    return Ok(Ok(Landed::ReplyLost(actual)));
                }
                Ok(answer) => return Ok(answer.map(Landed::Replied)),
                Err(error) if error.is_transient() => {
                    tracing::debug!(task_id = %id, %error, "writing the task failed; trying again");
                    retried = true;
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(write().await?.map(Landed::Replied))
    }
}
