//! Storage backends: where tasks, leases, the work queue, timers, the
//! dead-letter queue and process-manager instances live.
//!
//! The seam is drawn where its consumers are, one trait per file with its
//! types (`memory/` and `redis/` mirror the file names):
//!
//! - **The core** every engine needs, which is all a backend for sagas
//!   alone implements ([`Backend`], 22 required methods):
//!   - [`TaskStore`] (`tasks.rs`): task records, their leases (with
//!     fencing), attempt claims, the atomic commit of a step's outcome,
//!     cancellation flags, paged listing;
//!   - [`WorkQueue`] (`queue.rs`): delivery of [`WorkItem`]s with a
//!     visibility timeout, hand-backs (now or later), delayed messages,
//!     parking a delivery on the dead-letter queue;
//!   - [`DeadLetters`] (`dead_letters.rs`): the dead-letter queue as an
//!     operator works it;
//!   - [`Housekeeping`] (`housekeeping.rs`): retention.
//! - **What process managers need** ([`ProcessBackend`], through
//!   [`Backend::processes`]; an engine with a process manager refuses a
//!   backend without it): [`ProcessStore`] (`process.rs`), [`Tallies`]
//!   (`tally.rs`), [`Endpoints`] (`endpoint.rs`).
//! - **Coordination between engines**, optional, with in-process defaults:
//!   [`Leases`] (`leases.rs`, named leases), [`Breakers`] (`breakers.rs`,
//!   `scope = shared` circuit breakers), [`Partitions`] (`partitions.rs`,
//!   placement of process-manager work when partitions are kept apart).
//!
//! A task write is described once for every store ([`write`](mod@write): the guards
//! a store checks before any effect, then the effects it applies, a closed
//! vocabulary): [`TaskCommit`], [`NextAttempt`] and an attempt's record
//! are lowered into it, and a store implements one method for them,
//! [`TaskStore::apply`], an interpreter of the vocabulary (memory, Redis
//! and PostgreSQL each have one, `write.rs`) rather than a restatement of
//! the protocol per operation.
//!
//! A write answers what the protocol expects as a value ([`TaskWrite`],
//! [`ProcessWrite`]: written, or refused with a [`TaskRefusal`] or a
//! [`ProcessRefusal`]); [`BackendError`] is for failures only.
//!
//! Operations are shaped around what the engine needs to keep its invariants,
//! not around a key-value API, so that a backend can make each of them one
//! atomic round trip (the Redis backend runs most as one script). Every write
//! of a task carries the [`Lease`] it was made under: a write whose fencing
//! token is not the latest one issued for the task is refused, so a worker
//! that lost its lease (a long pause, a partition) cannot overwrite the work
//! of the worker that took over.
//!
//! Payloads are typed ([`WorkItem`], [`Envelope`](crate::model::envelope::Envelope)): a backend encodes them
//! with [`WorkItem::encode`] and decodes deliveries with [`WorkItem::decode`];
//! it never inspects JSON itself. An entry that does not decode is still
//! delivered, as a [`Delivery`] whose `item` is an error, so the engine can
//! dead-letter it on its own without holding anything else up.
//!
//! Every implementation must pass the conformance suite
//! (`saga_runtime::testing::conformance`, feature `conformance`).

mod breakers;
mod dead_letters;
mod endpoint;
mod error;
mod housekeeping;
mod leases;
pub(crate) mod limits;
pub mod memory;
mod partitions;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
mod process;
mod queue;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
mod runners;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod schema_history;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
mod tally;
mod tasks;
mod url;
pub mod write;

pub use breakers::{BreakerChange, BreakerDecision, Breakers};
pub use dead_letters::{DeadLetter, DeadLetterQuery, DeadLetters};
pub use endpoint::{EndpointDelivery, Endpoints};
pub use error::{BackendError, BackendErrorKind, SourceError};
pub use housekeeping::{Housekeeping, Housekept, Retention};
pub use leases::Leases;
pub use limits::{
    Acquired, LimitCause, LimitDecision, LimitRequest, LimitUsage, Limits, Released, BOOKING_GRACE,
    LATE,
};
pub use partitions::{ForwardTo, Partitions};
pub use process::{Batched, Hold, ProcessCommit, ProcessRefusal, ProcessStore, ProcessWrite};
pub use queue::{
    Delivery, Handling, Interest, LoadedInstance, QueueBacklog, QueueStats, Settle, TakenLease,
    WorkQueue,
};
pub use runners::Runners;
pub(crate) use runners::{saga_runs, saga_steps_run, saga_version_run};
pub use tally::Tallies;
pub use url::{redacted, url_secrets};

use std::sync::Arc;
pub use tasks::{
    Created, Heartbeat, Lease, Locked, Next, NextAttempt, TaskCommit, TaskCursor, TaskQuery,
    TaskRefusal, TaskStore, TaskWrite,
};

pub use crate::model::process::{
    InstanceStatus, ProcessAudit, ProcessAuditAction, ProcessInstance,
};
pub use crate::model::tally::TallyOpen;
pub use crate::model::wire::{QueueMessage, WorkItem};

/// A page of results and where the next one starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The items, in listing order.
    pub items: Vec<T>,
    /// Pass it back to get the next page; `None` on the last page.
    pub next: Option<String>,
}

