//! What an operator does when automated recovery ran out: list the
//! dead-letter queue page by page, requeue what was fixed, and mark a task
//! resolved once what it left behind was fixed by hand.

use super::Engine;
use crate::backend::Locked;
use crate::backend::{DeadLetter, DeadLetterQuery, Next, QueueMessage, Settle, TaskCommit};
use crate::error::Error;
use crate::task::{AuditAction, AuditEntry, StepStatus, TaskId, TaskInstance, TaskStatus};

/// Which dead letters [`Engine::dead_letters`] lists, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterFilter {
    /// Where the page starts: a [`DeadLetterPage::next`].
    pub cursor: Option<String>,
    /// Page size (default 50, at most 1000).
    pub limit: usize,
}

impl DeadLetterFilter {
    /// The newest 50.
    pub fn new() -> Self {
        DeadLetterFilter::default()
    }

    /// The page after the one that returned `cursor` as its `next`.
    pub fn after(mut self, cursor: impl Into<String>) -> Self {
        self.cursor = Some(cursor.into());
        self
    }

    /// At most `n` per page.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = n;
        self
    }
}

/// One page of [`Engine::dead_letters`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterPage {
    /// The dead letters, newest first.
    pub letters: Vec<DeadLetter>,
    /// The cursor of the next page; `None` on the last.
    pub next: Option<String>,
}

impl Engine {
    /// One page of the messages parked on the dead-letter queue, newest
    /// first.
    pub async fn dead_letters(&self, filter: DeadLetterFilter) -> Result<DeadLetterPage, Error> {
        let query = DeadLetterQuery {
            after: filter.cursor,
            limit: match filter.limit {
                0 => 50,
                n => n.min(1000),
            },
        };
        let page = self
            .retrying("dead_letters", || self.rt.backend.dead_letters(&query))
            .await?;
        Ok(DeadLetterPage {
            letters: page.items,
            next: page.next,
        })
    }

    /// One dead letter.
    pub async fn dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, Error> {
        self.retrying("dead_letter", || self.rt.backend.dead_letter_by_id(id))
            .await
    }

    /// Puts a dead-lettered message back on the queue (`dead_letter_id` is
    /// a [`DeadLetter::id`]).
    ///
    /// For a task parked by `on_exhausted = dead_letter` or as poison, the
    /// failed step (or compensation) gets a fresh retry budget (attempt
    /// numbers keep counting, so attempt claims stay unique) and the task
    /// resumes where it stopped.
    pub async fn requeue(&self, dead_letter_id: &str) -> Result<(), Error> {
        let backend = &self.rt.backend;
        let letter = self
            .dead_letter(dead_letter_id)
            .await?
            .ok_or_else(|| Error::DeadLetterNotFound(dead_letter_id.to_owned()))?;
        if let Some(size) = letter.truncated {
            return Err(Error::DeadLetterTruncated {
                id: dead_letter_id.to_owned(),
                size,
            });
        }
        let status = match letter.task_id {
            Some(id) => self.task(id).await?.map(|t| t.status),
            None => None,
        };
        if let (Some(id), Some(TaskStatus::Resolved)) = (letter.task_id, status) {
            return Err(Error::ResolvedTask(id));
        }
        let parked = status == Some(TaskStatus::DeadLettered);
        if !parked {
            // Bad input (or a task that moved on): put the raw message back.
            return match backend.requeue_dead_letter(dead_letter_id).await? {
                Some(_) => Ok(()),
                None => Err(Error::DeadLetterNotFound(dead_letter_id.to_owned())),
            };
        }
        let id = letter.task_id.expect("parked implies a task id");
        let locked = self.lock_stopped(id, "requeue").await?;
        let Some(mut task) = locked.task.filter(|t| t.status == TaskStatus::DeadLettered) else {
            backend.unlock(&locked.lease).await?;
            return Err(Error::DeadLetterNotFound(dead_letter_id.to_owned()));
        };
        resume(&mut task, dead_letter_id);
        task.seq += 1;
        let next = Next {
            message: QueueMessage {
                task_id: task.id,
                saga: task.saga.clone(),
                seq: task.seq,
            },
            delay: std::time::Duration::ZERO,
        };
        let committed = backend
            .commit(TaskCommit {
                task: &task,
                stored_status: TaskStatus::DeadLettered,
                lease: &locked.lease,
                next: Some(next),
                settle: Settle::ResolveDeadLetter(dead_letter_id),
                unless_cancelled: false,
                expire_after: None,
            })
            .await;
        if committed.is_err() {
            let _ = backend.unlock(&locked.lease).await;
        }
        committed?;
        Ok(())
    }
}

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
    /// engine's to finish, a finished one needs nothing.
    pub async fn resolve(
        &self,
        id: TaskId,
        intervention: Intervention,
    ) -> Result<TaskInstance, Error> {
        let allowed = [TaskStatus::CompensationFailed, TaskStatus::DeadLettered];
        let task = self
            .intervene(id, "resolve", &allowed, |task| {
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
            .intervene(id, "compensation retry", &allowed, |task| {
                for step in &mut task.steps {
                    if step.status == StepStatus::CompensationFailed {
                        step.status = StepStatus::Compensating;
                        step.compensation_retry_base = step.compensation_attempts;
                        // Due now: not an attempt that never reported back.
                        step.next_attempt_at = Some(crate::task::Timestamp::now());
                    }
                }
                task.error = None;
                let details =
                    serde_json::json!({ "by": intervention.by, "note": intervention.note });
                task.audit(
                    AuditEntry::new(AuditAction::CompensationRetried).details(details.to_string()),
                );
                task.set_status(TaskStatus::Compensating);
                true
            })
            .await?;
        tracing::info!(task_id = %id, by = %intervention.by, "compensation retried by hand");
        Ok(task)
    }

    /// An operator's change to a stopped task in one of the `allowed`
    /// statuses: under its lease, `change` edits it and says whether it
    /// runs again (then it is enqueued and kept until it ends; else it is
    /// kept as long as its new status is). Whatever message of the task is
    /// still about is stale afterwards.
    async fn intervene(
        &self,
        id: TaskId,
        what: &str,
        allowed: &[TaskStatus],
        change: impl FnOnce(&mut TaskInstance) -> bool,
    ) -> Result<TaskInstance, Error> {
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
                settle: Settle::Nothing,
                unless_cancelled: false,
                expire_after: match runs {
                    true => None,
                    false => self.rt.settings.retention_for(task.status),
                },
            })
            .await;
        if committed.is_err() {
            unlock().await;
        }
        committed?;
        Ok(task)
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

/// Gives a parked task a fresh retry budget where it stopped: the failed
/// step, or the compensation it was running.
fn resume(task: &mut TaskInstance, dead_letter_id: &str) {
    let compensating = task.cancelled_at.is_some()
        || task
            .steps
            .iter()
            .any(|s| matches!(s.status, StepStatus::Compensating | StepStatus::Compensated));
    for step in &mut task.steps {
        match step.status {
            StepStatus::Failed if !compensating => {
                step.status = StepStatus::Pending;
                step.retry_base = step.attempt_count;
            }
            StepStatus::Compensating => {
                step.compensation_retry_base = step.compensation_attempts;
            }
            _ => {}
        }
    }
    task.error = None;
    task.audit(
        AuditEntry::new(AuditAction::Requeued).details(format!("dead letter {dead_letter_id}")),
    );
    task.set_status(if compensating {
        TaskStatus::Compensating
    } else {
        TaskStatus::Running
    });
}
