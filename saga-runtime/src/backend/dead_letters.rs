//! Dead letters: messages parked for an operator.

use serde::{Deserialize, Serialize};

use crate::model::task::{TaskId, Timestamp};

/// A message parked for manual inspection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Id to requeue or inspect it by.
    pub id: String,
    /// The raw payload as it was received, cut to the backend's size limit
    /// (see `truncated`).
    pub payload: String,
    /// Why it was parked.
    pub reason: String,
    /// The task it concerns, when the payload named one.
    pub task_id: Option<TaskId>,
    /// When it was parked.
    pub at: Timestamp,
    /// The payload's size in bytes before it was cut, when it was: a huge
    /// garbage message keeps only a prefix, and cannot be requeued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<usize>,
}

/// One page of dead letters, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterQuery {
    /// Only entries after (older than) this one.
    pub after: Option<String>,
    /// At most this many.
    pub limit: usize,
}
