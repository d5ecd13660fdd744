//! The dead-letter queue, as an operator works it: list it page by page,
//! requeue what was fixed (one letter, or every letter of a saga, a step
//! or an error at once) and discard what must not run again.

use super::{Engine, Intervention};
use crate::backend::{DeadLetter, DeadLetterQuery, Settle};
use crate::error::Error;
use crate::model::task::{AuditAction, AuditEntry, StepStatus, TaskInstance, TaskStatus};

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
            limit: super::page_size(filter.limit),
        };
        let page = self
            .retrying("dead_letters", || self.rt.backend.dead_letters(&query))
            .await?;
        Ok(DeadLetterPage {
            letters: page.items,
            next: page.next,
        })
    }

    /// How many messages are parked on the dead-letter queue.
    pub async fn dead_letter_count(&self) -> Result<usize, Error> {
        self.retrying("dead_letter_count", || self.rt.backend.dead_letter_count())
            .await
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
        self.requeue_as(dead_letter_id, None).await
    }

    /// [`requeue`](Self::requeue), with who did it and why recorded in
    /// the task's `Requeued` audit entry (its `details`, JSON, hold
    /// `dead_letter`, `by` and `note`): the next operator to read the task
    /// sees that it ran again because someone sent it back, not by
    /// itself. A letter with no task (bad input) has no audit log: the
    /// requeue is logged (`tracing`, with `by`) instead.
    pub async fn requeue_by(
        &self,
        dead_letter_id: &str,
        intervention: Intervention,
    ) -> Result<(), Error> {
        self.requeue_as(dead_letter_id, Some(&intervention)).await
    }

    async fn requeue_as(
        &self,
        dead_letter_id: &str,
        intervention: Option<&Intervention>,
    ) -> Result<(), Error> {
        let letter = self.letter(dead_letter_id).await?;
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
        let requeued = match (letter.task_id, status) {
            (Some(id), Some(TaskStatus::Resolved)) => Err(Error::ResolvedTask(id)),
            (Some(id), None) => Err(Error::TaskGone(id)),
            (Some(id), Some(TaskStatus::DeadLettered)) => {
                let allowed = [TaskStatus::DeadLettered];
                let settle = Settle::ResolveDeadLetter(dead_letter_id);
                self.intervene(id, "requeue", &allowed, settle, |task| {
                    resume(task, dead_letter_id, intervention);
                    true
                })
                .await
                .map(|task| {
                    if let Some(saga) = self.registered_name(&task.saga) {
                        crate::metrics::task_reopened(saga, "requeued");
                    }
                })
                .map_err(|e| match e {
                    // Requeued or resolved by someone else meanwhile.
                    Error::NotResolvable { .. } | Error::TaskNotFound(_) => {
                        Error::DeadLetterNotFound(dead_letter_id.to_owned())
                    }
                    e => e,
                })
            }
            // Bad input (or a task that moved on): put the raw message back.
            _ => match self.rt.backend.requeue_dead_letter(dead_letter_id).await? {
                Some(_) => Ok(()),
                None => Err(Error::DeadLetterNotFound(dead_letter_id.to_owned())),
            },
        };
        if let (Ok(()), Some(intervention)) = (&requeued, intervention) {
            tracing::info!(dead_letter = dead_letter_id, by = %intervention.by, "dead letter requeued");
        }
        requeued
    }

    /// Removes a dead letter for good: a message that must not run again
    /// (garbage, a command that is no longer wanted). A task it parked
    /// stays `DeadLettered`, its audit log noting who discarded the letter
    /// and why; [`resolve`](Self::resolve) it once what it left behind is
    /// settled.
    pub async fn discard(
        &self,
        dead_letter_id: &str,
        intervention: Intervention,
    ) -> Result<(), Error> {
        let letter = self.letter(dead_letter_id).await?;
        let parked = match letter.task_id {
            Some(id) => self
                .task(id)
                .await?
                .filter(|t| t.status == TaskStatus::DeadLettered),
            None => None,
        };
        if let Some(task) = parked {
            let allowed = [TaskStatus::DeadLettered];
            let settle = Settle::ResolveDeadLetter(dead_letter_id);
            let details = serde_json::json!({
                "by": intervention.by,
                "note": intervention.note,
                "dead_letter": dead_letter_id,
            });
            let entry =
                AuditEntry::new(AuditAction::DeadLetterDiscarded).details(details.to_string());
            self.intervene(task.id, "discard", &allowed, settle, |task| {
                task.audit(entry);
                false
            })
            .await?;
        } else if !self
            .retrying("discard", || {
                self.rt.backend.discard_dead_letter(dead_letter_id)
            })
            .await?
        {
            return Err(Error::DeadLetterNotFound(dead_letter_id.to_owned()));
        }
        tracing::info!(dead_letter = dead_letter_id, by = %intervention.by, "dead letter discarded");
        Ok(())
    }

    /// Requeues every dead letter that `selection` picks (at most
    /// `selection.max`), newest first: after a fix, the letters of one
    /// saga, one step or one error go back at once. Each is requeued as
    /// [`requeue`](Self::requeue) does; one that cannot be (truncated,
    /// resolved, gone meanwhile) is reported in [`Bulk::failed`] and the
    /// rest go on.
    pub async fn requeue_where(&self, selection: DeadLetterSelection) -> Result<Bulk, Error> {
        self.each_picked(&selection, |id| async move { self.requeue(&id).await })
            .await
    }

    /// [`requeue_where`](Self::requeue_where), with who did it and why
    /// recorded in each requeued task's audit log.
    pub async fn requeue_where_by(
        &self,
        selection: DeadLetterSelection,
        intervention: Intervention,
    ) -> Result<Bulk, Error> {
        let intervention = &intervention;
        self.each_picked(&selection, |id| async move {
            self.requeue_as(&id, Some(intervention)).await
        })
        .await
    }

    /// Discards every dead letter that `selection` picks (at most
    /// `selection.max`), each as [`discard`](Self::discard) does: a purge
    /// of what must not run again, audited on each parked task.
    pub async fn discard_where(
        &self,
        selection: DeadLetterSelection,
        intervention: Intervention,
    ) -> Result<Bulk, Error> {
        let intervention = &intervention;
        self.each_picked(&selection, |id| async move {
            self.discard(&id, intervention.clone()).await
        })
        .await
    }

    /// Runs `act` on every letter `selection` picks, page by page.
    async fn each_picked<F, Fut>(
        &self,
        selection: &DeadLetterSelection,
        act: F,
    ) -> Result<Bulk, Error>
    where
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = Result<(), Error>>,
    {
        let mut bulk = Bulk::default();
        let mut filter = DeadLetterFilter::new().limit(200);
        let max = selection.max.unwrap_or(DeadLetterSelection::DEFAULT_MAX);
        loop {
            let page = self.dead_letters(filter.clone()).await?;
            for letter in page.letters {
                if bulk.done.len() + bulk.failed.len() >= max {
                    return Ok(bulk);
                }
                bulk.scanned += 1;
                let task = match letter.task_id {
                    Some(id) => self.task(id).await?,
                    None => None,
                };
                if !selection.picks(&letter, task.as_ref()) {
                    continue;
                }
                match act(letter.id.clone()).await {
                    Ok(()) => bulk.done.push(letter.id),
                    Err(error @ Error::Unavailable { .. }) => {
                        // The rest would fail alike: report how far it got.
                        bulk.failed.push((letter.id, error.to_string()));
                        return Ok(bulk);
                    }
                    Err(error) => bulk.failed.push((letter.id, error.to_string())),
                }
            }
            match page.next {
                Some(next) => filter = filter.after(next),
                None => return Ok(bulk),
            }
        }
    }

    /// The letter `id`, or [`Error::DeadLetterNotFound`].
    async fn letter(&self, id: &str) -> Result<DeadLetter, Error> {
        self.dead_letter(id)
            .await?
            .ok_or_else(|| Error::DeadLetterNotFound(id.to_owned()))
    }
}

