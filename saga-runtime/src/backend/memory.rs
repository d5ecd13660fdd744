//! The embedded in-memory backend: everything in-process, for tests,
//! examples and single-process deployments that can lose their state.
//!
//! It keeps the same contract as the Redis backend (leases with fencing,
//! visibility timeouts, delivery counts, delayed messages, retention, fresh
//! copies on load) so that code tested against it behaves the same in
//! production. Time is tokio's, so tests under a paused clock control lock
//! expiry, redelivery and retry delays exactly.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::{broadcast, Notify};
use tokio::time::Instant;
use uuid::Uuid;

use super::{
    truncate_payload, BackendError, BreakerChange, BreakerDecision, Breakers, Created, DeadLetter,
    DeadLetterQuery, Delivery, EndpointDelivery, Endpoints, Heartbeat, Housekeeping, Housekept,
    Interest, Lease, Leases, Locked, NextAttempt, Page, ProcessCommit, ProcessInstance,
    ProcessStore, QueueMessage, QueueStats, Retention, Settle, Tallies, TaskCommit, TaskQuery,
    TaskStore, WorkItem, WorkQueue,
};
use crate::model::envelope::Envelope;
use crate::model::tally::{TallyCheck, TallyProgress, TallyRef, COMPLETED_TALLY_KEEP};
use crate::model::task::{TaskId, TaskInstance, TaskStatus, Timestamp, AUDIT_LOG_CAP};

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
    endpoints: HashMap<String, MemEndpoint>,
    leases: HashMap<String, (String, Instant)>,
    /// What deleted instances handled, by [`Tombstone`], until it expires.
    tombstones: HashMap<Tombstone, (HashSet<String>, Instant)>,
    breakers: HashMap<String, SharedBreaker>,
    tallies: HashMap<TallyRef, MemTally>,
}

/// Messages an endpoint keeps at most (oldest go first), as Redis's
/// default `endpoint_max_len`.
const ENDPOINT_CAP: usize = 100_000;
/// Dead letters an endpoint keeps at most.
const ENDPOINT_DEAD_CAP: usize = 10_000;

/// An endpoint: its messages (by id) and consumer groups.
#[derive(Default)]
struct MemEndpoint {
    entries: VecDeque<(u64, String)>,
    next: u64,
    groups: HashMap<String, MemGroup>,
    dead: VecDeque<DeadLetter>,
}

/// A consumer group: the last message it was given, and those given but
/// not settled: `id -> (consumer, deliveries, since)`.
#[derive(Default)]
struct MemGroup {
    last: u64,
    pending: std::collections::BTreeMap<u64, (String, u32, Instant)>,
}

impl MemEndpoint {
    fn push(&mut self, envelope: String) {
        self.next += 1;
        self.entries.push_back((self.next, envelope));
        if self.entries.len() > ENDPOINT_CAP {
            self.entries.pop_front();
        }
    }

    fn get(&self, id: u64) -> Option<&String> {
        let i = self.entries.binary_search_by_key(&id, |(k, _)| *k).ok()?;
        Some(&self.entries[i].1)
    }

    /// A message held too long by someone, else the next new one.
    fn take(
        &mut self,
        group: &str,
        consumer: &str,
        claim_idle: Duration,
    ) -> Option<EndpointDelivery> {
        let now = Instant::now();
        let entries = std::mem::take(&mut self.entries);
        let g = self.groups.entry(group.to_owned()).or_default();
        let exists = |id: u64| entries.binary_search_by_key(&id, |(k, _)| *k).ok();
        // Trimmed (capped) messages leave the pending list.
        g.pending.retain(|id, _| exists(*id).is_some());
        let stale = g
            .pending
            .iter()
            .find(|(_, (_, _, since))| *since + claim_idle <= now)
            .map(|(id, _)| *id);
        let taken = match stale {
            Some(id) => {
                let p = g.pending.get_mut(&id).expect("just found");
                *p = (consumer.to_owned(), p.1 + 1, now);
                Some((id, p.1))
            }
            None => entries
                .iter()
                .find(|(id, _)| *id > g.last)
                .map(|(id, _)| *id)
                .map(|id| {
                    g.last = id;
                    g.pending.insert(id, (consumer.to_owned(), 1, now));
                    (id, 1)
                }),
        };
        self.entries = entries;
        taken.map(|(id, deliveries)| EndpointDelivery {
            id: id.to_string(),
            raw: self.get(id).cloned().unwrap_or_default(),
            deliveries,
        })
    }
}

/// A tally (see [`Tallies`]), kept until `expires`.
struct MemTally {
    pending: HashSet<String>,
    checked: HashSet<String>,
    complete: bool,
    deadline_passed: bool,
    completion: Envelope,
    completion_late: Envelope,
    expires: Instant,
}

/// A `scope = shared` breaker: shared by the engines on this backend.
#[derive(Default)]
struct SharedBreaker {
    failures: u32,
    /// Open until then; `None` while closed.
    open_until: Option<Instant>,
    /// A probe is out until then, under this token.
    probe_until: Option<Instant>,
    probe_token: String,
}

/// Where a deleted instance's handled message ids are remembered: under its
/// id, and under each correlation entry it released.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Tombstone {
    Instance(String, String),
    Correlation(String, String, String),
}

