//! Tallies as records: which tally, what a check did, its progress, and
//! the messages it sends its instance (see `crate::process::tally` for how
//! a process manager uses them).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::envelope::Envelope;
use super::message::{HasCorrelationId, Message};

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
/// polls it ([`ProcessContext::poll_tally`](crate::process::ProcessContext::poll_tally));
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

/// A tally to create with a [`ProcessCommit`](crate::backend::ProcessCommit).
#[derive(Debug, Clone)]
pub struct TallyOpen {
    /// Which tally.
    pub tally: TallyRef,
    /// Its items (duplicates count once).
    pub items: Vec<String>,
    /// How long its keys live if it does not complete.
    pub keep_for: Duration,
    /// What the check of its last item enqueues, before its deadline...
    pub completion: Envelope,
    /// ... and after it.
    pub completion_late: Envelope,
}