/// Which dead letters [`Engine::requeue_where`] requeues (or
/// [`Engine::discard_where`] discards): those matching every filter set.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeadLetterSelection {
    /// Letters of this saga's tasks.
    pub saga: Option<String>,
    /// Letters of tasks stopped at this step ([`TaskInstance::at_step`]).
    pub step: Option<String>,
    /// Letters whose reason, or whose task's errors, contain this text.
    pub error_contains: Option<String>,
    /// At most this many letters are acted on (default
    /// [`DEFAULT_MAX`](Self::DEFAULT_MAX)).
    pub max: Option<usize>,
}

impl DeadLetterSelection {
    /// How many letters one bulk requeue acts on unless told otherwise.
    pub const DEFAULT_MAX: usize = 1000;

    /// Whether `letter`, whose task (if any) is `task`, is picked. A
    /// letter without a task (garbage) is picked only by an error filter
    /// alone.
    fn picks(&self, letter: &DeadLetter, task: Option<&TaskInstance>) -> bool {
        let saga = self
            .saga
            .as_deref()
            .is_none_or(|saga| task.is_some_and(|t| t.saga == saga));
        let step = self
            .step
            .as_deref()
            .is_none_or(|step| task.is_some_and(|t| t.at_step(step)));
        let error = self.error_contains.as_deref().is_none_or(|text| {
            letter.reason.contains(text) || task.is_some_and(|t| t.mentions_error(text))
        });
        saga && step && error
    }
}

/// What a bulk action did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Bulk {
    /// The letters looked at.
    pub scanned: usize,
    /// The letters requeued (or discarded).
    pub done: Vec<String>,
    /// The letters picked but not acted on, with why. An unreachable
    /// backend ends the run at the first such letter.
    pub failed: Vec<(String, String)>,
}

/// Gives a parked task a fresh retry budget where it stopped: the failed
/// step, or the compensation it was running.
fn resume(task: &mut TaskInstance, dead_letter_id: &str, intervention: Option<&Intervention>) {
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
    let details = match intervention {
        Some(i) => serde_json::json!({
            "dead_letter": dead_letter_id,
            "by": i.by,
            "note": i.note,
        })
        .to_string(),
        None => format!("dead letter {dead_letter_id}"),
    };
    task.audit(AuditEntry::new(AuditAction::Requeued).details(details));
    task.set_status(if compensating {
        TaskStatus::Compensating
    } else {
        TaskStatus::Running
    });
}
