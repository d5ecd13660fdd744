//! What an operator does to a task when automated recovery ran out: mark
//! it resolved once what it left behind was fixed by hand, or run its
//! failed compensation again. Every action is audited with who and why.

use super::{CancelResult, Engine};
use crate::backend::{Locked, Next, QueueMessage, Settle, TaskCommit, TaskRefusal};
use crate::error::Error;
use crate::model::task::{
    AuditAction, AuditEntry, StepStatus, TaskId, TaskInstance, TaskStatus, AUDIT_LOG_CAP,
};

/// Who acted on a task by hand, and why: kept in its audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intervention {
    /// The operator (a name, an email, a ticket system's user).
    pub by: String,
    /// What was found and done.
    pub note: String,
}

impl Intervention {
    /// `by` acted, for the reason `note`.
    pub fn new(by: impl Into<String>, note: impl Into<String>) -> Self {
        Intervention {
            by: by.into(),
            note: note.into(),
        }
    }
}

impl Engine {
    /// Marks a task that ended needing an operator (`CompensationFailed`,
    /// `DeadLettered`) as `Resolved`: what it left behind was fixed by hand
    /// (see its audit log for what failed). Terminal; the audit log keeps
    /// who, why and the status it had; the task is then kept as long as
    /// any finished task (`EngineBuilder::retention`). A dead letter of a
    /// resolved task is not requeued ([`Error::ResolvedTask`]).
    ///
    /// Any other status is [`Error::NotResolvable`]: a running task is the
    /// engine's to finish, a finished one needs nothing. Returns the task
    /// as written, with its whole audit log (as every operator action
    /// here does: what an operator is shown must not look complete and
    /// lack the history).
    pub async fn resolve(
        &self,
        id: TaskId,
        intervention: Intervention,
    ) -> Result<TaskInstance, Error> {
        let allowed = [TaskStatus::CompensationFailed, TaskStatus::DeadLettered];
        let task = self
            .intervene(id, "resolve", &allowed, Settle::Nothing, |task| {
                let details = serde_json::json!({
                    "by": intervention.by,
                    "note": intervention.note,
                    "was": task.status,
                });
                task.audit(AuditEntry::new(AuditAction::Resolved).details(details.to_string()));
                task.set_status(TaskStatus::Resolved);
                false
            })
            .await?;
        tracing::info!(task_id = %id, by = %intervention.by, "task resolved by hand");
        if let Some(saga) = self.registered_name(&task.saga) {
            crate::metrics::task_finished(saga, TaskStatus::Resolved);
        }
        Ok(task)
    }

    /// Runs a failed compensation again, with a fresh retry budget, once
    /// what made it fail is fixed (the dependency is back, the data was
    /// corrected): the task goes back to `Compensating` at the step whose
    /// compensation failed, then compensates the steps before it as usual,
    /// and may end `Compensated` (or `CompensationFailed` again). Attempt
    /// numbers keep counting, so attempt claims stay unique. The audit log
    /// records who and why.
    ///
    /// Only a `CompensationFailed` task ([`Error::NotResolvable`] names
    /// the status of any other).
    pub async fn retry_compensation(
        &self,
        id: TaskId,
        intervention: Intervention,
    ) -> Result<TaskInstance, Error> {
        let allowed = [TaskStatus::CompensationFailed];
        let task = self
            .intervene(
                id,
                "compensation retry",
                &allowed,
                Settle::Nothing,
                |task| {
                    for step in &mut task.steps {
                        if step.status == StepStatus::CompensationFailed {
                            step.status = StepStatus::Compensating;
                            step.compensation_retry_base = step.compensation_attempts;
                            // Due now: not an attempt that never reported back.
                            step.next_attempt_at = Some(crate::model::task::Timestamp::now());
                        }
                    }
                    task.error = None;
                    let details =
                        serde_json::json!({ "by": intervention.by, "note": intervention.note });
                    task.audit(
                        AuditEntry::new(AuditAction::CompensationRetried)
                            .details(details.to_string()),
                    );
                    task.set_status(TaskStatus::Compensating);
                    true
                },
            )
            .await?;
        tracing::info!(task_id = %id, by = %intervention.by, "compensation retried by hand");
        if let Some(saga) = self.registered_name(&task.saga) {
            crate::metrics::task_reopened(saga, "compensation_retried");
        }
        Ok(task)
    }

    /// Cancels a task as [`cancel_by_id`](Self::cancel_by_id) does, and
    /// records who asked and why in its audit log (a
    /// `CancellationRequested` entry whose `details` hold `by` and `note`
    /// as JSON), written with the request itself: the task may be running
    /// under a worker's lease meanwhile. A request that is refused before
    /// it is made (repeated, or for a task not cancellable or already
    /// over) records nothing; one made just as the task ended stays
    /// recorded as the request it was.
    ///
    /// Works from an engine that does not run the task's saga (`sagactl`):
    /// the task recorded at its start whether it may be cancelled. A task
    /// started before that was recorded answers [`Error::UnknownSaga`].
    pub async fn cancel_by_operator(
        &self,
        id: TaskId,
        intervention: Intervention,
    ) -> Result<CancelResult, Error> {
        let entry = asked_to_cancel(&intervention);
        let result = match self.task(id).await? {
            Some(task) => self.cancel_loaded(task, Some(&entry)).await,
            None => Ok(CancelResult::NotFound),
        };
        tracing::info!(task_id = %id, by = %intervention.by, ?result, "cancellation asked by an operator");
        result
    }

