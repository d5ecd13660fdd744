//! A task's progress as it happens ([`Engine::watch`]): what a console
//! shows live and the HTTP API streams as server-sent events.
//!
//! The feed is read from the store, not from the worker that made it, so
//! it works across processes and survives the watcher's reconnects: each
//! look at the task turns what changed since the last one into events
//! (new audit entries, attempts started). Between looks the watcher waits
//! for the store's change notification or [`WATCH_POLL`], whichever is
//! first.

use std::collections::VecDeque;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use serde::Serialize;

use super::Engine;
use crate::error::Error;
use crate::model::task::{
    AuditAction, AuditEntry, StepStatus, TaskId, TaskInstance, TaskStatus, Timestamp,
};

/// How long a watcher waits for a change notification before it looks
/// at the task anyway (a store may notify only some changes).
pub const WATCH_POLL: Duration = Duration::from_millis(200);

/// One thing that happened to a task.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Progress {
    /// When (for a step start: when it was seen).
    pub at: Timestamp,
    /// What.
    #[serde(flatten)]
    pub event: ProgressEvent,
}

/// What [`Progress`] reports. Serialized with its name in `event`
/// (`"step_started"`, ...), which is also the SSE event name.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ProgressEvent {
    /// An attempt of a step (or of its compensation) began.
    StepStarted {
        /// The step.
        step: String,
        /// Its attempt number (1 for the first call).
        attempt: u32,
        /// Whether it is the step's compensation.
        compensation: bool,
    },
    /// An attempt failed.
    AttemptFailed {
        /// The step.
        step: Option<String>,
        /// The attempt.
        attempt: Option<u32>,
        /// Why.
        error: Option<String>,
        /// Whether it was the step's compensation.
        compensation: bool,
    },
    /// A failed attempt will be retried after `delay_ms`.
    RetryScheduled {
        /// The step.
        step: Option<String>,
        /// The delay before the next attempt.
        delay_ms: u64,
        /// Whether it is the step's compensation.
        compensation: bool,
    },
    /// A step completed.
    StepCompleted {
        /// The step.
        step: Option<String>,
    },
    /// The task began undoing its completed steps.
    Compensating,
    /// A step was compensated.
    StepCompensated {
        /// The step.
        step: Option<String>,
    },
    /// Anything else the audit log recorded (a cancellation request, a
    /// dead letter, an operator's action), as recorded.
    Audit {
        /// The entry.
        entry: AuditEntry,
    },
    /// The task reached a terminal status: the last event.
    Finished {
        /// The status.
        status: TaskStatus,
        /// Why it failed, when it did.
        error: Option<String>,
    },
}

impl ProgressEvent {
    /// The step it concerns, if any.
    pub fn step(&self) -> Option<&str> {
        match self {
            ProgressEvent::StepStarted { step, .. } => Some(step),
            ProgressEvent::AttemptFailed { step, .. }
            | ProgressEvent::RetryScheduled { step, .. }
            | ProgressEvent::StepCompleted { step }
            | ProgressEvent::StepCompensated { step } => step.as_deref(),
            ProgressEvent::Audit { entry } => entry.step.as_deref(),
            ProgressEvent::Compensating | ProgressEvent::Finished { .. } => None,
        }
    }

    /// The event's name, as serialized.
    pub fn name(&self) -> &'static str {
        match self {
            ProgressEvent::StepStarted { .. } => "step_started",
            ProgressEvent::AttemptFailed { .. } => "attempt_failed",
            ProgressEvent::RetryScheduled { .. } => "retry_scheduled",
            ProgressEvent::StepCompleted { .. } => "step_completed",
            ProgressEvent::Compensating => "compensating",
            ProgressEvent::StepCompensated { .. } => "step_compensated",
            ProgressEvent::Audit { .. } => "audit",
            ProgressEvent::Finished { .. } => "finished",
        }
    }
}

impl Engine {
    /// The progress of task `id`, from its start (its audit log replayed)
    /// until it reaches a terminal status: then one
    /// [`ProgressEvent::Finished`] ends the stream. An unknown task yields
    /// one [`Error::TaskNotFound`]; a backend that stays unreachable, one
    /// [`Error::Unavailable`]. A task that is resumed after it finished
    /// (an operator's requeue) needs a new watch.
    pub fn watch(&self, id: TaskId) -> BoxStream<'static, Result<Progress, Error>> {
        let watcher = Watcher {
            engine: self.clone(),
            id,
            seen: None,
            attempts: Vec::new(),
            queue: VecDeque::new(),
            done: false,
        };
        stream::unfold(watcher, |mut w| async move {
            let item = w.next().await?;
            Some((item, w))
        })
        .boxed()
    }
}

struct Watcher {
    engine: Engine,
    id: TaskId,
    /// The last audit entry turned into events (the log is capped, so a
    /// position would drift).
    seen: Option<AuditEntry>,
    /// Per step: (attempts, compensation attempts) at the last look.
    attempts: Vec<(u32, u32)>,
    queue: VecDeque<Progress>,
    done: bool,
}

