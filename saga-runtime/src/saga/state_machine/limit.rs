//! What a flow-control limit (`#[limit]`) does to a task whose step has no
//! slot or token now: the task is parked, as a durable scheduled message,
//! until the limit is due to let it through (a freed slot wakes it
//! sooner). No attempt is recorded, so the wait spends neither a retry
//! nor any of the step's timeout, and a cancellation meets a parked task
//! like any other waiting one.
//!
//! A long wait may bring the task back many times (a wake-up that finds
//! the slot taken, a fallback that comes due): the step records the wait
//! (`StepRecord::limit_wait`) and its audit log records it once, when it
//! begins, not at every return, so that waiting behind a busy provider
//! does not push the task's history out of its capped log. Starting the
//! attempt ends the wait.

use std::fmt;
use std::time::Duration;

use super::{NextMove, Transition};
use crate::model::task::{
    AuditAction, AuditEntry, StepStatus, TaskInstance, Timestamp, WaitingForLimit,
};
use crate::saga::SagaDefinition;

/// The shortest a parked task waits: one that came straight back would
/// spin on the limit.
const MIN_PARK: Duration = Duration::from_millis(1);

/// Which limit a step waits for, and for how long at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// The limit's name.
    pub limit: String,
    /// The key's value, for a keyed limit.
    pub key: Option<String>,
    /// Tried again after this at the latest.
    pub retry_after: Duration,
    /// How many wait ahead in line.
    pub ahead: u64,
    /// A rate's token (else a concurrency slot).
    pub rate: bool,
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "waiting for limit `{}`", self.limit)?;
        if let Some(key) = &self.key {
            write!(f, " (key {key})")?;
        }
        Ok(())
    }
}

/// Parks the task until the limit lets step `idx` through.
pub(super) fn parked(
    task: &mut TaskInstance,
    def: &SagaDefinition,
    idx: usize,
    waiting: Waiting,
) -> Transition {
    let name = def.steps[idx].name;
    // Whole milliseconds, rounded up (scheduled messages are timed in
    // milliseconds): a task back a moment before its token is due would
    // park again.
    let delay = Duration::from_millis(waiting.retry_after.as_nanos().div_ceil(1_000_000) as u64)
        .max(MIN_PARK);
    let rec = &mut task.steps[idx];
    let same = rec
        .limit_wait
        .as_ref()
        .is_some_and(|w| w.limit == waiting.limit && w.key == waiting.key);
    rec.status = StepStatus::Pending;
    rec.next_attempt_at = Some(super::after(delay));
    if !same {
        rec.limit_wait = Some(WaitingForLimit {
            limit: waiting.limit.clone(),
            key: waiting.key.clone(),
            since: Timestamp::now(),
        });
        let what = match waiting.rate {
            true => "its start is booked".to_owned(),
            false if waiting.ahead == 0 => "first in line for a slot".to_owned(),
            false => format!("{} ahead in line for a slot", waiting.ahead),
        };
        task.audit(
            AuditEntry::new(AuditAction::LimitWait {
                limit: waiting.limit.clone(),
                key: waiting.key.clone(),
            })
            .step(name)
            .details(format!(
                "{waiting}: {what}; tried again within {}{}, no retry spent",
                humantime::format_duration(Duration::from_millis(delay.as_millis() as u64)),
                if waiting.rate {
                    ""
                } else {
                    " or when a slot frees"
                }
            )),
        );
    }
    Transition::wait(task, NextMove::After(delay))
}

/// When step `idx` began waiting for `limit`, if that is what it waits
/// for.
pub(crate) fn waiting_since(task: &TaskInstance, idx: usize, limit: &str) -> Option<Timestamp> {
    let wait = task.steps.get(idx)?.limit_wait.as_ref()?;
    (wait.limit == limit).then_some(wait.since)
}
