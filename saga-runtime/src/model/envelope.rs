//! The wire format of process-manager messages.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why an envelope is on the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvelopeKind {
    /// A message to correlate (published, or sent to a process manager).
    Message,
    /// A timeout for one instance.
    Timeout,
    /// A tally's report for the instance that opened it (its deadline, or
    /// a poll): the worker fills in the [`TallyStatus`](super::tally::TallyStatus)
    /// when it is due.
    TallyReport,
}

/// One message for one process manager.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Unique per message (duplicates of it share it).
    pub message_id: String,
    /// The process manager it is for.
    pub process: String,
    /// `Message::TYPE`.
    pub message_type: String,
    /// The message as JSON.
    pub payload: Value,
    /// Message or timeout.
    pub kind: EnvelopeKind,
    /// For timeouts: the instance that asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// For timeouts: that instance's generation
    /// ([`ProcessInstance::generation`](crate::backend::ProcessInstance::generation)),
    /// so that a timeout never reaches a later instance with the same id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<String>,
    /// Failures so far (business retries via `#[on_error]`).
    #[serde(default)]
    pub failures: u32,
    /// The correlation value the process manager finds its instance by,
    /// as the sender computed it: lets a backend load the instance in the
    /// read that delivers the message. Absent for timeouts (they name
    /// their instance) and for messages whose value could not be computed;
    /// the worker computes it again and uses the load only if they agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The state property `key` is a value of (`#[correlate(..)]`);
    /// absent when `key` is the instance id (the correlation id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_field: Option<String>,
    /// The W3C `traceparent` of the span that sent it (feature `otel`):
    /// the handling continues that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// For timeouts: when it was due (ms since the epoch), to tell how
    /// late it was handled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_ms: Option<u64>,
    /// How many times it moved to another partition before it was handled
    /// (a backend whose partitions are apart handles a message where its
    /// instance's keys are: see `Partitions::forward`). Moves are free up to
    /// a bound; past it each counts as an unanswered delivery, so that a
    /// message that moves for ever still reaches the delivery cap.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hops: u32,
    /// A continuing message that found no instance is held until one
    /// starts (see [`ProcessCommit::hold`](crate::backend::ProcessCommit::hold)),
    /// at most until this time (ms since the epoch): set when it is first
    /// held and kept from then on, so that a message held again (its
    /// instance was deleted before it was handled) does not wait longer
    /// than its handler allows. Past it, the handler's policy for a
    /// message without an instance applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_until: Option<u64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
