//! Handler errors, and what `#[on_error]` decides about them.

use std::fmt;
use std::time::Duration;

use crate::error::BoxError;

/// Why a handler failed. `?` converts any `std::error::Error`.
pub struct ProcessError {
    source: BoxError,
    invalid_payload: bool,
}

impl ProcessError {
    /// An error from a message (or anything `Into<BoxError>`).
    pub fn new(error: impl Into<BoxError>) -> Self {
        ProcessError {
            source: error.into(),
            invalid_payload: false,
        }
    }

    pub(crate) fn invalid_payload(error: impl Into<BoxError>) -> Self {
        ProcessError {
            source: error.into(),
            invalid_payload: true,
        }
    }

    /// Whether a payload (message or stored state) did not deserialize: such
    /// a message is dead-lettered without consulting `#[on_error]`.
    pub fn is_invalid_payload(&self) -> bool {
        self.invalid_payload
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for ProcessError {
    fn from(error: E) -> Self {
        ProcessError::new(error)
    }
}

impl fmt::Display for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl fmt::Debug for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.source, f)
    }
}

/// What went wrong, for [`Failure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureKind {
    /// The handler returned `Err`.
    Handler,
    /// `#[starts(strict)]` found an existing instance.
    AlreadyStarted,
    /// `#[handles(strict)]` found no instance.
    NotStarted,
    /// The message's correlation value is shared by several instances and
    /// its handler is not `#[handles(many)]`: which one is meant cannot be
    /// told.
    Ambiguous,
}

/// What `#[on_error]` receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What went wrong.
    pub kind: FailureKind,
    /// The error's text.
    pub error: String,
    /// `Message::TYPE` of the failing message.
    pub message_type: String,
    /// The message's id.
    pub message_id: String,
    /// The instance, when it is known.
    pub instance_id: Option<String>,
    /// Failures of this message so far, this one included (1 the first time).
    pub failures: u32,
}

/// What to do with a failed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorAction {
    /// Deliver it again at once.
    Retry,
    /// Deliver it again after a delay. The message is scheduled (like a
    /// timeout), so the worker moves on to other messages meanwhile.
    RetryAfter(Duration),
    /// Drop it, with an audit entry on the instance (and a log line).
    Skip,
    /// Stop the instance (it ignores further messages, with audit entries)
    /// and dead-letter the message, so nothing is lost.
    Stop,
}

impl ErrorAction {
    /// The policy without `#[on_error]`: retry after 100 ms, then 200 ms;
    /// on the third failure, stop. Strict-routing violations stop at once
    /// (retrying cannot change whether an instance exists... usually; say
    /// `Retry` in `#[on_error]` to wait for an out-of-order start).
    pub fn default_for(failure: &Failure) -> ErrorAction {
        match failure.kind {
            FailureKind::Handler if failure.failures < 3 => {
                ErrorAction::RetryAfter(Duration::from_millis(100) * 2u32.pow(failure.failures - 1))
            }
            _ => ErrorAction::Stop,
        }
    }
}
