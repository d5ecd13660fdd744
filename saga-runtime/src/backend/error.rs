//! What a backend reports when it fails.

use std::sync::Arc;

use crate::model::tally::TallyRef;
use crate::model::task::{TaskId, Timestamp};

/// The error type of backend failures that come from below (a dropped
/// connection, a refused command): kept as the source of
/// [`BackendError::Unavailable`].
pub type SourceError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A backend failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The instance would be created by a message a deleted instance with
    /// its id or correlation already handled: a late duplicate.
    #[error("process `{process}`: instance `{instance}` was deleted after handling this message")]
    ProcessTombstoned {
        /// The process manager.
        process: String,
        /// The instance.
        instance: String,
    },
    /// A handler opened a tally its instance had opened before.
    #[error("{0} is already open: give each tally of an instance its own name")]
    TallyExists(TallyRef),
    /// The stored version is not the one the write was based on.
    #[error("task {task}: version conflict (expected {expected}, found {actual})")]
    Conflict {
        /// The task.
        task: TaskId,
        /// The version the write was based on.
        expected: u64,
        /// The stored version.
        actual: u64,
    },
    /// The lease is no longer the latest for the task: another worker took
    /// the lock after it expired. The write was refused.
    #[error("task {task}: lock lost (fencing token {fence} is stale)")]
    LockLost {
        /// The task.
        task: TaskId,
        /// The stale fencing token.
        fence: u64,
    },
    /// The task does not exist.
    #[error("task {0} does not exist")]
    NotFound(TaskId),
    /// A commit with `unless_cancelled` found a cancellation request.
    #[error("task {task}: cancellation was requested")]
    CancelRequested {
        /// The task.
        task: TaskId,
        /// When cancellation was requested.
        at: Timestamp,
    },
    /// Another write to the process-manager instance (or to one of the
    /// correlation entries it claims) came first.
    #[error("process `{process}` instance `{instance}`: a concurrent write came first")]
    ProcessConflict {
        /// The process manager.
        process: String,
        /// The instance.
        instance: String,
    },
    /// The message a process-manager write settles is in another partition
    /// than the instance it writes (a backend that keeps partitions apart,
    /// like Redis Cluster, cannot write both at once): the worker hands it
    /// back, and forwards it to the instance's partition on its next
    /// delivery.
    #[error("process `{process}` instance `{instance}`: the message is in another partition than the instance")]
    ProcessElsewhere {
        /// The process manager.
        process: String,
        /// The instance.
        instance: String,
    },
    /// A stored value could not be read.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// A listing's cursor that this backend did not hand out.
    #[error("`{0}` is not a cursor of this listing")]
    InvalidCursor(String),
    /// The backend could not be reached or failed. Transient: the same call
    /// may succeed later.
    #[error("backend unavailable: {0}")]
    Unavailable(#[source] SourceError),
    /// The backend refused the operation (a script error, a bad argument):
    /// trying again will not help.
    #[error("backend refused the operation: {0}")]
    Rejected(#[source] SourceError),
    /// The backend's configuration contradicts the data it finds (for
    /// example another partition count than the deployment was created
    /// with). The message says what to change.
    #[error("backend misconfigured: {0}")]
    Misconfigured(String),
}

impl BackendError {
    /// [`BackendError::Unavailable`] from any error or message.
    pub fn unavailable(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        BackendError::Unavailable(Arc::from(error.into()))
    }

    /// Whether retrying the same call may succeed (the backend was
    /// unreachable), as opposed to a refusal that will not change.
    pub fn is_transient(&self) -> bool {
        matches!(self, BackendError::Unavailable(_))
    }
}
