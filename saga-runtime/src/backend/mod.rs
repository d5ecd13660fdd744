//! Storage backends: where tasks, leases, the work queue, timers, the
//! dead-letter queue and process-manager instances live.
//!
//! The engine talks to one [`Backend`], which is the sum of small traits, one
//! per concern:
//!
//! - [`TaskStore`]: task records, their leases (with fencing), attempt claims,
//!   the atomic commit of a step's outcome, cancellation flags, paged listing;
//! - [`WorkQueue`]: delivery of [`WorkItem`]s with a visibility timeout,
//!   release (now or later), dead letters, delayed messages;
//! - [`ProcessStore`]: process-manager instances, their correlation index,
//!   outbox and timeouts;
//! - [`Leases`]: named leases (one poller or janitor at a time);
//! - [`Housekeeping`]: retention: expired tasks, trimmed dead letters,
//!   consumers that left.
//!
//! Operations are shaped around what the engine needs to keep its invariants,
//! not around a key-value API, so that a backend can make each of them one
//! atomic round trip (the Redis backend runs most as one script). Every write
//! of a task carries the [`Lease`] it was made under: a write whose fencing
//! token is not the latest one issued for the task is refused, so a worker
//! that lost its lease (a long pause, a partition) cannot overwrite the work
//! of the worker that took over.
//!
//! Payloads are typed ([`WorkItem`], [`Envelope`]): a backend encodes them
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
pub mod memory;
mod process;
mod queue;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
mod tally;
mod tasks;

pub use breakers::{BreakerChange, BreakerDecision, Breakers};
pub use dead_letters::{DeadLetter, DeadLetterQuery};
pub use endpoint::{EndpointDelivery, Endpoints};
pub use error::{BackendError, SourceError};
pub use housekeeping::{Housekeeping, Housekept, Retention};
pub use leases::Leases;
pub use process::{Batched, ProcessCommit, ProcessStore};
pub use queue::{
    Delivery, ForwardTo, Interest, LoadedInstance, QueueBacklog, QueueStats, Settle, TakenLease,
    WorkQueue,
};
pub use tally::Tallies;
pub use tasks::{
    Created, Heartbeat, Lease, Locked, Next, NextAttempt, TaskCommit, TaskCursor, TaskQuery,
    TaskStore,
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

/// A complete backend: every concern above.
pub trait Backend:
    TaskStore + WorkQueue + ProcessStore + Tallies + Endpoints + Leases + Housekeeping + Breakers
{
}

impl<T> Backend for T where
    T: TaskStore
        + WorkQueue
        + ProcessStore
        + Tallies
        + Endpoints
        + Leases
        + Housekeeping
        + Breakers
{
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
