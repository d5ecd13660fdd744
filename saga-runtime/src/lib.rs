//! Compile-time-checked sagas and process managers for Rust.
//!
//! A workflow that spans several services must survive crashes, retries and
//! duplicate messages. With this crate you write only the business logic,
//! as methods of an `impl` block, and attribute macros generate the rest at
//! compile time: the orchestrator, retry/backoff policies, circuit breakers,
//! idempotency guards, a lease per task, cancellation, compensation with its
//! own retries and a terminal escalation when it fails, and a
//! reconciliation base trait. Misconfigurations are compile errors on the
//! offending token.
//!
//! Two shapes of workflow share one runtime:
//!
//! - **Step sagas** ([`#[saga]`](macro@saga)): a fixed chain of steps, each
//!   taking the previous one's output; on failure the completed steps are
//!   compensated in reverse order.
//! - **Process managers** ([`#[process_manager]`](macro@process_manager)):
//!   state correlated to messages that arrive in any order, with durable
//!   timeouts ([`process`]).
//!
//! ```
//! use saga_runtime::prelude::*;
//!
//! pub struct Greet;
//!
//! #[saga(name = "greet")]
//! impl Greet {
//!     #[saga_step(1)]
//!     #[retry_policy(max_retries = 3)] // exponential from 1 s
//!     async fn shout(&self, name: String) -> Result<String, StepError> {
//!         Ok(name.to_uppercase())
//!     }
//!
//!     #[saga_step(2)]
//!     async fn greet(&self, name: String) -> Result<String, StepError> {
//!         Ok(format!("hello, {name}"))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), saga_runtime::Error> {
//! let engine = Engine::builder().saga(Greet).build().await?; // in-memory backend
//! let id = engine.start::<Greet>("ada".to_owned()).await?;
//! assert_eq!(engine.wait_output::<Greet>(id).await?, "hello, ADA");
//! engine.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! Where to look:
//!
//! - [`engine`]: [`Engine`] (start, wait, cancel, list, dead letters,
//!   workers and shutdown) and its [`EngineBuilder`];
//! - [`saga`](mod@saga): what `#[saga]` generates ([`Saga`], [`saga::SagaDefinition`],
//!   versions); [`policy`] and [`circuit`]: retries and breakers;
//!   [`limit`](mod@limit): flow control (`#[limit]`);
//! - [`model`]: the plain records every layer passes around; [`task`] is
//!   the persisted task ([`TaskInstance`], statuses, audit log);
//! - [`backend`]: the storage seam (the core a saga-only backend
//!   implements, what process managers need, optional coordination), the
//!   in-memory backend, `backend::postgres` (feature `postgres`: tasks
//!   started in your own transaction, `Engine::start_in`) and
//!   `backend::redis` (feature `redis`: one server, Sentinel or Cluster);
//!   [`backend::connect`] takes either's URL;
//! - [`process`]: process managers, with [`process::tally`] for fan-in;
//!   [`endpoint`]: the messages they send to other services, and
//!   [`Engine::consumer`] to receive them; [`testing`]: `ProcessTest`,
//!   `FaultKit` (your saga under seeded crashes, duplicates and
//!   cancellations) and, with the `conformance` feature, the backend
//!   conformance suite;
//! - [`transport`]: brokers (features `rabbitmq`, `nats`): process
//!   managers fed by other services, sagas started by commands on a queue,
//!   endpoints relayed with the broker's confirmation;
//! - `http` (feature `http`): axum routes to inspect and cancel tasks;
//! - `metrics` (feature `metrics`): Prometheus metrics, and with `http` the
//!   `GET /metrics` route.
//!
//! The modules stand on floors, and each refers only to those below it, so
//! that each can be read and changed knowing what it may touch (the
//! repository's `testsuite/tests/architecture.rs` keeps it so). Lowest first: `model`
//! (the persisted records); `util`, `name`, `policy`, `context`, `otel` and
//! `circuit`; `limit`; `backend` (storage); `error`; the state machines `saga` and
//! `process`; `transport` (brokers); `metrics`; `worker` (what runs them); `engine`; then
//! `endpoint`, `reconcile`, `http` and `testing` on top. Data flows down the
//! same way: the engine hands work to a worker; the worker drives a pure
//! state machine, which decides what to write and calls nothing; the worker
//! hands that write to the backend, which checks and applies it; the
//! backend stores plain `model` records.
//!
//! Users depend on this crate (it re-exports the macros), on `serde` (step
//! types derive `Serialize`/`Deserialize`) and on `tokio`;
//! `use saga_runtime::prelude::*;` brings in the attributes and the types a
//! saga's methods mention. The repository's guide (`guide/`) covers each
//! store, brokers, operating a deployment, testing under faults, and the
//! guarantees with their limits.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

pub mod backend;
pub mod circuit;
pub mod context;
pub mod endpoint;
pub mod engine;
pub mod error;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
pub mod limit;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics;
pub mod model;
mod name;
pub mod otel;
pub mod policy;
pub mod process;
pub mod reconcile;
pub mod saga;
pub use model::task;
pub mod testing;
pub mod transport;
mod util;
mod worker;

