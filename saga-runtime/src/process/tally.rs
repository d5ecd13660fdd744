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

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Envelope, EnvelopeKind, HasCorrelationId, Message};
use crate::backend::TallyOpen;

/// How long a tally's keys live by default, counted from its opening.
pub const DEFAULT_TALLY_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a completed tally is kept, so that late duplicate checks are
/// answered [`TallyCheck::AlreadyChecked`] rather than not found.
pub const COMPLETED_TALLY_KEEP: Duration = Duration::from_secs(3600);

/// How many missing items a [`TallyStatus`] lists at most (`total -
/// checked` says how many there are).
pub const MISSING_LISTED: usize = 1000;

/// Which tally: the process manager, the instance (and its generation)
/// that opened it, and its name. Serializable, so a handler can put it in
/// the work messages it sends; whoever does the work checks items through
/// it ([`Engine::tally`](crate::Engine::tally)).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TallyRef {
    /// The process manager.
    pub process: String,
    /// The instance that opened the tally.
    pub instance: String,
    /// That instance's generation
    /// ([`ProcessInstance::generation`](crate::backend::ProcessInstance::generation)).
    pub generation: String,
    /// The tally's name, unique per instance.
    pub name: String,
}

impl fmt::Display for TallyRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tally `{}` of instance `{}` of `{}`",
            self.name, self.instance, self.process
        )
    }
}

/// Delivered to the instance, once, when the last item of its tally is
/// checked. Handle it with `#[handles]` (it is correlated by the instance
/// id, whatever the process manager's own correlation is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TallyCompleted {
    /// The tally's name.
    pub tally: String,
    /// The instance that opened it.
    pub instance: String,
    /// How many items it had.
    pub total: u64,
    /// Whether the last item was checked after the tally's deadline (the
    /// instance has then had a [`TallyStatus`] with `deadline: true`).
    pub late: bool,
}

/// A tally's progress: delivered to the instance at the tally's deadline
/// (`deadline: true`, unless it completed first) and when the instance
/// polls it ([`ProcessContext::poll_tally`](super::ProcessContext::poll_tally));
/// also what [`Tally::status`](crate::engine::Tally::status) returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TallyStatus {
    /// The tally's name.
    pub tally: String,
    /// The instance that opened it.
    pub instance: String,
    /// How many items it has.
    pub total: u64,
    /// How many are checked.
    pub checked: u64,
    /// Unchecked items, sorted, at most [`MISSING_LISTED`] of them.
    pub missing: Vec<String>,
    /// Whether every item is checked.
    pub complete: bool,
    /// Whether its deadline has passed (checks since are late).
    pub deadline_passed: bool,
    /// Whether this status is the deadline's report.
    pub deadline: bool,
}

impl TallyStatus {
    /// How many items are still unchecked.
    pub fn remaining(&self) -> u64 {
        self.total.saturating_sub(self.checked)
    }
}

// Library messages, correlated by the instance id. Not offered as
// examples when a user's type is not a message (`do_not_recommend`).
#[diagnostic::do_not_recommend]
impl Message for TallyCompleted {
    const TYPE: &'static str = "saga.TallyCompleted";
    fn correlation_id(&self) -> Option<String> {
        Some(self.instance.clone())
    }
}

#[diagnostic::do_not_recommend]
impl HasCorrelationId for TallyCompleted {}

#[diagnostic::do_not_recommend]
impl Message for TallyStatus {
    const TYPE: &'static str = "saga.TallyStatus";
    fn correlation_id(&self) -> Option<String> {
        Some(self.instance.clone())
    }
}

#[diagnostic::do_not_recommend]
impl HasCorrelationId for TallyStatus {}

/// What checking an item did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TallyCheck {
    /// Checked; `remaining` items are still unchecked.
    Counted {
        /// Items still unchecked.
        remaining: u64,
        /// Checked after the deadline (the instance has been told what was
        /// missing then; this check still counts).
        late: bool,
    },
    /// Every item is checked and this check sent [`TallyCompleted`] to
    /// the instance (exactly one check of a tally answers this).
    Completed {
        /// After the deadline.
        late: bool,
    },
    /// The item was checked before (a duplicate): nothing changed.
    AlreadyChecked,
    /// The tally has no such item.
    UnknownItem,
    /// No such tally: never opened, or expired.
    NoTally,
}

/// A tally's stored progress, as a backend reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TallyProgress {
    /// Items in the tally.
    pub total: u64,
    /// Items checked.
    pub checked: u64,
    /// Some unchecked items (at most the limit asked for), in no order.
    pub missing: Vec<String>,
    /// Whether the completion has been sent.
    pub complete: bool,
    /// Whether the deadline has passed.
    pub deadline_passed: bool,
}

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
pub(crate) fn report_envelope(tally: &TallyRef, message_id: String, deadline: bool) -> Envelope {
    let request = ReportRequest {
        tally: tally.name.clone(),
        deadline,
    };
    Envelope {
        kind: EnvelopeKind::TallyReport,
        payload: serde_json::to_value(request).unwrap_or(Value::Null),
        ..addressed(tally, message_id, TallyStatus::TYPE)
    }
}

/// The envelope of a tally's completion (as stored with the tally, sent by
/// the check of its last item).
pub(crate) fn completion_envelope(
    tally: &TallyRef,
    message_id: String,
    total: u64,
    late: bool,
) -> Envelope {
    let done = TallyCompleted {
        tally: tally.name.clone(),
        instance: tally.instance.clone(),
        total,
        late,
    };
    Envelope {
        payload: serde_json::to_value(done).unwrap_or(Value::Null),
        ..addressed(tally, message_id, TallyCompleted::TYPE)
    }
}

/// A message for the instance that opened `tally`, and only its
/// generation: found by id (`key`) by a `#[handles]` handler, by
/// `instance_id` by a `#[timeout]` one.
fn addressed(tally: &TallyRef, message_id: String, message_type: &str) -> Envelope {
    Envelope {
        traceparent: crate::otel::current(),
        due_ms: None,
        hops: 0,
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
) -> (Vec<TallyOpen>, Vec<(u64, Envelope)>) {
    let id = |what: &str, name: &str| {
        super::dispatch::derived_id(
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
                let report = report_envelope(&tally, id("deadline", &opening.name), true);
                reports.push((super::dispatch::due(now_ms, after), report));
            }
            // One id for both: only one of them is ever sent.
            let done = id("completed", &opening.name);
            TallyOpen {
                completion: completion_envelope(&tally, done.clone(), total, false),
                completion_late: completion_envelope(&tally, done, total, true),
                items: unique,
                keep_for: opening.keep_for,
                tally,
            }
        })
        .collect();
    for (n, (delay, name)) in ctx.polls.iter().enumerate() {
        let report = report_envelope(&ctx.tally(name), id(&format!("poll{n}"), name), false);
        reports.push((super::dispatch::due(now_ms, *delay), report));
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
