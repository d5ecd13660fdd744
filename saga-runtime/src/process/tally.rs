//! Tallies: fan-in without a hot instance.
//!
//! A process manager that hands out many work items and must know when all
//! are done would, naively, count "item done" messages in its state: every
//! one of them loads, changes and saves the same instance, so they queue
//! up behind each other (and, with several workers, conflict). A tally is
//! the tally sheet of the NServiceBus article instead: the instance opens
//! it with the items ([`ProcessContext::open_tally`](super::ProcessContext::open_tally)),
//! whoever does an item checks its box ([`Engine::tally`](crate::Engine::tally),
//! one round trip that never touches the instance), and the instance gets
//! one [`TallyCompleted`] when the last box is checked, plus a
//! [`TallyStatus`] at the deadline, if it set one, listing what is missing.
//!
//! A tally belongs to one generation of one instance: a deleted instance's
//! tallies never report to the instance created after it with the same id.
//! Its keys expire ([`OpenTally::keep_for`], default 7 days; one hour after
//! completion), so an abandoned tally does not stay for ever.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::machine::{derived_id, due};
use crate::model::envelope::{Envelope, EnvelopeKind};
use crate::model::message::Message;
pub use crate::model::tally::{
    TallyCheck, TallyCompleted, TallyOpen, TallyProgress, TallyRef, TallyStatus,
    COMPLETED_TALLY_KEEP, DEFAULT_TALLY_KEEP, MISSING_LISTED,
};

/// A tally a handler opens: written with the handler's commit, so it
/// exists exactly when the state that opened it does.
#[derive(Debug, Clone, PartialEq)]
pub struct TallyOpening {
    pub(crate) name: String,
    pub(crate) items: Vec<String>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) keep_for: Duration,
}

/// Returned by [`ProcessContext::open_tally`](super::ProcessContext::open_tally):
/// set a deadline or a lifetime, and take the reference to hand out.
#[must_use = "keep the tally's reference (`.reference()`) to give to whoever checks its items"]
pub struct OpenTally<'a> {
    pub(crate) opening: &'a mut TallyOpening,
    pub(crate) reference: TallyRef,
}

impl OpenTally<'_> {
    /// Delivers a [`TallyStatus`] with `deadline: true` to the instance
    /// `after` from now if the tally is not complete by then. Checks after
    /// it still count (they are reported `late`), and completion still
    /// sends [`TallyCompleted`] (with `late: true`).
    pub fn deadline(self, after: Duration) -> Self {
        self.opening.deadline = Some(after);
        self
    }

    /// How long the tally is kept, from its opening, if it does not
    /// complete (default [`DEFAULT_TALLY_KEEP`]): after that checks answer
    /// [`TallyCheck::NoTally`]. Make it longer than the work can take.
    pub fn keep_for(self, keep: Duration) -> Self {
        self.opening.keep_for = keep;
        self
    }

    /// The tally's reference.
    pub fn reference(&self) -> TallyRef {
        self.reference.clone()
    }
}

/// The payload of a scheduled report (a deadline or a poll): what the
/// worker needs to fill in the [`TallyStatus`] when it is due.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ReportRequest {
    pub tally: String,
    pub deadline: bool,
}

/// The envelope that will carry a tally's report to its instance, filled
/// in when it is due ([`EnvelopeKind::TallyReport`]).
pub(crate) fn report_envelope(
    tally: &TallyRef,
    message_id: String,
    deadline: bool,
    traceparent: Option<&str>,
) -> Envelope {
    let request = ReportRequest {
        tally: tally.name.clone(),
        deadline,
    };
    Envelope {
        kind: EnvelopeKind::TallyReport,
        payload: serde_json::to_value(request).unwrap_or(Value::Null),
        ..addressed(tally, message_id, TallyStatus::TYPE, traceparent)
    }
}

/// The envelope of a tally's completion (as stored with the tally, sent by
/// the check of its last item).
pub(crate) fn completion_envelope(
    tally: &TallyRef,
    message_id: String,
    total: u64,
    late: bool,
    traceparent: Option<&str>,
) -> Envelope {
    let done = TallyCompleted {
        tally: tally.name.clone(),
        instance: tally.instance.clone(),
        total,
        late,
    };
    Envelope {
        payload: serde_json::to_value(done).unwrap_or(Value::Null),
        ..addressed(tally, message_id, TallyCompleted::TYPE, traceparent)
    }
}

