//! What a message does to a process-manager instance: the protocol as pure
//! functions of the instance as loaded and of what the handler did, with no
//! I/O (the worker loads, runs the handler, asks `#[on_error]` and writes).
//!
//! The worker (`worker::process::dispatch`) takes one message through it:
//!
//! 1. [`Handling::new`]: the message's handler, and how its instance is
//!    found (a [`Lookup`]); a message that cannot be routed is
//!    dead-lettered.
//! 2. The worker reads the instance ([`Handling::among`] first picks among
//!    the instances sharing a value); [`Handling::admit`] decides whether
//!    the handler runs on it, or on a new one ([`Handling::start`]).
//! 3. The worker runs the handler; [`Handling::ran`] turns its result into
//!    the [`Save`] to write. Messages of the instance waiting behind it in
//!    the same process may [`join`](Save::join) that write ([`joins`]).
//! 4. The worker writes; a write the store refused goes to
//!    [`Save::refused`].
//!
//! A step that does not lead to the next one ends in a [`Verdict`]: read
//! again, write a [`Decision`] (a commit, and the outcome it stands for),
//! or ask `#[on_error]` and write what [`Handling::failed`] makes of its
//! answer. `#[on_error]` is user code, so the worker calls it (a panic
//! there must not take the decision with it).
//!
//! Commits are owned plans ([`Commit`]) rather than the backend's
//! [`ProcessCommit`](crate::backend::ProcessCommit): that one borrows the
//! delivery it settles and the deliveries batched with it, which belong
//! to the worker, not to the decision; the worker lends them when it
//! writes, and moves the rest over. For the same reason nothing here reads
//! a clock, a span or the routing table: they come in [`Given`], so the
//! tests can take every branch with hand-built instances and a fixed time.

use std::time::Duration;

use serde_json::Value;

use super::context::Outgoing;
use super::error::{ErrorAction, FailureKind};
use crate::model::endpoint::{EndpointMessage, ENVELOPE_VERSION};
use crate::model::envelope::Envelope;
use crate::model::process::{ProcessAudit, ProcessAuditAction, ProcessInstance};
use crate::model::tally::TallyOpen;
use crate::model::task::Timestamp;

mod fail;
mod route;
mod save;

pub(crate) use route::{Admitted, Handling, Lookup};
pub(crate) use save::{joins, Save};

/// What happened to a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatched {
    /// The handler ran and its result was saved.
    Handled {
        /// The instance.
        instance: String,
        /// Whether this message created it.
        created: bool,
    },
    /// The instance had already handled a message with this id.
    Duplicate {
        /// The instance.
        instance: String,
    },
    /// The instance is complete or stopped (or, for a timeout, gone).
    Ignored {
        /// Why.
        reason: String,
    },
    /// A continuing message found no instance and is held until one
    /// starts (see [`Unmatched`](crate::process::Unmatched)).
    Held {
        /// The correlation value it waits for.
        key: String,
        /// When its hold ends (ms since the epoch).
        until_ms: u64,
    },
    /// A continuing message found no instance (after its hold, if it was
    /// held): logged, counted and, by its policy, dead-lettered or
    /// dropped.
    Unmatched {
        /// The correlation value that matched nothing.
        key: String,
        /// Whether it was parked on the dead-letter queue.
        dead_lettered: bool,
    },
    /// The handler (or strict routing) failed; `#[on_error]` chose `action`.
    Failed {
        /// The action taken.
        action: ErrorAction,
        /// The error.
        error: String,
    },
    /// A `#[handles(many)]` message was handed to each of the instances
    /// sharing its value (each copy then has its own outcome).
    FannedOut {
        /// How many.
        instances: usize,
    },
    /// The message cannot be handled at all (malformed payload, no
    /// correlation id): parked on the dead-letter queue.
    DeadLettered {
        /// Why.
        reason: String,
    },
}

/// Audit entries kept per instance.
pub(crate) const AUDIT_MEMORY: usize = 64;

