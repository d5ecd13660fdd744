//! A process-manager instance as it is stored: its state, status, version,
//! correlation entries and audit log.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::task::Timestamp;

/// What happened to a process-manager instance, in its audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum ProcessAuditAction {
    /// The handler ran and its result was saved.
    Handled,
    /// The instance was completed by this message.
    Completed,
    /// The message arrived after completion (or stop) and was ignored.
    Ignored {
        /// Why.
        reason: String,
    },
    /// `#[on_error]` said `Skip`.
    Skipped {
        /// The handler's error.
        error: String,
    },
    /// `#[on_error]` said `Stop` (or the default policy gave up).
    Stopped {
        /// The handler's error.
        error: String,
    },
}

/// One line of an instance's audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessAudit {
    /// When.
    pub at: Timestamp,
    /// The message's type.
    pub message_type: String,
    /// The message's id.
    pub message_id: String,
    /// What happened.
    #[serde(flatten)]
    pub action: ProcessAuditAction,
}

/// Where an instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InstanceStatus {
    /// Handling messages.
    Active,
    /// `ctx.mark_complete()`: later messages are ignored.
    Completed,
    /// Stopped by `#[on_error]`: later messages are ignored.
    Stopped,
}

/// A stored process-manager instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessInstance {
    /// The process manager's name.
    pub process: String,
    /// The instance's id (its correlation id when a correlation-id message
    /// created it, else a UUID).
    pub id: String,
    /// Unique per creation: an instance deleted and created again under the
    /// same id has another one, and the timeouts its predecessor requested
    /// (which carry the predecessor's) are ignored. Empty in records
    /// written before generations existed.
    #[serde(default)]
    pub generation: String,
    /// The id of the message that created it: kept in its tombstone even
    /// once `processed` has forgotten it, so that a late duplicate of it
    /// never starts the process again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_by: Option<String>,
    /// The state, as JSON.
    pub state: Value,
    /// Active, completed or stopped.
    pub status: InstanceStatus,
    /// Incremented by every write; writes compare it (0: not stored yet).
    pub version: u64,
    /// The correlation entries it owns: `(state field, value)`.
    pub keys: Vec<(String, String)>,
    /// Ids of the most recent messages it handled, to drop exact duplicates.
    pub processed: Vec<String>,
    /// The most recent events (bounded).
    pub audit_log: Vec<ProcessAudit>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it was last written.
    pub updated_at: Timestamp,
}

impl ProcessInstance {
    /// What a tombstone of this instance remembers: the message ids it
    /// handled, and the one that created it.
    pub fn handled(&self) -> Vec<String> {
        let mut ids = self.processed.clone();
        if let Some(first) = &self.started_by {
            if !ids.contains(first) {
                ids.push(first.clone());
            }
        }
        ids
    }
}
