//! What a backend reports when it fails.
//!
//! Only failures: what the protocol expects a write to answer (a lost
//! lease, a version conflict, a recorded cancellation, a tombstone) is a
//! value of the write's own result ([`TaskRefusal`](super::TaskRefusal),
//! [`ProcessRefusal`](super::ProcessRefusal)), so a caller branches on
//! outcomes without matching errors.

use std::sync::Arc;

/// The error type of backend failures that come from below (a dropped
/// connection, a refused command): kept as the source of
/// [`BackendError::Unavailable`] and [`BackendError::Rejected`].
pub type SourceError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A backend failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
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

/// What kind of failure a [`BackendError`] is, for a caller that decides
/// by kind (retry, report, stop) without matching every variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// Unreachable or failing for now: the same call may succeed later.
    Unavailable,
    /// Refused for good: trying again will not help.
    Rejected,
    /// A stored value does not read.
    Corrupt,
    /// The caller passed something this backend did not hand out.
    InvalidInput,
    /// The configuration contradicts the stored data.
    Misconfigured,
}

impl BackendError {
    /// [`BackendError::Unavailable`] from any error or message.
    pub fn unavailable(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        BackendError::Unavailable(Arc::from(error.into()))
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> BackendErrorKind {
        match self {
            BackendError::Corrupt(_) => BackendErrorKind::Corrupt,
            BackendError::InvalidCursor(_) => BackendErrorKind::InvalidInput,
            BackendError::Unavailable(_) => BackendErrorKind::Unavailable,
            BackendError::Rejected(_) => BackendErrorKind::Rejected,
            BackendError::Misconfigured(_) => BackendErrorKind::Misconfigured,
        }
    }

    /// Whether retrying the same call may succeed (the backend was
    /// unreachable), as opposed to a refusal that will not change.
    pub fn is_transient(&self) -> bool {
        self.kind() == BackendErrorKind::Unavailable
    }
}