/// How many messages are held per correlation value at most (see
/// [`Unmatched`](crate::process::Unmatched)): fewer than the message ids
/// an instance remembers, so that a duplicate among those released
/// together is still recognised. One more is not held: its handler's
/// policy for a message without an instance applies at once.
pub const HOLD_CAP: usize = 100;

/// `(process, message type, payload) -> (key, key_field)`: how a message
/// published to a process manager will find its instance (see
/// [`routing_key`](super::routing_key)).
pub(crate) type RoutingKey<'a> =
    dyn Fn(&str, &str, &Value) -> (Option<String>, Option<String>) + Send + Sync + 'a;

/// `message type -> process managers` that handle it.
pub(crate) type Subscribers<'a> = dyn Fn(&str) -> Vec<&'static str> + Send + Sync + 'a;

/// What the machine is told instead of finding out: read by the worker
/// when it asks, so that a decision depends on nothing but its arguments.
pub(crate) struct Given<'a> {
    /// When the message's handling began (ms since the epoch; virtual time
    /// in the test kit): the delays a handler asks for run from it.
    pub now_ms: u64,
    /// The wall clock, for what records carry (audit entries, creation).
    pub at: Timestamp,
    /// The trace context the messages a handler emits carry.
    pub traceparent: Option<String>,
    /// Who receives what a handler publishes.
    pub subscribers: &'a Subscribers<'a>,
    /// How each of them will find its instance.
    pub routing_key: &'a RoutingKey<'a>,
    /// Whether a continuing message that matched no instance (once its
    /// hold is over) is parked rather than dropped, unless its handler
    /// says.
    pub dead_letter_unmatched: bool,
    /// How long a continuing message that matched no instance is held,
    /// unless its handler says.
    pub hold: Duration,
    /// How long a deleted instance's handled message ids are remembered.
    pub tombstone_ttl: Duration,
}

/// How a commit settles the message it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Settlement {
    /// Acknowledge it.
    Ack,
    /// Acknowledge it and park a copy on the dead-letter queue, with this
    /// reason.
    DeadLetter(String),
}

/// What a commit carries besides the instance and the settlement: the
/// parts the backend's write takes over as they are.
#[derive(Debug, Clone, Default)]
pub(crate) struct Effects {
    /// Delete the instance (and every correlation entry it owns).
    pub delete: bool,
    /// Correlation entries to claim...
    pub add_keys: Vec<(String, String)>,
    /// ... and to release.
    pub remove_keys: Vec<(String, String)>,
    /// Shared correlation entries (`#[handles(many)]`) to join...
    pub add_shared: Vec<(String, String)>,
    /// ... and to leave.
    pub remove_shared: Vec<(String, String)>,
    /// Envelopes for process managers, now.
    pub enqueue: Vec<Envelope>,
    /// Messages for endpoints: `(endpoint, encoded message)`.
    pub endpoints: Vec<(String, String)>,
    /// Envelopes for later: `(due ms, envelope)`.
    pub schedule: Vec<(u64, Envelope)>,
    /// Tallies to open.
    pub tallies: Vec<TallyOpen>,
}

/// A message kept until its instance exists (the backend's
/// [`Hold`](crate::backend::Hold), owned).
#[derive(Debug, Clone)]
pub(crate) struct Held {
    /// The state field it correlates by; `None`: by instance id.
    pub field: Option<String>,
    /// What it looks for.
    pub value: String,
    /// The message as kept (`hold_until` set).
    pub envelope: Envelope,
}

/// One atomic write, as decided: the worker turns it into a
/// [`ProcessCommit`](crate::backend::ProcessCommit).
#[derive(Debug, Clone)]
pub(crate) struct Commit {
    /// The instance to write (`version`: the one it was loaded with, 0 to
    /// create), unless `None`.
    pub instance: Option<ProcessInstance>,
    /// The id of the message whose handling this write saves (checked
    /// against tombstones: a late duplicate must not start the process
    /// again).
    pub handling: Option<String>,
    /// When deleting: how long the tombstone remembers what it handled.
    pub tombstone_ttl: Duration,
    /// Everything else it carries.
    pub effects: Effects,
    /// Keep the message until its instance exists.
    pub hold: Option<Held>,
    /// What becomes of the message.
    pub settle: Settlement,
}