/// A message for the instance that opened `tally`, and only its
/// generation: found by id (`key`) by a `#[handles]` handler, by
/// `instance_id` by a `#[timeout]` one. `traceparent`: the handling that
/// opened the tally (passed in: the machine reads no span).
fn addressed(
    tally: &TallyRef,
    message_id: String,
    message_type: &str,
    traceparent: Option<&str>,
) -> Envelope {
    Envelope {
        traceparent: traceparent.map(str::to_owned),
        due_ms: None,
        hops: 0,
        hold_until: None,
        message_id,
        process: tally.process.clone(),
        message_type: message_type.to_owned(),
        payload: Value::Null,
        kind: EnvelopeKind::Message,
        instance_id: Some(tally.instance.clone()),
        generation: Some(tally.generation.clone()).filter(|g| !g.is_empty()),
        failures: 0,
        key: Some(tally.instance.clone()),
        key_field: None,
    }
}

/// The status message of `tally` from its stored progress.
pub(crate) fn status_of(tally: &TallyRef, progress: TallyProgress, deadline: bool) -> TallyStatus {
    let mut missing = progress.missing;
    missing.sort();
    missing.truncate(MISSING_LISTED);
    TallyStatus {
        tally: tally.name.clone(),
        instance: tally.instance.clone(),
        total: progress.total,
        checked: progress.checked,
        missing,
        complete: progress.complete,
        deadline_passed: progress.deadline_passed,
        deadline,
    }
}

/// The tallies a handler opened and the reports it asked for (deadlines,
/// polls), ready for its commit. Message ids derive from the message
/// handled, so a re-run after a conflict produces the same ones.
pub(crate) fn commit_parts(
    ctx: &super::ProcessContext,
    handled: &Envelope,
    now_ms: u64,
    traceparent: Option<&str>,
) -> (Vec<TallyOpen>, Vec<(u64, Envelope)>) {
    let id = |what: &str, name: &str| {
        derived_id(
            &handled.message_id,
            &ctx.instance_id,
            &format!("{what}:{name}"),
        )
    };
    let mut reports = Vec::new();
    let opens = ctx
        .tallies
        .iter()
        .map(|opening| {
            let tally = ctx.tally(&opening.name);
            let mut unique = opening.items.clone();
            unique.sort_unstable();
            unique.dedup();
            let total = unique.len() as u64;
            if let Some(after) = opening.deadline {
                let report_id = id("deadline", &opening.name);
                let report = report_envelope(&tally, report_id, true, traceparent);
                reports.push((due(now_ms, after), report));
            }
            // One id for both: only one of them is ever sent.
            let done = id("completed", &opening.name);
            TallyOpen {
                completion: completion_envelope(&tally, done.clone(), total, false, traceparent),
                completion_late: completion_envelope(&tally, done, total, true, traceparent),
                items: unique,
                keep_for: opening.keep_for,
                tally,
            }
        })
        .collect();
    for (n, (delay, name)) in ctx.polls.iter().enumerate() {
        let report_id = id(&format!("poll{n}"), name);
        let report = report_envelope(&ctx.tally(name), report_id, false, traceparent);
        reports.push((due(now_ms, *delay), report));
    }
    (opens, reports)
}

/// The tally a due report is for, and what was asked.
pub(crate) fn report_target(envelope: &Envelope) -> Option<(TallyRef, ReportRequest)> {
    let request: ReportRequest = serde_json::from_value(envelope.payload.clone()).ok()?;
    let tally = TallyRef {
        process: envelope.process.clone(),
        instance: envelope.instance_id.clone()?,
        generation: envelope.generation.clone().unwrap_or_default(),
        name: request.tally.clone(),
    };
    Some((tally, request))
}

/// The due report `envelope` filled in from its tally's `progress`, read
/// now; `Err(reason)` when there is nothing to report (the tally is gone,
/// or its deadline came after it completed).
pub(crate) fn report(
    envelope: &Envelope,
    tally: &TallyRef,
    deadline: bool,
    progress: Option<TallyProgress>,
) -> Result<Envelope, String> {
    match progress {
        None => Err(format!("{tally} no longer exists")),
        Some(p) if deadline && p.complete => Err(format!("{tally} completed before its deadline")),
        Some(p) => {
            let status = status_of(tally, p, deadline);
            Ok(Envelope {
                kind: EnvelopeKind::Message,
                payload: serde_json::to_value(status).unwrap_or(Value::Null),
                ..envelope.clone()
            })
        }
    }
}