pub use saga_macros::{
    cancellable, circuit_breaker, compensate, compensation_retry_policy, correlate, handles, limit,
    on_error, process_manager, retry_policy, saga, saga_step, starts, timeout, Message,
};

pub use context::StepContext;
pub use engine::{
    shutdown_signal, Bulk, CancelResult, DeadLetter, DeadLetterFilter, DeadLetterPage,
    DeadLetterSelection, Engine, EngineBuilder, Intervention, TaskFilter, TaskPage,
};
pub use error::{BoxError, Error, StepError, StepErrorKind};
pub use saga::{Cancellable, Outcome, Saga};
pub use task::{AuditAction, AuditEntry, StepRecord, StepStatus, TaskId, TaskInstance, TaskStatus};
pub use worker::runtime::{
    DEFAULT_ATTENTION_RETENTION, DEFAULT_HOLD_UNMATCHED, DEFAULT_PROCESS_TOMBSTONE_TTL,
    DEFAULT_RETENTION,
};

/// Everything a saga definition and its caller need.
pub mod prelude {
    pub use crate::context::StepContext;
    pub use crate::engine::{CancelResult, Engine};
    pub use crate::error::{StepError, StepErrorKind};
    pub use crate::model::task::{StepStatus, TaskId, TaskInstance, TaskStatus};
    pub use crate::process::{
        ErrorAction, Failure, FailureKind, Message, ProcessContext, ProcessError, ProcessManager,
        TallyCompleted, TallyRef, TallyStatus,
    };
    pub use crate::reconcile::{ReconcileError, ReconcileReport};
    pub use crate::saga::{Cancellable, Outcome, Saga};
    pub use saga_macros::{
        cancellable, circuit_breaker, compensate, compensation_retry_policy, correlate, handles,
        limit, on_error, process_manager, retry_policy, saga, saga_step, starts, timeout, Message,
    };

    /// What `crate = my_module` finds when `my_module` re-exports this
    /// prelude rather than the crate: everything generated code uses, so
    /// that the one mistake is one error, the `CrateRoot` check's (the
    /// explicit `CrateRoot` shadows the glob's).
    #[doc(hidden)]
    pub mod __private {
        pub use crate::__private::*;
        pub struct CrateRoot;
    }
}

/// What generated code reaches through absolute paths
/// (`::saga_runtime::__private::..`). Not a public API: it changes without
/// notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::circuit::{BreakerScope, CircuitBreakerConfig, WhenOpen};
    pub use crate::context::StepContext;
    pub use crate::engine::Engine;
    pub use crate::error::StepError;
    pub use crate::limit::{limit_key_from, LimitKey, LimitKeyValue, LimitSpec, Rate};
    pub use crate::policy::{BackoffKind, OnExhausted, RetryPolicy};
    pub use crate::process::same_field;
    pub use crate::process::{
        correlation_value, decode_message, message_ops, same_state, state_ops, unknown_message,
        AfterHold, Concurrency, Correlation, ErrorAction, Failure, HandlerDefinition, HandlerKind,
        HasCorrelationId, Message, OnComplete, ProcessContext, ProcessDefinition, ProcessError,
        ProcessManager, ProcessState, Unmatched,
    };
    pub use crate::reconcile::{self, ReconcileError, ReconcileReport};
    pub use crate::saga::{
        decode, encode, unknown_step, BoxFuture, Cancellable, Codec, CompensationDefinition,
        CompletedIsOutputOf, IsOutcome, NotPersistable, Outcome, Persist, Saga, SagaDefinition,
        SagaInput, StepDefinition, StepOutput, TakesOutputOf, UndoesOutputOf, UnknownIsInputOf,
    };
    pub use async_trait::async_trait;
    pub use serde::{de::DeserializeOwned, Serialize};
    pub use serde_json::Value;
    pub use tokio_util::sync::CancellationToken;

    /// Generated code with `crate = path` asks `path::__private::CrateRoot`
    /// to be this one: `path` must name this crate (or a re-export of it),
    /// and a module re-exporting the prelude finds the prelude's stand-in.
    pub struct CrateRoot;

    #[diagnostic::on_unimplemented(
        message = "`crate = ..` names a module that re-exports the saga_runtime prelude, not the saga_runtime crate",
        label = "expected the saga_runtime crate itself, or a re-export of it",
        note = "write the path of the crate (`crate = saga_runtime`), or of a re-export of it (`pub use saga_runtime;` in your crate, then `crate = my_crate::saga_runtime`); a module with `pub use saga_runtime::prelude::*` does not do"
    )]
    pub trait IsCrateRoot {}
    impl IsCrateRoot for CrateRoot {}

    /// The check itself, emitted for `crate = path`:
    /// `const _: fn() = path::__private::crate_root::<path::__private::CrateRoot>;`.
    pub fn crate_root<T: IsCrateRoot>() {}
}
