//! Errors that cross the boundary between user code and the engine.

use std::error::Error as StdError;
use std::fmt;

/// A boxed error, as returned by user code.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why a step (or a compensation) failed.
///
/// `?` on any `std::error::Error + Send + Sync + 'static` converts into a
/// *transient* error (retried under the step's policy). Say
/// [`StepError::permanent`] when retrying cannot help: the remaining retries are
/// skipped and the step's `on_exhausted` action runs at once.
///
/// Like `anyhow::Error`, `StepError` deliberately does not implement
/// `std::error::Error` itself: that is what lets the blanket `From` exist.
pub struct StepError {
    kind: StepErrorKind,
    source: BoxError,
}

/// The retry class of a [`StepError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepErrorKind {
    /// Worth retrying.
    Transient,
    /// Not worth retrying.
    Permanent,
    /// A persisted payload did not deserialize into the step's type. Raised by
    /// the engine, never by user code; the task is dead-lettered.
    InvalidPayload,
}

impl StepError {
    /// An error worth retrying (a timeout, a 503, a dropped connection).
    pub fn transient(error: impl Into<BoxError>) -> Self {
        StepError {
            kind: StepErrorKind::Transient,
            source: error.into(),
        }
    }

    /// An error that retrying cannot fix (a 400, a declined card).
    pub fn permanent(error: impl Into<BoxError>) -> Self {
        StepError {
            kind: StepErrorKind::Permanent,
            source: error.into(),
        }
    }

    pub(crate) fn invalid_payload(error: impl Into<BoxError>) -> Self {
        StepError {
            kind: StepErrorKind::InvalidPayload,
            source: error.into(),
        }
    }

    /// The retry class.
    pub fn kind(&self) -> StepErrorKind {
        self.kind
    }

    /// Whether the engine may retry it.
    pub fn is_transient(&self) -> bool {
        self.kind == StepErrorKind::Transient
    }

    /// The underlying error.
    pub fn source_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.source
    }

    /// Consumes the error, returning the underlying one.
    pub fn into_source(self) -> BoxError {
        self.source
    }
}

impl<E> From<E> for StepError
where
    E: StdError + Send + Sync + 'static,
{
    fn from(error: E) -> Self {
        StepError::transient(error)
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)?;
        let mut source = self.source.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl fmt::Debug for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepError")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .finish()
    }
}