#[derive(Clone)]
struct Message {
    id: String,
    raw: Vec<u8>,
    /// Deliveries not answered so far.
    deliveries: u32,
    /// A process-manager message (else a saga message, or an entry that
    /// decodes as nothing): for [`WorkQueue::queue_stats`].
    process: bool,
    /// When it was (or, delayed, will be) put on the queue; a hand-back
    /// puts it on again.
    since: Instant,
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

    fn build(visibility_timeout: Duration, payload_limit: usize) -> Self {
        MemoryBackend {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                queue_changed: Notify::new(),
                task_changed: Notify::new(),
                cancels: broadcast::channel(1024).0,
                visibility_timeout,
                payload_limit,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section below leaves the state consistent before it
        // can panic, so a poisoned lock is still usable.
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
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

impl State {
    fn push(&mut self, raw: Vec<u8>, deliveries: u32, delay: Duration, process: bool) {
        self.next_id += 1;
        let message = Message {
            id: format!("m-{}", self.next_id),
            raw,
            deliveries,
            process,
            since: later(delay),
        };
        if delay.is_zero() {
            self.ready.push_back(message);
        } else {
            self.delayed.push((later(delay), message));
        }
    }

    fn push_item(&mut self, item: &WorkItem, delay: Duration) {
        let process = matches!(item, WorkItem::Process(_));
        self.push(item.encode().into_bytes(), 0, delay, process);
    }

    /// Puts an entry on the queue as it is.
    fn push_raw(&mut self, raw: Vec<u8>) {
        let process = matches!(WorkItem::decode(&raw), Ok(WorkItem::Process(_)));
        self.push(raw, 0, Duration::ZERO, process);
    }

    fn check_write(&self, task: &TaskInstance, lease: &Lease) -> Result<(), BackendError> {
        if lease.task_id != task.id || self.fences.get(&task.id).copied() != Some(lease.fence) {
            return Err(BackendError::LockLost {
                task: task.id,
                fence: lease.fence,
            });
        }
        let actual = self
            .tasks
            .get(&task.id)
            .map(|t| t.version)
            .ok_or(BackendError::NotFound(task.id))?;
        if actual != task.version {
            return Err(BackendError::Conflict {
                task: task.id,
                expected: task.version,
                actual,
            });
        }
        Ok(())
    }

    /// Writes an attempt's record and claims its name; the claim may be
    /// lost (taken before), the write happens regardless.
    fn record(&mut self, task: &TaskInstance, claim: &str) -> (u64, bool) {
        let version = self.write(task);
        let claimed = self
            .claims
            .entry(task.id)
            .or_default()
            .insert(claim.to_owned());
        (version, claimed)
    }

    /// Stores `task`, appending its unstored audit entries to the stored
    /// log (capped) as a backend that keeps the log apart must.
    fn write(&mut self, task: &TaskInstance) -> u64 {
        let mut audit = self
            .tasks
            .remove(&task.id)
            .map(|t| t.audit_log)
            .unwrap_or_default();
        audit.extend_from_slice(task.unstored_audit());
        let excess = audit.len().saturating_sub(AUDIT_LOG_CAP);
        audit.drain(..excess);
        let mut stored = task.clone();
        stored.audit_log = audit;
        stored.audit_saved();
        stored.version += 1;
        stored.updated_at = Timestamp::now();
        let version = stored.version;
        self.tasks.insert(task.id, stored);
        version
    }

    fn lock_held_by(&self, lease: &Lease, now: Instant) -> bool {
        matches!(self.locks.get(&lease.task_id), Some((token, exp)) if *token == lease.token && *exp > now)
    }

    /// Moves due delayed messages and expired in-flight ones back to ready.
    fn promote(&mut self, now: Instant) {
        let mut due: Vec<(Instant, Message)> = Vec::new();
        let mut i = 0;
        while i < self.delayed.len() {
            if self.delayed[i].0 <= now {
                due.push(self.delayed.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|(at, m)| (*at, m.id.len(), m.id.clone()));
        self.ready.extend(due.into_iter().map(|(_, m)| m));
        let mut expired: Vec<(String, Instant)> = self
            .in_flight
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(id, (_, at))| (id.clone(), *at))
            .collect();
        expired.sort();
        for (id, _) in expired {
            if let Some((m, _)) = self.in_flight.remove(&id) {
                // That delivery was never answered: its count stands.
                self.ready.push_back(m);
            }
        }
    }

    fn next_wakeup(&self) -> Option<Instant> {
        let delayed = self.delayed.iter().map(|(at, _)| *at);
        let in_flight = self.in_flight.values().map(|(_, at)| *at);
        delayed.chain(in_flight).min()
    }

    fn park(&mut self, delivery: &Delivery, reason: &str, task_id: Option<TaskId>, limit: usize) {
        self.in_flight.remove(&delivery.id);
        let (payload, truncated) = truncate_payload(&delivery.raw, limit);
        // Ids grow in parking order, so a cursor (an id) still says where
        // a page ended after its letter was requeued or discarded.
        self.next_id += 1;
        self.dead.push_back(DeadLetter {
            id: format!("dl-{}", self.next_id),
            payload: payload.to_owned(),
            reason: reason.to_owned(),
            task_id,
            at: Timestamp::now(),
            truncated,
        });
    }

    fn settle(&mut self, settle: Settle<'_>, task_id: Option<TaskId>, limit: usize) {
        match settle {
            Settle::Nothing => {}
            Settle::Ack(d) => {
                self.in_flight.remove(&d.id);
            }
            Settle::DeadLetter(d, reason) => self.park(d, reason, task_id, limit),
            Settle::ResolveDeadLetter(id) => self.dead.retain(|d| d.id != id),
        }
    }

    fn remove_task(&mut self, id: TaskId) {
        self.tasks.remove(&id);
        self.expiry.remove(&id);
        self.locks.remove(&id);
        self.fences.remove(&id);
        self.claims.remove(&id);
        self.cancels.remove(&id);
    }
}

#[async_trait]
impl TaskStore for MemoryBackend {
    async fn create_task(
        &self,
        task: &TaskInstance,
        first: &QueueMessage,
    ) -> Result<Created, BackendError> {
        {
            let mut state = self.state();
            if let Some(existing) = state.tasks.get(&task.id) {
                return Ok(Created::Existing(Box::new(existing.clone())));
            }
            let mut stored = task.clone();
            stored.version = 1;
            stored.audit_saved();
            state.tasks.insert(task.id, stored);
            state.push_item(&WorkItem::Saga(first.clone()), Duration::ZERO);
        }
        self.queue_changed();
        self.task_changed();
        Ok(Created::New)
    }

    async fn load_task(&self, id: TaskId) -> Result<Option<TaskInstance>, BackendError> {
        Ok(self.state().tasks.get(&id).cloned())
    }

    async fn list_tasks(&self, query: &TaskQuery) -> Result<Vec<TaskInstance>, BackendError> {
        let state = self.state();
        let mut tasks: Vec<_> = state
            .tasks
            .values()
            .filter(|t| query.matches(t))
            .cloned()
            .collect();
        tasks.sort_by_key(|t| std::cmp::Reverse((t.created_at, t.id)));
        tasks.truncate(query.limit);
        Ok(tasks)
    }

    async fn count_tasks(&self, saga: &str) -> Result<Vec<(TaskStatus, usize)>, BackendError> {
        let state = self.state();
        Ok(TaskStatus::ALL
            .into_iter()
            .map(|status| {
                let n = state
                    .tasks
                    .values()
                    .filter(|t| t.saga == saga && t.status == status)
                    .count();
                (status, n)
            })
            .filter(|(_, n)| *n > 0)
            .collect())
    }

    async fn lock_and_load(
        &self,
        id: TaskId,
        ttl: Duration,
    ) -> Result<Option<Locked>, BackendError> {
        let mut state = self.state();
        let now = Instant::now();
        let token = Uuid::new_v4().simple().to_string();
        if !state.tasks.contains_key(&id) {
            // No lease for a task that does not exist: a stray message
            // leaves nothing behind.
            return Ok(Some(Locked::missing(id)));
        }
        if matches!(state.locks.get(&id), Some((_, exp)) if *exp > now) {
            return Ok(None);
        }
        let fence = {
            let f = state.fences.entry(id).or_insert(0);
            *f += 1;
            *f
        };
        state.locks.insert(id, (token.clone(), now + ttl));
        Ok(Some(Locked {
            lease: Lease {
                task_id: id,
                token,
                fence,
            },
            task: state.tasks.get(&id).cloned(),
            cancel_requested: state.cancels.get(&id).map(|(at, _)| *at),
        }))
    }

    async fn record_attempt(
        &self,
        task: &TaskInstance,
        _stored_status: TaskStatus,
        lease: &Lease,
        claim: &str,
    ) -> Result<(u64, bool), BackendError> {
        let result = {
            let mut state = self.state();
            state.check_write(task, lease)?;
            state.record(task, claim)
        };
        self.task_changed();
        Ok(result)
    }

    async fn record_next_attempt(
        &self,
        next: NextAttempt<'_>,
    ) -> Result<(u64, bool), BackendError> {
        let result = {
            let mut state = self.state();
            let task = next.task;
            state.check_write(task, next.lease)?;
            if let Some((at, _)) = state
                .cancels
                .get(&task.id)
                .filter(|_| next.unless_cancelled)
            {
                return Err(BackendError::CancelRequested {
                    task: task.id,
                    at: *at,
                });
            }
            let recorded = state.record(task, next.claim);
            if let Some(ttl) = next.renew {
                let now = Instant::now();
                state
                    .locks
                    .insert(task.id, (next.lease.token.clone(), now + ttl));
                let visible_again = now + self.shared.visibility_timeout;
                if let Some(entry) = state.in_flight.get_mut(&next.delivery.id) {
                    entry.1 = visible_again;
                }
            }
            recorded
        };
        self.task_changed();
        Ok(result)
    }

    async fn commit(&self, commit: TaskCommit<'_>) -> Result<u64, BackendError> {
        let task = commit.task;
        let version = {
            let mut state = self.state();
            state.check_write(task, commit.lease)?;
            if let Some((at, _)) = state
                .cancels
                .get(&task.id)
                .filter(|_| commit.unless_cancelled)
            {
                return Err(BackendError::CancelRequested {
                    task: task.id,
                    at: *at,
                });
            }
            let version = state.write(task);
            if let Some(next) = &commit.next {
                // A cancelled task does not wait out a backoff.
                let delay = match state.cancels.contains_key(&task.id) {
                    true => Duration::ZERO,
                    false => next.delay,
                };
                state.push_item(&WorkItem::Saga(next.message.clone()), delay);
            }
            state.settle(commit.settle, Some(task.id), self.shared.payload_limit);
            if state.lock_held_by(commit.lease, Instant::now()) {
                state.locks.remove(&task.id);
            }
            match commit.expire_after {
                Some(after) => state.expiry.insert(task.id, later(after)),
                None => state.expiry.remove(&task.id),
            };
            version
        };
        self.queue_changed();
        self.task_changed();
        Ok(version)
    }

    async fn heartbeat(
        &self,
        lease: &Lease,
        delivery: &Delivery,
        ttl: Duration,
    ) -> Result<Heartbeat, BackendError> {
        let mut state = self.state();
        let now = Instant::now();
        let lock_held = state.lock_held_by(lease, now);
        if lock_held {
            state
                .locks
                .insert(lease.task_id, (lease.token.clone(), now + ttl));
        }
        let visible_again = now + self.shared.visibility_timeout;
        if let Some(entry) = state.in_flight.get_mut(&delivery.id) {
            entry.1 = visible_again;
        }
        Ok(Heartbeat {
            lock_held,
            cancel_requested: state.cancels.get(&lease.task_id).map(|(at, _)| *at),
        })
    }

    async fn unlock(&self, lease: &Lease) -> Result<bool, BackendError> {
        let mut state = self.state();
        if state.lock_held_by(lease, Instant::now()) {
            state.locks.remove(&lease.task_id);
            Ok(true)
        } else {
            Ok(false)
        }
    }

    async fn request_cancel(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
    ) -> Result<Option<Timestamp>, BackendError> {
        {
            let mut state = self.state();
            if let Some((at, by)) = state.cancels.get(&id) {
                return Ok((by != token).then_some(*at));
            }
            if !state.tasks.contains_key(&id) {
                return Ok(None);
            }
            state
                .cancels
                .insert(id, (Timestamp::now(), token.to_owned()));
            state.push_item(&WorkItem::Saga(wake.clone()), Duration::ZERO);
        }
        let _ = self.shared.cancels.send(id);
        self.queue_changed();
        Ok(None)
    }

    async fn cancel_requested(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError> {
        Ok(self.state().cancels.get(&id).map(|(at, _)| *at))
    }

    async fn cancellations(&self) -> Result<BoxStream<'static, TaskId>, BackendError> {
        let rx = self.shared.cancels.subscribe();
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(id) => return Some((id, rx)),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        Ok(stream.boxed())
    }

    async fn wait_for_change(&self, _id: TaskId, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.shared.task_changed.notified()).await;
    }
}

#[async_trait]
impl WorkQueue for MemoryBackend {
    fn visibility_timeout(&self) -> Duration {
        self.shared.visibility_timeout
    }

    async fn enqueue(&self, items: &[WorkItem]) -> Result<(), BackendError> {
        {
            let mut state = self.state();
            for item in items {
                state.push_item(item, Duration::ZERO);
            }
        }
        self.queue_changed();
        Ok(())
    }

    async fn enqueue_raw(&self, payload: &[u8]) -> Result<(), BackendError> {
        self.state().push_raw(payload.to_vec());
        self.queue_changed();
        Ok(())
    }

    async fn receive(
        &self,
        consumer: &str,
        interest: Interest,
        wait: Duration,
    ) -> Result<Option<Delivery>, BackendError> {
        let visibility = self.shared.visibility_timeout;
        Ok(self
            .wait_for(wait, |state, now| {
                state.promote(now);
                let taken = if interest == Interest::ALL {
                    (!state.ready.is_empty()).then_some(0)
                } else {
                    state
                        .ready
                        .iter()
                        .position(|m| interest.takes(&WorkItem::decode(&m.raw)))
                };
                let Some(mut m) = taken.and_then(|i| state.ready.remove(i)) else {
                    return Err(state.next_wakeup());
                };
                m.deliveries += 1;
                let delivery = Delivery {
                    id: m.id.clone(),
                    item: WorkItem::decode(&m.raw),
                    raw: String::from_utf8_lossy(&m.raw).into_owned(),
                    deliveries: m.deliveries,
                    consumer: consumer.to_owned(),
                    lease: None,
                    instance: None,
                };
                state.in_flight.insert(m.id.clone(), (m, now + visibility));
                Ok(delivery)
            })
            .await)
    }

    async fn touch(&self, delivery: &Delivery) -> Result<(), BackendError> {
        let mut state = self.state();
        let deadline = Instant::now() + self.shared.visibility_timeout;
        if let Some(entry) = state.in_flight.get_mut(&delivery.id) {
            entry.1 = deadline;
        }
        Ok(())
    }

    async fn ack(&self, delivery: &Delivery) -> Result<(), BackendError> {
        self.state().in_flight.remove(&delivery.id);
        Ok(())
    }

    async fn release(&self, delivery: &Delivery, delay: Duration) -> Result<(), BackendError> {
        self.hand_back(delivery, delay, true)
    }

    async fn defer(&self, delivery: &Delivery, delay: Duration) -> Result<(), BackendError> {
        self.hand_back(delivery, delay, false)
    }

    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &str,
        task_id: Option<TaskId>,
    ) -> Result<(), BackendError> {
        self.state()
            .park(delivery, reason, task_id, self.shared.payload_limit);
        Ok(())
    }

    async fn release_due(&self, _limit: usize) -> Result<usize, BackendError> {
        // `receive` promotes due messages itself, to the instant.
        Ok(0)
    }

    async fn dead_letters(
        &self,
        query: &DeadLetterQuery,
    ) -> Result<Page<DeadLetter>, BackendError> {
        let state = self.state();
        let parked = |id: &str| id.strip_prefix("dl-").and_then(|n| n.parse::<u64>().ok());
        let before = match &query.after {
            Some(after) => {
                Some(parked(after).ok_or_else(|| BackendError::InvalidCursor(after.clone()))?)
            }
            None => None,
        };
        let mut older = state
            .dead
            .iter()
            .rev()
            .filter(|d| before.is_none_or(|b| parked(&d.id).is_some_and(|n| n < b)));
        let items: Vec<DeadLetter> = older.by_ref().take(query.limit).cloned().collect();
        let more = older.next().is_some();
        let next = more.then(|| items.last().map(|d| d.id.clone())).flatten();
        Ok(Page { items, next })
    }

    async fn dead_letter_by_id(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        Ok(self.state().dead.iter().find(|d| d.id == id).cloned())
    }

    async fn requeue_dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        let letter = {
            let mut state = self.state();
            let index = state.dead.iter().position(|d| d.id == id);
            let letter = index.and_then(|i| state.dead.remove(i));
            if let Some(letter) = &letter {
                state.push_raw(letter.payload.clone().into_bytes());
            }
            letter
        };
        self.queue_changed();
        Ok(letter)
    }

    async fn dead_letter_count(&self) -> Result<usize, BackendError> {
        Ok(self.state().dead.len())
    }

    async fn discard_dead_letter(&self, id: &str) -> Result<bool, BackendError> {
        let mut state = self.state();
        let before = state.dead.len();
        state.dead.retain(|d| d.id != id);
        Ok(state.dead.len() < before)
    }

    async fn queue_stats(&self) -> Result<Option<QueueStats>, BackendError> {
        let state = self.state();
        let now = Instant::now();
        let mut stats = QueueStats::default();
        let due = state
            .delayed
            .iter()
            .filter(|(at, _)| *at <= now)
            .map(|(_, m)| m);
        let queued = state.ready.iter().chain(due);
        for m in queued.chain(state.in_flight.values().map(|(m, _)| m)) {
            let backlog = match m.process {
                true => &mut stats.processes,
                false => &mut stats.sagas,
            };
            backlog.depth += 1;
            let age = now.saturating_duration_since(m.since);
            backlog.oldest = backlog.oldest.max(Some(age));
        }
        Ok(Some(stats))
    }
}

#[async_trait]
impl ProcessStore for MemoryBackend {
    async fn process_load(
        &self,
        process: &str,
        id: &str,
    ) -> Result<Option<ProcessInstance>, BackendError> {
        Ok(self
            .state()
            .instances
            .get(&(process.to_owned(), id.to_owned()))
            .cloned())
    }