impl Commit {
    /// A write that only settles the message.
    pub(crate) fn settle(settle: Settlement) -> Self {
        Commit {
            instance: None,
            handling: None,
            tombstone_ttl: Duration::ZERO,
            effects: Effects::default(),
            hold: None,
            settle,
        }
    }
}

/// A message's fate, decided without running its handler (or after it
/// failed): a commit to write, and the outcome once it is written.
#[derive(Debug, Clone)]
pub(crate) struct Decision {
    /// What to write.
    pub commit: Commit,
    /// What happened to the message, once written.
    pub outcome: Dispatched,
    /// What the worker logs about it.
    pub note: Option<Note>,
    /// A conflict on the write means the instance moved on: judge the
    /// message again on a fresh read (instead of handing it back, which
    /// costs a redelivery). Only for a decision that `#[on_error]` has not
    /// been asked about: asking again would count the failure twice.
    pub reread_on_conflict: bool,
    /// What to write instead when the store refuses this one in a way
    /// that settles the message without a read (a hold the store finds
    /// full, or a message a deleted instance handled).
    pub otherwise: Option<Box<Otherwise>>,
}

/// The decisions a hold falls back on.
#[derive(Debug, Clone)]
pub(crate) struct Otherwise {
    /// The store holds as many messages for the value as it may.
    pub full: Decision,
    /// A deleted instance handled this message: a late duplicate.
    pub tombstoned: Decision,
}

impl Decision {
    /// A decision that writes `commit` and reports `outcome`.
    fn new(commit: Commit, outcome: Dispatched) -> Self {
        Decision {
            commit,
            outcome,
            note: None,
            reread_on_conflict: false,
            otherwise: None,
        }
    }

    fn noted(self, note: Note) -> Self {
        Decision {
            note: Some(note),
            ..self
        }
    }

    /// Whether the store's `refusal` of the commit sends the message back
    /// to be judged again (else the worker hands it back for redelivery).
    pub(crate) fn rereads_after(&self, refusal: &Refusal) -> bool {
        self.reread_on_conflict && *refusal == Refusal::Conflict
    }

    /// What to write instead after the store's `refusal` of the commit,
    /// if anything: `None` hands the message back (or, see
    /// [`rereads_after`](Self::rereads_after), judges it again).
    pub(crate) fn instead(&self, refusal: &Refusal) -> Option<Decision> {
        let otherwise = self.otherwise.as_deref()?;
        match refusal {
            Refusal::HoldFull => Some(otherwise.full.clone()),
            Refusal::Tombstoned { .. } => Some(otherwise.tombstoned.clone()),
            _ => None,
        }
    }
}

/// What the worker logs about a decision: the log lines belong to the
/// worker (as the metrics do), the reasons for them to the decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Note {
    /// The message is parked: it can never be handled.
    DeadLettering {
        /// Why.
        reason: String,
    },
    /// A due tally report had nothing to report.
    NotReported {
        /// Why.
        reason: String,
    },
    /// A timeout (or a tally's message) for an earlier instance with the
    /// same id.
    EarlierGeneration {
        /// The instance.
        instance: String,
    },
    /// A timeout for an instance that no longer exists.
    InstanceGone {
        /// The instance.
        instance: String,
    },
    /// A continuing message that found no instance (after its hold).
    Unmatched {
        /// Its correlation value.
        correlation: String,
    },
    /// A continuing message that found no instance, held for it.
    Holding {
        /// Its correlation value.
        correlation: String,
    },
    /// A late duplicate of a message a deleted instance handled.
    DeletedDuplicate {
        /// The instance.
        instance: String,
    },
}

/// A failure `#[on_error]` is to decide about.
#[derive(Debug, Clone)]
pub(crate) struct Failing {
    /// The instance as it was before the failed handling, when there is
    /// one (a `Skip` or `Stop` writes it).
    pub instance: Option<ProcessInstance>,
    /// What went wrong.
    pub kind: FailureKind,
    /// The error's text.
    pub error: String,
}

