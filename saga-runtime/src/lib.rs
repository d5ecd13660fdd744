//! Compile-time-checked sagas for Rust.
//!
//! Write the steps and their compensations as methods of an `impl` block,
//! annotate it with [`#[saga]`](macro@saga), and the macro generates the
//! orchestration: retry/backoff policies, circuit breakers, idempotency guards,
//! cancellation, compensation with its own retries, escalation when a
//! compensation fails, and a reconciliation base trait. Misconfigurations are
//! compile errors.
//!
//! Users depend on this crate alone; `use saga_runtime::prelude::*;` brings in
//! the attributes and the types a saga's methods mention.
#![warn(missing_docs)]

pub mod backend;
pub mod circuit;
pub mod context;
pub mod engine;
pub mod error;
#[cfg(feature = "http")]
pub mod http;
pub mod policy;
pub mod process;
pub mod reconcile;
mod runtime;
pub mod saga;
pub mod task;
pub mod testing;
mod worker;

pub use saga_macros::{
    cancellable, circuit_breaker, compensate, compensation_retry_policy, correlate, handles,
    on_error, process_manager, retry_policy, saga, saga_step, starts, timeout, Message,
};

pub use context::StepContext;
pub use engine::{
    shutdown_signal, CancelResult, DeadLetter, DeadLetterFilter, DeadLetterPage, Engine,
    EngineBuilder, TaskFilter, TaskPage,
};
pub use error::{BoxError, Error, StepError, StepErrorKind};
pub use runtime::{DEFAULT_ATTENTION_RETENTION, DEFAULT_RETENTION};
pub use saga::{Cancellable, Saga};
pub use task::{AuditAction, AuditEntry, StepRecord, StepStatus, TaskId, TaskInstance, TaskStatus};

/// Everything a saga definition and its caller need.
pub mod prelude {
    pub use crate::context::StepContext;
    pub use crate::engine::{CancelResult, Engine};
    pub use crate::error::{StepError, StepErrorKind};
    pub use crate::process::{
        ErrorAction, Failure, FailureKind, Message, ProcessContext, ProcessError, ProcessManager,
    };
    pub use crate::reconcile::{ReconcileError, ReconcileReport};
    pub use crate::saga::{Cancellable, Saga};
    pub use crate::task::{StepStatus, TaskId, TaskInstance, TaskStatus};
    pub use saga_macros::{
        cancellable, circuit_breaker, compensate, compensation_retry_policy, correlate, handles,
        on_error, process_manager, retry_policy, saga, saga_step, starts, timeout, Message,
    };
}

/// What generated code reaches through absolute paths
/// (`::saga_runtime::__private::..`). Not a public API: it changes without
/// notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::circuit::CircuitBreakerConfig;
    pub use crate::context::StepContext;
    pub use crate::engine::Engine;
    pub use crate::error::StepError;
    pub use crate::policy::{BackoffKind, OnExhausted, RetryPolicy};
    pub use crate::process::{
        correlation_value, decode_message, unknown_message, Concurrency, Correlation, ErrorAction,
        Failure, HandlerDefinition, HandlerKind, HasCorrelationId, Message, OnComplete,
        ProcessContext, ProcessDefinition, ProcessError, ProcessManager, ProcessState,
    };
    pub use crate::reconcile::{self, ReconcileError, ReconcileReport};
    pub use crate::saga::{
        decode, encode, unknown_step, BoxFuture, Cancellable, Codec, CompensationDefinition,
        NotPersistable, Persist, Saga, SagaDefinition, SagaInput, StepDefinition, StepOutput,
        TakesOutputOf, UndoesOutputOf,
    };
    pub use async_trait::async_trait;
    pub use serde::{de::DeserializeOwned, Serialize};
    pub use serde_json::Value;
    pub use tokio_util::sync::CancellationToken;
}
