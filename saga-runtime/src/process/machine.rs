//! The process-manager protocol's pure parts: what a handler's run turns
//! into, with no I/O (the worker loads, runs the handler and writes).

use super::context::Outgoing;
use super::error::ErrorAction;
use crate::model::endpoint::{EndpointMessage, ENVELOPE_VERSION};
use crate::model::envelope::Envelope;
use crate::model::process::{ProcessAudit, ProcessAuditAction, ProcessInstance};
use crate::model::task::Timestamp;

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
    /// A continuing message found no instance: logged, counted and, if
    /// configured, dead-lettered.
    Unmatched {
        /// The correlation value that matched nothing.
        key: String,
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

/// When something `delay` from `now_ms` is due, saturating rather than
/// overflowing for absurd delays.
pub(crate) fn due(now_ms: u64, delay: std::time::Duration) -> u64 {
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
) {
    instance.audit_log.push(ProcessAudit {
        at: Timestamp::now(),
        message_type: envelope.message_type.clone(),
        message_id: envelope.message_id.clone(),
        action,
    });
    let excess = instance.audit_log.len().saturating_sub(AUDIT_MEMORY);
    instance.audit_log.drain(..excess);
}