/// Where a step of the machine that does not go on to the next ends.
#[derive(Debug, Clone)]
pub(crate) enum Verdict {
    /// Read the instance again and start over: what was read may be stale,
    /// or a write lost to another writer.
    Reread,
    /// Write this.
    Decided(Box<Decision>),
    /// Ask `#[on_error]`, then write what [`Handling::failed`] makes of
    /// its answer.
    Fail(Box<Failing>),
}

/// Why the store refused a commit (the refusals the protocol expects;
/// anything else is an error that hands the message back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Another write to the instance, or to a correlation entry it claims,
    /// came first.
    Conflict,
    /// A deleted instance (`instance`) handled one of the messages the
    /// write handles: a late duplicate.
    Tombstoned {
        /// The instance.
        instance: String,
    },
    /// A tally the handler opens is open already.
    TallyExists {
        /// The store's error, for `#[on_error]`.
        error: String,
    },
    /// A hold found as many messages held for the value as it may.
    HoldFull,
}

/// Parks a message that can never be handled.
pub(crate) fn dead_letter(reason: String) -> Decision {
    Decision::new(
        Commit::settle(Settlement::DeadLetter(reason.clone())),
        Dispatched::DeadLettered {
            reason: reason.clone(),
        },
    )
    .noted(Note::DeadLettering { reason })
}

/// A due tally report that has nothing to report (the tally is gone, or
/// its deadline came after it completed): acknowledged, not delivered.
pub(crate) fn unreported(reason: String) -> Decision {
    Decision::new(
        Commit::settle(Settlement::Ack),
        Dispatched::Ignored {
            reason: reason.clone(),
        },
    )
    .noted(Note::NotReported { reason })
}

fn decided(decision: Decision) -> Verdict {
    Verdict::Decided(Box::new(decision))
}

fn fail(instance: Option<ProcessInstance>, kind: FailureKind, error: String) -> Verdict {
    Verdict::Fail(Box::new(Failing {
        instance,
        kind,
        error,
    }))
}

/// Acknowledged and ignored: nothing written.
fn ignored(reason: String) -> Decision {
    Decision::new(
        Commit::settle(Settlement::Ack),
        Dispatched::Ignored { reason },
    )
}

/// When something `delay` from `now_ms` is due, saturating rather than
/// overflowing for absurd delays.
pub(crate) fn due(now_ms: u64, delay: Duration) -> u64 {
    now_ms.saturating_add(delay.as_millis().min(u64::MAX as u128) as u64)
}

/// The id of a message a handler emits: derived from the message being
/// handled, so a handler re-run after a write conflict (or a redelivery)
/// emits the same ids, and receivers can drop the duplicates.
pub(crate) fn derived_id(parent: &str, instance: &str, n: &str) -> String {
    let name = format!("{parent}/{instance}/{n}");
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string()
}

/// The envelope of a message a handler sends (see [`crate::endpoint`]).
pub(crate) fn sent(
    message_id: String,
    from: &str,
    instance: &str,
    out: &Outgoing,
    now_ms: u64,
) -> String {
    EndpointMessage {
        v: ENVELOPE_VERSION,
        message_id,
        message_type: out.message_type.clone(),
        from: from.to_owned(),
        correlation_id: out.correlation_id.clone(),
        headers: [("instance".to_owned(), instance.to_owned())].into(),
        sent_at: now_ms,
        payload: out.payload.clone(),
        deliveries: 0,
    }
    .encode()
}

/// Records what happened to `instance` in its bounded audit log.
pub(crate) fn audit(
    instance: &mut ProcessInstance,
    envelope: &Envelope,
    action: ProcessAuditAction,
    at: Timestamp,
) {
    instance.audit_log.push(ProcessAudit {
        at,
        message_type: envelope.message_type.clone(),
        message_id: envelope.message_id.clone(),
        action,
    });
    let excess = instance.audit_log.len().saturating_sub(AUDIT_MEMORY);
    instance.audit_log.drain(..excess);
}

#[cfg(test)]
mod tests;