    /// [`cancel_by_operator`](Self::cancel_by_operator) of a task of the
    /// saga named `saga` ([`Error::WrongSaga`] for another's): the
    /// per-saga `DELETE` route's.
    #[cfg(feature = "http")]
    pub(crate) async fn cancel_by_operator_of(
        &self,
        saga: &str,
        id: TaskId,
        intervention: Intervention,
    ) -> Result<CancelResult, Error> {
        let entry = asked_to_cancel(&intervention);
        let result = self.cancel_named(saga, id, Some(&entry)).await;
        tracing::info!(task_id = %id, by = %intervention.by, ?result, "cancellation asked by an operator");
        result
    }

    /// An operator's change to a stopped task in one of the `allowed`
    /// statuses: under its lease, `change` edits it and says whether it
    /// runs again (then it is enqueued and kept until it ends; else it is
    /// kept as long as its new status is). Whatever message of the task is
    /// still about is stale afterwards. `settle` goes in the same write
    /// (the dead letter a requeue or discard removes).
    pub(super) async fn intervene(
        &self,
        id: TaskId,
        what: &str,
        allowed: &[TaskStatus],
        settle: Settle<'_>,
        change: impl FnOnce(&mut TaskInstance) -> bool,
    ) -> Result<TaskInstance, Error> {
        // A task in another status (running, say) is refused at once, not
        // after waiting out the lease of the worker that runs it.
        let read = match self.task(id).await? {
            None => return Err(Error::TaskNotFound(id)),
            Some(task) if !allowed.contains(&task.status) => {
                return Err(Error::NotResolvable {
                    id,
                    status: task.status,
                })
            }
            Some(task) => task,
        };
        let locked = self.lock_stopped(id, what).await?;
        let unlock = || async {
            let _ = self.rt.backend.unlock(&locked.lease).await;
        };
        let Some(mut task) = locked.task.clone() else {
            unlock().await;
            return Err(Error::TaskNotFound(id));
        };
        let was = task.status;
        if !allowed.contains(&was) {
            unlock().await;
            return Err(Error::NotResolvable { id, status: was });
        }
        // Checked under the lease: two requeues (or a requeue and a
        // discard) of one letter must not both act. The first one's write
        // removed the letter before it let the lease go.
        if let Settle::ResolveDeadLetter(letter) = settle {
            let present = self.rt.backend.dead_letter_by_id(letter).await;
            if !matches!(present, Ok(Some(_))) {
                unlock().await;
                present?;
                return Err(Error::DeadLetterNotFound(letter.to_owned()));
            }
        }
        // The whole audit log as stored, for the answer: a lease's load may
        // leave it out (Redis keeps it apart, and a worker needs none).
        let before = match read.version == task.version {
            true => Some(read),
            false => self.task(id).await.ok().flatten(),
        };
        let kept = task.audit_log.len();
        let runs = change(&mut task);
        task.seq += 1;
        let next = runs.then(|| Next {
            message: QueueMessage {
                task_id: task.id,
                saga: task.saga.clone(),
                seq: task.seq,
            },
            delay: std::time::Duration::ZERO,
        });
        let committed = self
            .rt
            .backend
            .commit(TaskCommit {
                task: &task,
                stored_status: was,
                lease: &locked.lease,
                next,
                settle,
                unless_cancelled: false,
                expire_after: match runs {
                    true => None,
                    false => self.rt.settings.retention_for(task.status),
                },
            })
            .await;
        if !matches!(committed, Ok(Ok(_))) {
            unlock().await;
        }
        match committed? {
            Ok(version) => {
                task.version = version;
                Ok(whole(task, before, kept))
            }
            Err(TaskRefusal::Missing) => Err(Error::TaskNotFound(id)),
            Err(reason) => Err(Error::WriteRefused { task: id, reason }),
        }
    }

    /// Takes the lease of a task no worker should be running (parked or
    /// ended): normally free at once; a straggler gets at most one lease
    /// to let go.
    async fn lock_stopped(&self, id: TaskId, what: &str) -> Result<Locked, Error> {
        let backend = &self.rt.backend;
        let deadline = tokio::time::Instant::now() + self.rt.lease_ttl();
        loop {
            if let Some(locked) = backend.lock_and_load(id, self.rt.lease_ttl()).await? {
                return Ok(locked);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Backend(crate::backend::BackendError::unavailable(
                    format!("task {id} stayed locked; try the {what} again"),
                )));
            }
            tokio::time::sleep(self.rt.settings.lock_retry_delay).await;
        }
    }
}

/// `task` as just written, with the whole audit log as stored: `before`'s
/// (the task as stored before the write) followed by the entries the write
/// added (those after the first `kept` of `task`'s own), cut to the
/// store's cap. Without `before` (it could not be read), `task` as is.
fn whole(mut task: TaskInstance, before: Option<TaskInstance>, kept: usize) -> TaskInstance {
    if let Some(before) = before {
        let added = task.audit_log.split_off(kept.min(task.audit_log.len()));
        task.audit_log = before.audit_log;
        task.audit_log.extend(added);
        let excess = task.audit_log.len().saturating_sub(AUDIT_LOG_CAP);
        task.audit_log.drain(..excess);
    }
    task.audit_saved();
    task
}

/// The audit entry of an operator's cancellation: who and why, as JSON.
fn asked_to_cancel(intervention: &Intervention) -> AuditEntry {
    let details = serde_json::json!({ "by": intervention.by, "note": intervention.note });
    AuditEntry::new(AuditAction::CancellationRequested).details(details.to_string())
}