impl Watcher {
    async fn next(&mut self) -> Option<Result<Progress, Error>> {
        loop {
            if let Some(progress) = self.queue.pop_front() {
                return Some(Ok(progress));
            }
            if self.done {
                return None;
            }
            let first = self.seen.is_none() && self.attempts.is_empty();
            if !first {
                let backend = &self.engine.rt.backend;
                backend.wait_for_change(self.id, WATCH_POLL).await;
            }
            match self.engine.task(self.id).await {
                Ok(Some(task)) => self.look(&task, first),
                Ok(None) => {
                    self.done = true;
                    return Some(Err(Error::TaskNotFound(self.id)));
                }
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            }
        }
    }

    /// Queues what changed since the last look.
    fn look(&mut self, task: &TaskInstance, first: bool) {
        let from = match &self.seen {
            Some(seen) => task
                .audit_log
                .iter()
                .rposition(|e| e == seen)
                .map_or(0, |i| i + 1),
            None => 0,
        };
        let now = Timestamp::now();
        // Each event with the attempt it is about, `(compensation, n)`.
        let mut batch: Vec<(Progress, Option<(bool, u32)>)> = task.audit_log[from..]
            .iter()
            .flat_map(|entry| {
                let compensation = matches!(
                    entry.action,
                    AuditAction::CompensationAttemptFailed { .. } | AuditAction::StepCompensated
                );
                let owner = entry.attempt.map(|n| (compensation, n));
                events(entry).into_iter().map(move |p| (p, owner))
            })
            .collect();
        self.seen = task.audit_log.last().cloned().or(self.seen.take());
        let attempts: Vec<(u32, u32)> = task
            .steps
            .iter()
            .map(|s| (s.attempt_count, s.compensation_attempts))
            .collect();
        for (step, &(calls, undos)) in task.steps.iter().zip(&attempts) {
            let (was_calls, was_undos) = match first {
                // Only the attempt running now is news on a first look.
                true => (calls.saturating_sub(1), undos.saturating_sub(1)),
                false => self
                    .attempts
                    .get(step.order as usize - 1)
                    .copied()
                    .unwrap_or((0, 0)),
            };
            // Every attempt begun since the last look, each placed after
            // what this look saw of the attempts before it (and before the
            // rest of the step's events).
            let mut start = |attempt: u32, compensation: bool| {
                let ours = |p: &Progress| p.event.step() == Some(step.name.as_str());
                let after_earlier = batch.iter().rposition(|(p, owner)| {
                    ours(p) && owner.is_some_and(|(c, n)| c == compensation && n < attempt)
                });
                let at = match after_earlier {
                    Some(i) => i + 1,
                    None => batch
                        .iter()
                        .position(|(p, _)| ours(p))
                        .unwrap_or(batch.len()),
                };
                let progress = Progress {
                    at: now,
                    event: ProgressEvent::StepStarted {
                        step: step.name.clone(),
                        attempt,
                        compensation,
                    },
                };
                batch.insert(at, (progress, Some((compensation, attempt))));
            };
            if !first || step.status == StepStatus::Running {
                (was_calls + 1..=calls).for_each(|n| start(n, false));
            }
            if !first || step.status == StepStatus::Compensating {
                (was_undos + 1..=undos).for_each(|n| start(n, true));
            }
        }
        self.queue.extend(batch.into_iter().map(|(p, _)| p));
        self.attempts = attempts;
        if task.status.is_terminal() {
            self.done = true;
            self.queue.push_back(Progress {
                at: task.finished_at.unwrap_or(task.updated_at),
                event: ProgressEvent::Finished {
                    status: task.status,
                    error: task.error.clone(),
                },
            });
        }
    }
}

/// The events one audit entry stands for.
fn events(entry: &AuditEntry) -> Vec<Progress> {
    let at = entry.at;
    let step = entry.step.clone();
    let failed = |compensation| ProgressEvent::AttemptFailed {
        step: step.clone(),
        attempt: entry.attempt,
        error: entry.error.clone(),
        compensation,
    };
    let retry = |delay: Option<u64>, compensation| {
        delay.map(|delay_ms| ProgressEvent::RetryScheduled {
            step: step.clone(),
            delay_ms,
            compensation,
        })
    };
    let events = match &entry.action {
        AuditAction::StatusChanged {
            to: TaskStatus::Compensating,
            ..
        } => vec![ProgressEvent::Compensating],
        // Running, and terminal statuses (`Finished` reports the last).
        AuditAction::StatusChanged { .. } => vec![],
        AuditAction::AttemptFailed { retry_in_ms, .. } => std::iter::once(failed(false))
            .chain(retry(*retry_in_ms, false))
            .collect(),
        AuditAction::CompensationAttemptFailed { retry_in_ms } => std::iter::once(failed(true))
            .chain(retry(*retry_in_ms, true))
            .collect(),
        AuditAction::StepCompleted => vec![ProgressEvent::StepCompleted { step: step.clone() }],
        AuditAction::StepCompensated => {
            vec![ProgressEvent::StepCompensated { step: step.clone() }]
        }
        _ => vec![ProgressEvent::Audit {
            entry: entry.clone(),
        }],
    };
    events
        .into_iter()
        .map(|event| Progress { at, event })
        .collect()
}