/// Errors of the engine and its backends.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `start`/`cancel` named a saga the engine was not built with (or,
    /// for a cancellation, the task is older than the record of whether it
    /// may be cancelled, which only the saga's own deployment knows).
    #[error(
        "saga `{0}` is not registered with this engine: add it with `Engine::builder().saga(..)`, \
         or act on its tasks through the deployment that runs it (its HTTP API or console)"
    )]
    UnknownSaga(String),
    /// An operator call named a process manager the engine was not built
    /// with.
    #[error(
        "process manager `{0}` is not registered with this engine; add it with \
         `Engine::builder().process_manager(..)`"
    )]
    UnknownProcess(String),
    /// A message was published by its type's name, and no registered
    /// process manager handles that type.
    #[error(
        "no process manager of this engine handles messages of type `{0}` (a type is its \
         `Message::TYPE`: the Rust type's name, or `#[message(name = ..)]`)"
    )]
    UnknownMessageType(String),
    /// Two sagas registered under one name and version.
    #[error(
        "two sagas are registered under the name `{0}` with the same version; give one of them \
         `#[saga(name = \"..\")]`, or, if it is a new definition of the same saga, \
         `#[saga(version = ..)]`"
    )]
    DuplicateSaga(String),
    /// Two versions of one saga with the same steps.
    #[error(
        "versions {} and {} of saga `{saga}` have the same steps (the same fingerprint): \
         register one of them, or change the steps of the new version",
        versions.0, versions.1
    )]
    SameSagaDefinition {
        /// The saga.
        saga: &'static str,
        /// The two versions.
        versions: (u32, u32),
    },
    /// `start` named a version of a saga the engine was not built with.
    #[error(
        "version {version} of saga `{saga}` is not registered with this engine (it has versions \
         {registered:?}); add it with `Engine::builder().saga(..)`"
    )]
    UnknownSagaVersion {
        /// The saga.
        saga: &'static str,
        /// The version asked for.
        version: u32,
        /// The versions the engine has.
        registered: Vec<u32>,
    },
    /// Two handlers of one process manager take message types with the same
    /// wire name (`Message::TYPE`), so messages could not be routed.
    #[error("process manager `{process}` has two handlers for message type `{message_type}`; give one of the types `#[message(name = \"..\")]`")]
    DuplicateMessageType {
        /// The process manager.
        process: String,
        /// The wire name.
        message_type: String,
    },
    /// A tally that was never opened, or has expired.
    #[error("{0} does not exist (never opened, or expired: see `OpenTally::keep_for`)")]
    TallyNotFound(crate::model::tally::TallyRef),
    /// An item the tally was not opened with.
    #[error("{tally} has no item `{item}`")]
    UnknownTallyItem {
        /// The tally.
        tally: crate::model::tally::TallyRef,
        /// The item checked.
        item: String,
    },
    /// A task id that the store does not know.
    #[error("task {0} does not exist")]
    TaskNotFound(crate::model::task::TaskId),
    /// A task exists but belongs to another saga than the one named.
    #[error("task {task} belongs to saga `{actual}`, not `{expected}`")]
    WrongSaga {
        /// The task.
        task: crate::model::task::TaskId,
        /// The saga the caller named.
        expected: String,
        /// The saga the task belongs to.
        actual: String,
    },
    /// A task's input that does not serialize (a map with non-string keys,
    /// a `Serialize` impl that fails).
    #[error("the input of saga `{saga}` cannot be stored: {reason}")]
    InvalidInput {
        /// The saga.
        saga: &'static str,
        /// What serde said.
        reason: String,
    },
    /// A completed task's recorded output that does not decode as the
    /// saga's `Output` (written by another version of the saga).
    #[error("the recorded output of saga `{saga}` does not decode: {reason}")]
    InvalidOutput {
        /// The saga.
        saga: &'static str,
        /// What serde said.
        reason: String,
    },
    /// A process-manager instance's stored state that does not decode as
    /// the process manager's `State` (written by another version of it).
    #[error("the stored state of process manager `{process}` does not decode: {reason}")]
    InvalidState {
        /// The process manager.
        process: &'static str,
        /// What serde said.
        reason: String,
    },
    /// The task ended without completing (failed, compensated, cancelled,
    /// or parked for an operator), so it has no output.
    #[error("task {id} ended `{status}` without completing{}", reason(.error))]
    TaskDidNotComplete {
        /// The task.
        id: crate::model::task::TaskId,
        /// How it ended.
        status: crate::model::task::TaskStatus,
        /// Why, as recorded on the task (or on the step it stopped at);
        /// `None` when nothing was recorded, as for a task cancelled
        /// between steps. The task's audit log has the whole story.
        error: Option<String>,
    },
    /// Serializing an input, or deserializing a stored value, failed.
    #[error("serialization: {0}")]
    Serialization(#[from] serde_json::Error),
    /// A dead letter id that does not exist (or was already requeued).
    #[error("dead letter {0} does not exist")]
    DeadLetterNotFound(String),

    /// The operator action does not apply to the task's status (resolve:
    /// `CompensationFailed` or `DeadLettered`; a compensation retry:
    /// `CompensationFailed`).
    #[error("task {id} is `{status}`: operator actions apply to tasks that ended `CompensationFailed` (resolve, retry the compensation) or `DeadLettered` (resolve, requeue)")]
    NotResolvable {
        /// The task.
        id: crate::model::task::TaskId,
        /// Its status.
        status: crate::model::task::TaskStatus,
    },

    /// The dead letter's task was resolved by hand: requeueing it would run
    /// what the operator settled.
    #[error("task {0} of this dead letter was resolved by hand: it is not requeued")]
    ResolvedTask(crate::model::task::TaskId),
    /// The dead letter's task no longer exists (it expired after its
    /// retention, or never existed): requeued, the message would only be
    /// dead-lettered again.
    #[error("task {0} of this dead letter no longer exists (its retention ran out): requeueing would only dead-letter it again; discard the letter")]
    TaskGone(crate::model::task::TaskId),
    /// An operator's change to a task was not written: another write came
    /// first (the task moved on meanwhile) or its lease was taken over.
    /// Nothing changed; read the task again and decide.
    #[error("task {task}: the change was not written ({reason}); read the task again")]
    WriteRefused {
        /// The task.
        task: crate::model::task::TaskId,
        /// Why the store refused it.
        reason: crate::backend::TaskRefusal,
    },
    /// A dead letter kept only a prefix of its (huge) payload, so it cannot
    /// be put back on the queue.
    #[error(
        "dead letter {id} kept only a prefix of its {size}-byte payload; it cannot be requeued"
    )]
    DeadLetterTruncated {
        /// The dead letter.
        id: String,
        /// The payload's original size in bytes.
        size: usize,
    },
    /// `start_with_key` was called again with a key that already started a
    /// task, but with a different input.
    #[error("key `{key}` already started task {task} with a different input; use a new key for a new task")]
    KeyReused {
        /// The key.
        key: String,
        /// The task it started.
        task: crate::model::task::TaskId,
    },
    /// A page cursor that no listing returned.
    #[error("{0}")]
    InvalidCursor(String),
    /// The engine was built with settings that cannot work.
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// `metrics::install` could not install its recorder: another global
    /// `metrics` recorder is installed already.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    #[error("installing the Prometheus metrics recorder failed: {0}")]
    MetricsRecorder(String),
    /// The backend stayed unreachable through every retry of the client
    /// retry policy (`EngineBuilder::client_retry`).
    #[error("`{operation}` failed after {attempts} attempts: {source}")]
    Unavailable {
        /// The engine call.
        operation: &'static str,
        /// How many times it was tried.
        attempts: u32,
        /// The last failure.
        #[source]
        source: crate::backend::BackendError,
    },
    /// The storage backend failed.
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
}

/// The tail of [`Error::TaskDidNotComplete`]'s message.
fn reason(error: &Option<String>) -> String {
    error
        .as_deref()
        .map(|e| format!(": {e}"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn question_mark_is_transient_and_constructors_set_the_kind() {
        fn io() -> Result<(), StepError> {
            Err(std::io::Error::other("disk"))?;
            Ok(())
        }
        let e = io().unwrap_err();
        assert!(e.is_transient());
        assert_eq!(e.to_string(), "disk");
        assert_eq!(
            StepError::permanent("declined").kind(),
            StepErrorKind::Permanent
        );
        assert_eq!(StepError::transient("503").kind(), StepErrorKind::Transient);
    }
}