/// What an engine needs of its store to run sagas: task records, the work
/// queue with its dead letters, and retention. This is the whole of what a
/// saga-only backend implements.
///
/// The rest of the seam is offered through the accessors, each `None` by
/// default: what process managers need ([`ProcessBackend`]: instances,
/// tallies, endpoints), required only once a process manager is
/// registered (the engine refuses to build without it); and coordination
/// between the engines of a deployment ([`Leases`], [`Breakers`]), with
/// in-process defaults that are right for one process and merely
/// redundant for several (two timer pollers move each due message once;
/// a `scope = shared` breaker becomes one per process).
///
/// The accessors take the backend by `Arc` and hand back an `Arc`, so the
/// engine resolves them once and keeps what they return. A backend that
/// offers a part returns itself:
///
/// ```
/// # use std::sync::Arc;
/// # use saga_runtime::backend::{Backend, Breakers, Leases, ProcessBackend};
/// # use saga_runtime::backend::memory::MemoryBackend;
/// let backend = Arc::new(MemoryBackend::new());
/// assert!(backend.clone().processes().is_some());
/// assert!(backend.clone().leases().is_some() && backend.breakers().is_some());
/// ```
// `Any`: the engine can find a backend's own type behind the trait object
// (`Engine::start_in` needs the PostgreSQL backend's).
pub trait Backend: TaskStore + WorkQueue + DeadLetters + Housekeeping + std::any::Any {
    /// The process-manager store, if this backend has one.
    fn processes(self: Arc<Self>) -> Option<Arc<dyn ProcessBackend>> {
        None
    }

    /// Named leases shared by every engine on this backend; `None`: each
    /// engine holds its leases in its own process.
    fn leases(self: Arc<Self>) -> Option<Arc<dyn Leases>> {
        None
    }

    /// Circuit breakers shared by every engine on this backend; `None`:
    /// `scope = shared` breakers are kept per process.
    fn breakers(self: Arc<Self>) -> Option<Arc<dyn Breakers>> {
        None
    }

    /// Flow-control limits (`#[limit]`) shared by every engine on this
    /// backend; `None`: each engine keeps them in its own process (a
    /// limit then holds per engine, not across the deployment).
    fn limits(self: Arc<Self>) -> Option<Arc<dyn Limits>> {
        None
    }

    /// How process-manager work is placed over partitions kept apart;
    /// `None`: everything is together (every reader reads every message,
    /// and versions alone settle races).
    fn partitions(self: Arc<Self>) -> Option<Arc<dyn Partitions>> {
        None
    }

    /// Announcements of which engines run which process managers and saga
    /// versions; `None`: the backend serves one process, which knows what
    /// it runs.
    fn runners(self: Arc<Self>) -> Option<Arc<dyn Runners>> {
        None
    }
}

/// What process managers need of a store: instances with their
/// correlation entries, outbox and timeouts ([`ProcessStore`]), tallies
/// ([`Tallies`]) and endpoints ([`Endpoints`]). Implemented for every type
/// that implements the three; hand it out from [`Backend::processes`].
pub trait ProcessBackend: ProcessStore + Tallies + Endpoints {}

impl<T: ProcessStore + Tallies + Endpoints> ProcessBackend for T {}

/// Connects to the backend `url` names, with its default settings:
/// `postgres://` or `postgresql://` (feature `postgres`); `redis://`,
/// `rediss://`, `redis+sentinel://` or `redis+cluster://` (feature
/// `redis`); `sqlite://path` (feature `sqlite`). What a program that
/// takes a store's URL on its command line calls, whichever store it is.
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>, BackendError> {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    match scheme {
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(postgres::PostgresBackend::connect(url).await?)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "redis+cluster" => {
            Ok(Arc::new(redis::RedisBackend::connect(url).await?))
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(sqlite::SqliteBackend::connect(url).await?)),
        _ => Err(BackendError::Misconfigured(match missing_feature(scheme) {
            // (The URL is shown without its password.)
            // A store this library has, in a build without it: the usual
            // mistake of a first `--url` (the examples build no store by
            // default).
            Some(feature) => format!(
                "`{}` names a store this build leaves out: enable the feature \
                 `{feature}` of saga-runtime (for this repository's examples, \
                 `cargo run --features {feature} --example ..`)",
                redacted(url)
            ),
            None => format!(
                "`{}` names no store this build can use: expected {}",
                redacted(url),
                supported_schemes()
            ),
        })),
    }
}

/// The feature of the store `scheme` names, when this build leaves it out.
fn missing_feature(scheme: &str) -> Option<&'static str> {
    match scheme {
        "postgres" | "postgresql" if !cfg!(feature = "postgres") => Some("postgres"),
        "redis" | "rediss" | "redis+sentinel" | "redis+cluster" if !cfg!(feature = "redis") => {
            Some("redis")
        }
        "sqlite" if !cfg!(feature = "sqlite") => Some("sqlite"),
        _ => None,
    }
}

/// The URL forms [`connect`] takes in this build.
pub fn supported_schemes() -> String {
    let stores = [
        (
            cfg!(feature = "postgres"),
            "postgres://user@host:port/database",
        ),
        (
            cfg!(feature = "redis"),
            "redis://host:port, redis+sentinel://.. or redis+cluster://..",
        ),
        (cfg!(feature = "sqlite"), "sqlite://path/to/file.db"),
    ];
    let built: Vec<&str> = stores
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, url)| *url)
        .collect();
    match built.is_empty() {
        true => {
            "nothing: enable the feature `sqlite`, `redis` or `postgres` of saga-runtime".into()
        }
        false => built.join(", "),
    }
}

/// Cuts a dead-lettered payload to `limit` bytes (on a character
/// boundary); returns the kept prefix and the original size when cut.
pub(crate) fn truncate_payload(payload: &str, limit: usize) -> (&str, Option<usize>) {
    if payload.len() <= limit {
        return (payload, None);
    }
    let mut end = limit;
    while !payload.is_char_boundary(end) {
        end -= 1;
    }
    (&payload[..end], Some(payload.len()))
}
