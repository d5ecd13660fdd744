//! The engine: start, wait for, list and cancel tasks; publish to process
//! managers; manage the dead-letter queue; run workers.
//!
//! The façade: every `impl Engine` is here; what runs is `worker`'s.
//!
//! - `budget`: a handle whose calls give up on an unreachable backend
//!   after a short budget (the HTTP API's);
//! - `builder`: [`EngineBuilder`], registration and settings;
//! - `consumer`: [`Consumer`], an endpoint's consumer as configured;
//! - `client`: starting, waiting, listing, cancelling (riding out transient
//!   backend errors);
//! - `dead_letters`: the dead-letter queue (requeue, bulk requeue, discard);
//! - `operator`: actions on stopped tasks (resolve, retry a compensation);
//! - `inspect`: counts, process-manager instances and their timeouts;
//! - `processes`: publishing and inspecting process managers;
//! - `watch`: a task's progress as a stream of events;
//! - `lifecycle`: the workers and background duties of this process.

mod budget;
mod builder;
mod client;
mod consumer;
mod dead_letters;
mod inspect;
mod lifecycle;
pub(crate) mod limits;
mod operator;
mod processes;
mod tally;
#[cfg(feature = "postgres")]
mod transactional;
mod watch;

use std::sync::Arc;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::model::task::TaskId;
use crate::model::task::TaskStatus;
use crate::saga::{BoxFuture, Cancellable};
use crate::worker::runtime::Runtime;

pub use crate::backend::{DeadLetter, ProcessInstance};
pub use crate::worker::process::ProcessMetrics;
pub use builder::EngineBuilder;
pub use client::{TaskFilter, TaskPage};
pub use consumer::Consumer;
pub use dead_letters::{Bulk, DeadLetterFilter, DeadLetterPage, DeadLetterSelection};
pub use inspect::{PendingTimeout, ProcessPage, SagaCounts};
pub use lifecycle::shutdown_signal;
pub use limits::{LimitInfo, RateInfo};
pub use operator::Intervention;
pub use tally::{Checked, Tally};
pub use watch::{Progress, ProgressEvent, WATCH_POLL};

/// A listing's page size: `limit` as asked, 50 for 0, at most 1000.
pub(crate) fn page_size(limit: usize) -> usize {
    match limit {
        0 => 50,
        n => n.min(1000),
    }
}

/// The result of [`Engine::cancel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CancelResult {
    /// Cancellation was recorded: the running step's token is signalled and
    /// the completed steps will be compensated in reverse order; the task
    /// ends `Cancelled` (or `CompensationFailed`).
    Cancelled,
    /// No such task.
    NotFound,
    /// The task already completed; nothing to cancel.
    AlreadyCompleted,
    /// Cancellation was already requested (or the task is cancelled).
    AlreadyCancelled,
    /// The task already ended another way (failed, compensated, dead-lettered)
    /// or is compensating after a failure: cancelling has no meaning.
    NotCancellable(TaskStatus),
}

/// Stops the background workers when the last [`Engine`] handle is dropped.
struct Owner(CancellationToken);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Starts, inspects and cancels tasks. Cheap to clone; every clone is the
/// same engine. Dropping the last clone tells its background workers to
/// stop without waiting for them; [`shutdown`](Self::shutdown) waits.
#[derive(Clone)]
pub struct Engine {
    pub(crate) rt: Arc<Runtime>,
    /// How long this handle's calls keep retrying an unreachable backend,
    /// when shorter than the client retry policy (see
    /// [`with_retry_budget`](Self::with_retry_budget)).
    budget: Option<std::time::Duration>,
    _owner: Arc<Owner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("sagas", &self.rt.sagas.describe())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// A builder with the in-memory backend and 4 background workers.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::new()
    }

    /// A handle for the engine's own background duties (a bridge's
    /// starts): it does not keep the engine running, as a user's handles
    /// do (dropping the last of those stops it).
    pub(crate) fn detached(rt: Arc<Runtime>) -> Self {
        Engine {
            rt,
            budget: None,
            _owner: Arc::new(Owner(CancellationToken::new())),
        }
    }

    fn from_runtime(rt: Arc<Runtime>) -> Self {
        let owner = Owner(rt.shutdown.clone());
        Engine {
            rt,
            budget: None,
            _owner: Arc::new(owner),
        }
    }

    /// The definitions of the registered sagas, sorted by name; of a saga
    /// registered in several versions, the newest.
    pub fn sagas(&self) -> Vec<&'static crate::saga::SagaDefinition> {
        self.rt.sagas.latest()
    }

    /// The registered saga's own name for `saga`, a metrics label: label
    /// values come from the definitions only, never from a record.
    pub(crate) fn registered_name(&self, saga: &str) -> Option<&'static str> {
        self.rt
            .sagas
            .latest()
            .into_iter()
            .find(|d| d.name == saga)
            .map(|d| d.name)
    }

    /// Whether any registered version of saga `name` is `#[cancellable]`.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn any_version_cancellable(&self, name: &str) -> bool {
        self.rt.sagas.any_cancellable(name)
    }

    /// The backend, for operators and tests.
    pub fn backend(&self) -> &Arc<dyn crate::backend::Backend> {
        &self.rt.backend
    }

    /// The backend's process-manager store (instances, tallies, endpoints),
    /// for operators and tests; an error for a backend that has none.
    pub fn process_store(&self) -> Result<&dyn crate::backend::ProcessBackend, Error> {
        Ok(self.rt.processes()?)
    }

    /// Requests cancellation of a task of a `#[cancellable]` saga.
    ///
    /// Returns once the request is recorded: the running step's
    /// [`StepContext::cancelled`](crate::StepContext::cancelled) fires (in
    /// whichever process runs it), a task waiting to retry is woken, then
    /// the completed steps are compensated in reverse order.
    /// [`wait`](Self::wait) for the final status.
    // Returns a boxed future whose type does not mention `S`: the
    // `Cancellable` bound is then checked once, at the call, and a saga
    // without `#[cancellable]` gets one error instead of one per use of the
    // future.
    pub fn cancel<S: Cancellable>(&self, id: TaskId) -> BoxFuture<'_, Result<CancelResult, Error>> {
        Box::pin(self.cancel_by_name(S::NAME, id))
    }
}