    async fn process_find(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Option<ProcessInstance>, BackendError> {
        let state = self.state();
        let key = (process.to_owned(), field.to_owned(), value.to_owned());
        Ok(state
            .index
            .get(&key)
            .and_then(|id| state.instances.get(&(process.to_owned(), id.clone())))
            .cloned())
    }

    async fn process_find_shared(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Vec<String>, BackendError> {
        let key = (process.to_owned(), field.to_owned(), value.to_owned());
        let mut ids: Vec<String> = self
            .state()
            .shared
            .get(&key)
            .map(|ids| ids.iter().cloned().collect())
            .unwrap_or_default();
        ids.sort();
        Ok(ids)
    }

    async fn process_list(&self, process: &str) -> Result<Vec<ProcessInstance>, BackendError> {
        let state = self.state();
        let mut list: Vec<_> = state
            .instances
            .values()
            .filter(|i| i.process == process)
            .cloned()
            .collect();
        list.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(list)
    }

    async fn process_commit(
        &self,
        process: &str,
        commit: ProcessCommit<'_>,
    ) -> Result<u64, BackendError> {
        let version = {
            let mut state = self.state();
            let mut version = 0;
            let now = Instant::now();
            state.tallies.retain(|_, t| t.expires > now);
            if let Some(instance) = commit.instance {
                let key = (process.to_owned(), instance.id.clone());
                let stored = state.instances.get(&key).map_or(0, |i| i.version);
                let conflict = || BackendError::ProcessConflict {
                    process: process.to_owned(),
                    instance: instance.id.clone(),
                };
                // The same version of another generation: deleted and
                // created again since it was read.
                let regenerated = state.instances.get(&key).is_some_and(|i| {
                    !i.generation.is_empty()
                        && !instance.generation.is_empty()
                        && i.generation != instance.generation
                });
                if stored != instance.version || regenerated {
                    return Err(conflict());
                }
                // After the version: a handler that lost a race to the
                // writer that opened the tally runs again instead.
                if let Some(open) = commit
                    .tallies
                    .iter()
                    .find(|o| state.tallies.contains_key(&o.tally))
                {
                    return Err(BackendError::TallyExists(open.tally.clone()));
                }
                for message in commit.handled_ids().filter(|_| !commit.delete) {
                    let now = Instant::now();
                    let remembers = |t: Tombstone| {
                        state
                            .tombstones
                            .get(&t)
                            .is_some_and(|(ids, until)| *until > now && ids.contains(message))
                    };
                    let by_id = Tombstone::Instance(process.to_owned(), instance.id.clone());
                    if remembers(by_id)
                        || commit.add_keys.iter().any(|(f, v)| {
                            remembers(Tombstone::Correlation(
                                process.to_owned(),
                                f.clone(),
                                v.clone(),
                            ))
                        })
                    {
                        return Err(BackendError::ProcessTombstoned {
                            process: process.to_owned(),
                            instance: instance.id.clone(),
                        });
                    }
                }
                for (field, value) in &commit.add_keys {
                    let ikey = (process.to_owned(), field.clone(), value.clone());
                    if matches!(state.index.get(&ikey), Some(owner) if *owner != instance.id) {
                        return Err(conflict());
                    }
                }
                for (field, value) in &commit.remove_keys {
                    let ikey = (process.to_owned(), field.clone(), value.clone());
                    if state.index.get(&ikey) == Some(&instance.id) {
                        state.index.remove(&ikey);
                    }
                }
                if commit.delete {
                    let now = Instant::now();
                    let until = now + commit.tombstone_ttl;
                    state.tombstones.retain(|_, (_, until)| *until > now);
                    let ids: HashSet<String> = instance.handled().into_iter().collect();
                    let places = std::iter::once(Tombstone::Instance(
                        process.to_owned(),
                        instance.id.clone(),
                    ))
                    .chain(commit.remove_keys.iter().map(|(f, v)| {
                        Tombstone::Correlation(process.to_owned(), f.clone(), v.clone())
                    }));
                    for place in places {
                        let (known, expiry) = state
                            .tombstones
                            .entry(place)
                            .or_insert_with(|| (HashSet::new(), until));
                        known.extend(ids.iter().cloned());
                        *expiry = until;
                    }
                    state.instances.remove(&key);
                    let id = instance.id.clone();
                    state
                        .index
                        .retain(|(p, _, _), owner| !(p == process && *owner == id));
                    state.shared.retain(|(p, _, _), ids| {
                        if p == process {
                            ids.remove(&id);
                        }
                        !ids.is_empty()
                    });
                } else {
                    for (field, value) in &commit.add_keys {
                        state.index.insert(
                            (process.to_owned(), field.clone(), value.clone()),
                            instance.id.clone(),
                        );
                    }
                    for (field, value) in &commit.add_shared {
                        state
                            .shared
                            .entry((process.to_owned(), field.clone(), value.clone()))
                            .or_default()
                            .insert(instance.id.clone());
                    }
                    for (field, value) in &commit.remove_shared {
                        let k = (process.to_owned(), field.clone(), value.clone());
                        if let Some(ids) = state.shared.get_mut(&k) {
                            ids.remove(&instance.id);
                            if ids.is_empty() {
                                state.shared.remove(&k);
                            }
                        }
                    }
                    let mut stored = instance.clone();
                    stored.version += 1;
                    stored.updated_at = Timestamp::now();
                    version = stored.version;
                    state.instances.insert(key, stored);
                }
            }
            for envelope in &commit.enqueue {
                state.push_item(&WorkItem::Process(envelope.clone()), Duration::ZERO);
            }
            for (endpoint, payload) in &commit.endpoints {
                state
                    .endpoints
                    .entry(endpoint.clone())
                    .or_default()
                    .push(payload.clone());
            }
            state.scheduled.extend(commit.schedule.iter().cloned());
            state.scheduled.sort_by_key(|(due, _)| *due);
            for open in commit.tallies {
                let complete = open.items.is_empty();
                if complete {
                    state.push_item(&WorkItem::Process(open.completion.clone()), Duration::ZERO);
                }
                state.tallies.insert(
                    open.tally,
                    MemTally {
                        pending: open.items.into_iter().collect(),
                        checked: HashSet::new(),
                        complete,
                        deadline_passed: false,
                        completion: open.completion,
                        completion_late: open.completion_late,
                        expires: now + open.keep_for,
                    },
                );
            }
            state.settle(commit.settle, None, self.shared.payload_limit);
            for batched in &commit.batched {
                state.settle(
                    Settle::Ack(batched.delivery),
                    None,
                    self.shared.payload_limit,
                );
            }
            version
        };
        self.queue_changed();
        Ok(version)
    }

    async fn process_release_due(&self, now_ms: u64, limit: usize) -> Result<usize, BackendError> {
        let moved = {
            let mut state = self.state();
            let due = state
                .scheduled
                .iter()
                .take_while(|(at, _)| *at <= now_ms)
                .count()
                .min(limit);
            let released: Vec<(u64, Envelope)> = state.scheduled.drain(..due).collect();
            for (_, envelope) in released.iter() {
                state.push_item(&WorkItem::Process(envelope.clone()), Duration::ZERO);
            }
            released.len()
        };
        if moved > 0 {
            self.queue_changed();
        }
        Ok(moved)
    }

    async fn process_scheduled(&self) -> Result<Vec<(u64, Envelope)>, BackendError> {
        Ok(self.state().scheduled.clone())
    }

    async fn endpoint_messages(&self, endpoint: &str) -> Result<Vec<String>, BackendError> {
        Ok(self
            .state()
            .endpoints
            .get(endpoint)
            .map(|e| e.entries.iter().map(|(_, m)| m.clone()).collect())
            .unwrap_or_default())
    }
}

#[async_trait]
impl Endpoints for MemoryBackend {
    async fn endpoint_receive(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
        claim_idle: Duration,
        block: Duration,
    ) -> Result<Option<EndpointDelivery>, BackendError> {
        Ok(self
            .wait_for(block, |state, _| {
                let e = state.endpoints.entry(endpoint.to_owned()).or_default();
                if let Some(d) = e.take(group, consumer, claim_idle) {
                    return Ok(d);
                }
                // A held message becomes claimable at `since + claim_idle`.
                Err(e.groups[group]
                    .pending
                    .values()
                    .map(|(_, _, since)| *since + claim_idle)
                    .min())
            })
            .await)
    }

    async fn endpoint_touch(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
        id: &str,
    ) -> Result<(), BackendError> {
        let mut state = self.state();
        let pending = state
            .endpoints
            .get_mut(endpoint)
            .and_then(|e| e.groups.get_mut(group))
            .and_then(|g| g.pending.get_mut(&id.parse().unwrap_or(0)));
        if let Some(p) = pending {
            p.0 = consumer.to_owned();
            p.2 = Instant::now();
        }
        Ok(())
    }

    async fn endpoint_settle(
        &self,
        endpoint: &str,
        group: &str,
        delivery: &EndpointDelivery,
        dead: Option<&str>,
    ) -> Result<(), BackendError> {
        let limit = self.shared.payload_limit;
        let mut state = self.state();
        let e = state.endpoints.entry(endpoint.to_owned()).or_default();
        if let Some(g) = e.groups.get_mut(group) {
            g.pending.remove(&delivery.id.parse().unwrap_or(0));
        }
        if let Some(reason) = dead {
            let (payload, truncated) = truncate_payload(&delivery.raw, limit);
            e.dead.push_back(DeadLetter {
                id: delivery.id.clone(),
                payload: payload.to_owned(),
                reason: reason.to_owned(),
                task_id: None,
                at: Timestamp::now(),
                truncated,
            });
            if e.dead.len() > ENDPOINT_DEAD_CAP {
                e.dead.pop_front();
            }
        }
        Ok(())
    }

    async fn endpoint_leave(
        &self,
        _endpoint: &str,
        _group: &str,
        _consumer: &str,
    ) -> Result<(), BackendError> {
        // Consumers are not registered here: what one holds is in the
        // group's pending list, under its name.
        Ok(())
    }

    async fn endpoint_trim(
        &self,
        endpoint: &str,
        _idle_consumers: Duration,
    ) -> Result<usize, BackendError> {
        let mut state = self.state();
        let Some(e) = state.endpoints.get_mut(endpoint) else {
            return Ok(0);
        };
        let Some(floor) = e
            .groups
            .values()
            .map(|g| g.pending.keys().next().copied().unwrap_or(g.last + 1))
            .min()
        else {
            return Ok(0);
        };
        let before = e.entries.len();
        e.entries.retain(|(id, _)| *id >= floor);
        Ok(before - e.entries.len())
    }

    async fn endpoint_dead_letters(&self, endpoint: &str) -> Result<Vec<DeadLetter>, BackendError> {
        Ok(self
            .state()
            .endpoints
            .get(endpoint)
            .map(|e| e.dead.iter().cloned().collect())
            .unwrap_or_default())
    }
}

#[async_trait]
impl Leases for MemoryBackend {
    async fn named_lease(
        &self,
        name: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let mut state = self.state();
        let now = Instant::now();
        match state.leases.get(name) {
            Some((holder, expires)) if *expires > now && holder != token => Ok(false),
            _ => {
                state
                    .leases
                    .insert(name.to_owned(), (token.to_owned(), now + ttl));
                Ok(true)
            }
        }
    }

    async fn release_named_lease(&self, name: &str, token: &str) -> Result<bool, BackendError> {
        let mut state = self.state();
        if matches!(state.leases.get(name), Some((holder, _)) if holder == token) {
            state.leases.remove(name);
            return Ok(true);
        }
        Ok(false)
    }
}

#[async_trait]
impl Tallies for MemoryBackend {
    async fn tally_check(&self, tally: &TallyRef, item: &str) -> Result<TallyCheck, BackendError> {
        let checked = {
            let mut state = self.state();
            let now = Instant::now();
            let Some(t) = state.tallies.get_mut(tally).filter(|t| t.expires > now) else {
                return Ok(TallyCheck::NoTally);
            };
            let late = t.deadline_passed;
            if !t.pending.remove(item) {
                return Ok(match t.checked.contains(item) {
                    true => TallyCheck::AlreadyChecked,
                    false => TallyCheck::UnknownItem,
                });
            }
            t.checked.insert(item.to_owned());
            if !t.pending.is_empty() {
                return Ok(TallyCheck::Counted {
                    remaining: t.pending.len() as u64,
                    late,
                });
            }
            t.complete = true;
            t.expires = t.expires.min(now + COMPLETED_TALLY_KEEP);
            let done = match late {
                true => t.completion_late.clone(),
                false => t.completion.clone(),
            };
            state.push_item(&WorkItem::Process(done), Duration::ZERO);
            TallyCheck::Completed { late }
        };
        self.queue_changed();
        Ok(checked)
    }

    async fn tally_progress(
        &self,
        tally: &TallyRef,
        missing: usize,
        mark_deadline: bool,
    ) -> Result<Option<TallyProgress>, BackendError> {
        let mut state = self.state();
        let now = Instant::now();
        let Some(t) = state.tallies.get_mut(tally).filter(|t| t.expires > now) else {
            return Ok(None);
        };
        if mark_deadline && !t.pending.is_empty() {
            t.deadline_passed = true;
        }
        Ok(Some(TallyProgress {
            total: (t.pending.len() + t.checked.len()) as u64,
            checked: t.checked.len() as u64,
            missing: t.pending.iter().take(missing).cloned().collect(),
            complete: t.complete,
            deadline_passed: t.deadline_passed,
        }))
    }
}

#[async_trait]
impl Breakers for MemoryBackend {
    async fn breaker_acquire(
        &self,
        name: &str,
        probe_ttl: Duration,
        token: &str,
    ) -> Result<BreakerDecision, BackendError> {
        let mut state = self.state();
        let breaker = state.breakers.entry(name.to_owned()).or_default();
        let now = Instant::now();
        let Some(open_until) = breaker.open_until else {
            return Ok(BreakerDecision::Call {
                probe: false,
                counting: breaker.failures > 0,
            });
        };
        if now < open_until {
            return Ok(BreakerDecision::Open {
                retry_after: open_until - now,
            });
        }
        if let Some(probe_until) = breaker.probe_until.filter(|until| now < *until) {
            return Ok(BreakerDecision::Open {
                retry_after: probe_until - now,
            });
        }
        breaker.probe_until = Some(now + probe_ttl);
        breaker.probe_token = token.to_owned();
        Ok(BreakerDecision::Call {
            probe: true,
            counting: false,
        })
    }

    async fn breaker_report(
        &self,
        name: &str,
        probe: Option<&str>,
        failed: Option<bool>,
        threshold: u32,
        open_for: Duration,
    ) -> Result<Option<BreakerChange>, BackendError> {
        let mut state = self.state();
        let breaker = state.breakers.entry(name.to_owned()).or_default();
        let now = Instant::now();
        if probe.is_some_and(|token| token != breaker.probe_token || breaker.probe_until.is_none())
        {
            return Ok(None);
        }
        let probe = probe.is_some();
        let Some(failed) = failed else {
            if probe {
                breaker.probe_until = None;
            }
            return Ok(None);
        };
        let opened = SharedBreaker {
            open_until: Some(now + open_for),
            ..SharedBreaker::default()
        };
        Ok(match (failed, probe) {
            (false, true) => {
                *breaker = SharedBreaker::default();
                Some(BreakerChange::Closed)
            }
            (false, false) => {
                breaker.failures = 0;
                None
            }
            (true, true) => {
                *breaker = opened;
                Some(BreakerChange::Opened)
            }
            // A call admitted before the breaker opened changes nothing.
            (true, false) if breaker.open_until.is_some() => None,
            (true, false) => {
                breaker.failures += 1;
                (breaker.failures >= threshold).then(|| {
                    *breaker = opened;
                    BreakerChange::Opened
                })
            }
        })
    }
}

#[async_trait]
impl Housekeeping for MemoryBackend {
    async fn housekeep(&self, retention: &Retention) -> Result<Housekept, BackendError> {
        let mut state = self.state();
        let now = Instant::now();
        let mut expired: Vec<TaskId> = state
            .expiry
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(id, _)| *id)
            .collect();
        expired.truncate(retention.batch);
        for id in &expired {
            state.remove_task(*id);
        }
        let before = state.dead.len();
        if let Some(keep) = retention.dead_letters {
            let cutoff = Timestamp::now().0.saturating_sub(keep.as_millis() as u64);
            state.dead.retain(|d| d.at.0 >= cutoff);
        }
        // Oldest first, but the letter of a task still parked stays: it is
        // what an operator requeues the task by.
        let mut excess = state.dead.len().saturating_sub(retention.dead_letters_max);
        let parked: HashSet<TaskId> = state
            .tasks
            .values()
            .filter(|t| t.status == TaskStatus::DeadLettered)
            .map(|t| t.id)
            .collect();
        state.dead.retain(|d| {
            let keep = excess == 0 || d.task_id.is_some_and(|t| parked.contains(&t));
            if !keep {
                excess -= 1;
            }
            keep
        });
        Ok(Housekept {
            tasks: expired.len(),
            dead_letters: before - state.dead.len(),
            consumers: 0,
            tallies: 0,
            relayed: 0,
        })
    }
}
