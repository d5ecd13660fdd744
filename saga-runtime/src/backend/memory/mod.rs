//! The embedded in-memory backend: everything in-process, for tests,
//! examples and single-process deployments that can lose their state.
//!
//! It keeps the same contract as the Redis backend (leases with fencing,
//! visibility timeouts, delivery counts, delayed messages, retention, fresh
//! copies on load) so that code tested against it behaves the same in
//! production. Time is tokio's, so tests under a paused clock control lock
//! expiry, redelivery and retry delays exactly.

mod breakers;
mod dead_letters;
mod endpoint;
mod housekeeping;
mod leases;
mod limits;
mod partitions;
mod process;
mod queue;
mod tally;
mod tasks;
mod write;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{broadcast, Notify};
use tokio::time::Instant;

use super::{
    Backend, BackendError, Breakers, DeadLetter, Delivery, Leases, ProcessBackend, ProcessInstance,
};
use crate::model::envelope::Envelope;
use crate::model::tally::TallyRef;
use crate::model::task::{TaskId, TaskInstance, Timestamp};

use crate::util::Unpoisoned;
use breakers::SharedBreaker;
use endpoint::MemEndpoint;
use process::Tombstone;
use queue::Message;
use tally::MemTally;

/// The default visibility timeout: how long a delivered, unsettled message
/// stays invisible before it is delivered again.
pub const DEFAULT_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(15);

/// The default size limit of a dead-lettered payload (256 KiB).
pub const DEFAULT_DEAD_LETTER_PAYLOAD_LIMIT: usize = 256 * 1024;

/// In-memory backend. Cheap to clone; clones share the store.
#[derive(Clone)]
pub struct MemoryBackend {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    queue_changed: Notify,
    task_changed: Notify,
    cancels: broadcast::Sender<TaskId>,
    visibility_timeout: Duration,
    payload_limit: usize,
    /// Where the limit machine's clock starts (it counts from a fixed
    /// moment, as a store's clock does).
    epoch: Instant,
}

#[derive(Default)]
struct State {
    tasks: HashMap<TaskId, TaskInstance>,
    /// When a finished task's keys go.
    expiry: HashMap<TaskId, Instant>,
    locks: HashMap<TaskId, (String, Instant)>,
    fences: HashMap<TaskId, u64>,
    claims: HashMap<TaskId, HashSet<String>>,
    cancels: HashMap<TaskId, (Timestamp, String)>,
    ready: VecDeque<Message>,
    delayed: Vec<(Instant, Message)>,
    in_flight: HashMap<String, (Message, Instant)>,
    dead: VecDeque<DeadLetter>,
    next_id: u64,
    instances: HashMap<(String, String), ProcessInstance>,
    index: HashMap<(String, String, String), String>,
    /// Shared correlation entries: `(process, field, value) -> instances`.
    shared: HashMap<(String, String, String), HashSet<String>>,
    scheduled: Vec<(u64, Envelope)>,
    /// The order messages were held in (`ProcessCommit::hold`), by message
    /// id per process: released in it. An entry goes with its scheduled envelope.
    held_order: HashMap<(String, String), u64>,
    held_seq: u64,
    endpoints: HashMap<String, MemEndpoint>,
    /// Messages an endpoint keeps at most (`None`: `endpoint::ENDPOINT_CAP`).
    endpoint_cap: Option<usize>,
    leases: HashMap<String, (String, Instant)>,
    /// What deleted instances handled, by [`Tombstone`], until it expires.
    tombstones: HashMap<Tombstone, (HashSet<String>, Instant)>,
    breakers: HashMap<String, SharedBreaker>,
    tallies: HashMap<TallyRef, MemTally>,
    /// Flow-control limits, by `(limit, key)`; dropped once idle.
    limits: HashMap<(String, Option<String>), crate::limit::machine::LimitState>,
}

/// Everything: one process has nothing to coordinate with but itself.
impl Backend for MemoryBackend {
    fn processes(self: Arc<Self>) -> Option<Arc<dyn ProcessBackend>> {
        Some(self)
    }

    fn leases(self: Arc<Self>) -> Option<Arc<dyn Leases>> {
        Some(self)
    }

    fn breakers(self: Arc<Self>) -> Option<Arc<dyn Breakers>> {
        Some(self)
    }

    fn limits(self: Arc<Self>) -> Option<Arc<dyn super::Limits>> {
        Some(self)
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

impl MemoryBackend {
    /// Looks with `look` until it finds something or `wait` has passed.
    /// `look` answers `Err(when)` when there is nothing yet: when looking
    /// again is worth it (besides any change to the queues, which wakes
    /// the wait at once).
    async fn wait_for<T>(
        &self,
        wait: Duration,
        mut look: impl FnMut(&mut State, Instant) -> Result<T, Option<Instant>>,
    ) -> Option<T> {
        // Nothing below suspends when a message is ready, so without this a
        // worker whose message bounces (a locked task, handed back) would
        // never give its thread to the worker holding the lock. A network
        // backend yields on its I/O anyway.
        tokio::task::yield_now().await;
        let deadline = later(wait);
        loop {
            // Register interest before looking, so a push between the look
            // and the wait is not missed.
            let notified = self.shared.queue_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wake = {
                let mut state = self.state();
                let now = Instant::now();
                match look(&mut state, now) {
                    Ok(found) => return Some(found),
                    Err(_) if now >= deadline => return None,
                    Err(next) => next.map_or(deadline, |at| at.min(deadline)),
                }
            };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// An empty store with the default visibility timeout.
    pub fn new() -> Self {
        MemoryBackend::with_visibility_timeout(DEFAULT_VISIBILITY_TIMEOUT)
    }

    /// An empty store whose unsettled messages are redelivered after `timeout`.
    pub fn with_visibility_timeout(timeout: Duration) -> Self {
        MemoryBackend::build(timeout, DEFAULT_DEAD_LETTER_PAYLOAD_LIMIT)
    }

    /// The same store settings, but dead-lettered payloads keep at most
    /// `bytes` (default 256 KiB). Call it on a fresh store.
    pub fn with_dead_letter_payload_limit(self, bytes: usize) -> Self {
        MemoryBackend::build(self.shared.visibility_timeout, bytes)
    }

    /// The same store, whose endpoints keep at most `messages` each
    /// (default 100,000, as Redis's): one a consumer group reads refuses
    /// writes past it, one no group reads drops its oldest.
    pub fn with_endpoint_cap(self, messages: usize) -> Self {
        self.state().endpoint_cap = Some(messages.max(1));
        self
    }

    fn build(visibility_timeout: Duration, payload_limit: usize) -> Self {
        MemoryBackend {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                queue_changed: Notify::new(),
                task_changed: Notify::new(),
                cancels: broadcast::channel(1024).0,
                visibility_timeout,
                epoch: Instant::now(),
                payload_limit,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section below leaves the state consistent before it
        // can panic, so a poisoned lock is still usable.
        self.shared.state.locked()
    }

    fn queue_changed(&self) {
        self.shared.queue_changed.notify_waiters();
    }

    fn task_changed(&self) {
        self.shared.task_changed.notify_waiters();
    }

    fn hand_back(
        &self,
        delivery: &Delivery,
        delay: Duration,
        answered: bool,
    ) -> Result<(), BackendError> {
        {
            let mut state = self.state();
            if let Some((mut m, _)) = state.in_flight.remove(&delivery.id) {
                if answered {
                    m.deliveries = m.deliveries.saturating_sub(1);
                }
                m.since = later(delay);
                if delay.is_zero() {
                    state.ready.push_back(m);
                } else {
                    state.delayed.push((later(delay), m));
                }
            }
        }
        self.queue_changed();
        Ok(())
    }
}

/// `now + d`, saturating at a century for durations too large to add.
fn later(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}
