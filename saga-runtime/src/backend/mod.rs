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

pub mod memory;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use crate::model::envelope::Envelope;
use crate::model::tally::{TallyCheck, TallyProgress, TallyRef};
use crate::model::task::{TaskId, TaskInstance, TaskStatus, Timestamp};

pub use crate::model::process::{
    InstanceStatus, ProcessAudit, ProcessAuditAction, ProcessInstance,
};
pub use crate::model::tally::TallyOpen;
pub use crate::model::wire::{QueueMessage, WorkItem};

/// A held task lock: a lease, not a mutex. It expires after its TTL unless
/// extended, and a newer lease makes this one's writes fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The task locked.
    pub task_id: TaskId,
    /// Random token that only this holder knows; release and extension
    /// compare it.
    pub token: String,
    /// Monotonically increasing per task: every acquisition gets a larger one.
    pub fence: u64,
}

/// A message handed to a worker; settle it (commit, acknowledge,
/// dead-letter) or release it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Backend-assigned id (for Redis: partition and stream entry id).
    pub id: String,
    /// The decoded message, or why the entry could not be decoded.
    pub item: Result<WorkItem, String>,
    /// The entry as text (lossy for bytes that are not UTF-8), kept for the
    /// dead-letter queue and logs.
    pub raw: String,
    /// Deliveries of this message that were not answered (neither settled
    /// nor released by a live worker), this one included: 1 for a first
    /// delivery. A worker that dies while handling it (a poison message that
    /// aborts the process) leaves its delivery unanswered; the engine
    /// dead-letters a message once this exceeds its cap.
    pub deliveries: u32,
    /// The consumer it was delivered to.
    pub consumer: String,
    /// The lease on the message's task, when the backend tried to take it
    /// in the same round trip as the read (the Redis backend does, for a
    /// saga message whose task exists). `None`: the worker takes it itself
    /// with [`TaskStore::lock_and_load`]. A taken lease belongs to the
    /// worker the message was delivered to: it releases it whatever it
    /// does with the message.
    pub lease: Option<TakenLease>,
    /// The process-manager instance the message is for, when the backend
    /// loaded it in the same round trip as the read (the Redis backend
    /// does, for an envelope that names its instance or carries its
    /// routing key). `None`: the worker loads it.
    pub instance: Option<Box<LoadedInstance>>,
}

/// A process-manager instance loaded while delivering a message for it.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedInstance {
    /// What it was looked up by: an instance id, or a value of `key_field`.
    pub key: String,
    /// The state property `key` is a value of; `None` for an instance id.
    pub key_field: Option<String>,
    /// The instance found, if any.
    pub instance: Option<ProcessInstance>,
}

impl LoadedInstance {
    /// The same record as found by `lookup` (an id, or a value of a field
    /// it holds), if that lookup finds it; `None` if it cannot tell.
    pub(crate) fn found_by(self, lookup: (String, Option<&str>)) -> Option<LoadedInstance> {
        match lookup {
            (key, None) if key == self.key && self.key_field.is_none() => Some(self),
            (value, Some(field)) => {
                let holds = self
                    .instance
                    .as_ref()?
                    .keys
                    .iter()
                    .any(|(f, v)| f == field && *v == value);
                holds.then(|| LoadedInstance {
                    key: value,
                    key_field: Some(field.to_owned()),
                    instance: self.instance,
                })
            }
            _ => None,
        }
    }
}

/// A task lease taken while delivering the task's message.
#[derive(Debug, Clone)]
pub enum TakenLease {
    /// The lease is held, and the task loaded under it.
    Held {
        /// What [`TaskStore::lock_and_load`] would have returned.
        locked: Box<Locked>,
        /// When the read that took it was sent: the lease runs from then
        /// at the latest.
        requested_at: tokio::time::Instant,
        /// How long it was taken for (the backend's visibility timeout,
        /// which may differ from the engine's lease TTL).
        ttl: Duration,
    },
    /// Another worker holds the task's lease.
    Busy,
}

/// What [`TaskStore::heartbeat`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Whether the lease is still held (and was extended).
    pub lock_held: bool,
    /// When cancellation was requested, if it was.
    pub cancel_requested: Option<Timestamp>,
}

/// A message parked for manual inspection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Id to requeue or inspect it by.
    pub id: String,
    /// The raw payload as it was received, cut to the backend's size limit
    /// (see `truncated`).
    pub payload: String,
    /// Why it was parked.
    pub reason: String,
    /// The task it concerns, when the payload named one.
    pub task_id: Option<TaskId>,
    /// When it was parked.
    pub at: Timestamp,
    /// The payload's size in bytes before it was cut, when it was: a huge
    /// garbage message keeps only a prefix, and cannot be requeued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<usize>,
}

/// How a write settles the message being processed.
#[derive(Debug, Clone, Copy)]
pub enum Settle<'a> {
    /// Nothing to settle (an operator action, not a delivery).
    Nothing,
    /// Acknowledge it: its effect is recorded.
    Ack(&'a Delivery),
    /// Acknowledge it and park a copy on the dead-letter queue.
    DeadLetter(&'a Delivery, &'a str),
    /// Remove this entry from the dead-letter queue: an operator requeued
    /// its task, and the commit enqueues the task's next message.
    ResolveDeadLetter(&'a str),
}

/// The message a task commit enqueues: now, or after a delay (a retry's
/// backoff). A delayed message is durable: no worker waits for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Next {
    /// The message.
    pub message: QueueMessage,
    /// How long until it may be delivered.
    pub delay: Duration,
}

/// One atomic write of the saga protocol: the task, the message that
/// advances it next, the settlement of the current message, and the release
/// of the lease.
#[derive(Debug, Clone)]
pub struct TaskCommit<'a> {
    /// The task to write (checked against its stored `version`).
    pub task: &'a TaskInstance,
    /// The status stored now, under `task.version` (what the task was
    /// loaded with): a backend that indexes tasks by status moves the entry.
    pub stored_status: TaskStatus,
    /// The lease it was changed under (checked against the latest fence).
    pub lease: &'a Lease,
    /// The next message, if the task goes on.
    pub next: Option<Next>,
    /// What to do with the message being handled.
    pub settle: Settle<'a>,
    /// Refuse the write with [`BackendError::CancelRequested`] if
    /// cancellation of the task was requested: a worker passes it when it
    /// ends a running task another way (completed, failed), so that an
    /// accepted cancellation is never overtaken.
    pub unless_cancelled: bool,
    /// Remove every key of the task this long after the write (set when the
    /// task reaches a terminal status and retention is configured). `None`
    /// keeps the task (and undoes an earlier expiry, for a requeued task).
    pub expire_after: Option<Duration>,
}

/// The write a worker makes when it goes on with a task it holds, after an
/// attempt whose outcome calls for another one at once: the outcome of the
/// last attempt and the start of the next, in one write, under the lease
/// it already holds and the same message. This is what lets a chain of
/// steps cost one round trip per step: no acknowledgement, no new message,
/// no new lease. The message stays pending (kept alive by the write), so a
/// crash anywhere still leaves it to be delivered again.
#[derive(Debug, Clone, Copy)]
pub struct NextAttempt<'a> {
    /// The task, with the outcome and the new attempt applied (checked
    /// against its stored `version`).
    pub task: &'a TaskInstance,
    /// The status stored under `task.version`.
    pub stored_status: TaskStatus,
    /// The lease held (checked against the latest fence).
    pub lease: &'a Lease,
    /// The new attempt's claim (unique per task).
    pub claim: &'a str,
    /// The message being handled.
    pub delivery: &'a Delivery,
    /// Renew the lease for this long and keep the message from being
    /// delivered again, as a heartbeat does; `None` when the last renewal
    /// is recent (a chain of quick steps needs none).
    pub renew: Option<Duration>,
    /// Refuse the write with [`BackendError::CancelRequested`] if
    /// cancellation of the task was requested: the worker then applies the
    /// cancellation instead of starting another step.
    pub unless_cancelled: bool,
}

/// What [`TaskStore::lock_and_load`] returns when the lock was free.
#[derive(Debug, Clone)]
pub struct Locked {
    /// The lease now held.
    pub lease: Lease,
    /// A fresh copy of the task, if it exists.
    pub task: Option<TaskInstance>,
    /// When cancellation was requested, if it was.
    pub cancel_requested: Option<Timestamp>,
}

impl Locked {
    /// The answer for a task that does not exist: no lease was taken (fence
    /// 0 holds nothing).
    pub fn missing(task_id: TaskId) -> Self {
        Locked {
            lease: Lease {
                task_id,
                token: String::new(),
                fence: 0,
            },
            task: None,
            cancel_requested: None,
        }
    }
}

/// What [`TaskStore::create_task`] did.
#[derive(Debug, Clone)]
pub enum Created {
    /// The task was stored and its first message enqueued.
    New,
    /// A task with this id already existed (a retried start, or a start
    /// with a reused key); nothing was written. Here it is.
    Existing(Box<TaskInstance>),
}

/// Where a page of tasks starts: strictly after this task in the listing
/// order (newest first: `created_at` descending, then id descending).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskCursor {
    /// The last listed task's creation time.
    pub created_at: Timestamp,
    /// The last listed task's id.
    pub id: TaskId,
}

impl TaskCursor {
    /// The cursor just after `task`.
    pub fn after(task: &TaskInstance) -> Self {
        TaskCursor {
            created_at: task.created_at,
            id: task.id,
        }
    }

    /// Whether `task` comes after the cursor in the listing order.
    pub fn precedes(&self, task: &TaskInstance) -> bool {
        (task.created_at, task.id) < (self.created_at, self.id)
    }
}

impl std::fmt::Display for TaskCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.created_at.0, self.id)
    }
}

impl std::str::FromStr for TaskCursor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{s}` is not a task cursor");
        let (ms, id) = s.split_once('.').ok_or_else(bad)?;
        Ok(TaskCursor {
            created_at: Timestamp(ms.parse().map_err(|_| bad())?),
            id: id.parse().map_err(|_| bad())?,
        })
    }
}

/// One page of the tasks of one saga, as [`TaskStore::list_tasks`] asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskQuery {
    /// The saga.
    pub saga: String,
    /// Only tasks in this status.
    pub status: Option<TaskStatus>,
    /// Only tasks created at or after this time.
    pub created_from: Option<Timestamp>,
    /// Only tasks created before this time.
    pub created_to: Option<Timestamp>,
    /// Only tasks after this one in the listing order.
    pub after: Option<TaskCursor>,
    /// At most this many (a backend may cap it).
    pub limit: usize,
}

impl TaskQuery {
    /// Whether `task` matches every filter but the cursor and the limit.
    pub fn matches(&self, task: &TaskInstance) -> bool {
        task.saga == self.saga
            && self.status.is_none_or(|s| s == task.status)
            && self.created_from.is_none_or(|t| task.created_at >= t)
            && self.created_to.is_none_or(|t| task.created_at < t)
            && self.after.is_none_or(|c| c.precedes(task))
    }
}

/// One page of dead letters, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterQuery {
    /// Only entries after (older than) this one.
    pub after: Option<String>,
    /// At most this many.
    pub limit: usize,
}

/// A page of results and where the next one starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The items, in listing order.
    pub items: Vec<T>,
    /// Pass it back to get the next page; `None` on the last page.
    pub next: Option<String>,
}

/// What [`Housekeeping::housekeep`] is asked to remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Dead letters older than this are removed (`None`: kept).
    pub dead_letters: Option<Duration>,
    /// At most this many dead letters are kept (per partition); older ones
    /// go first.
    pub dead_letters_max: usize,
    /// Consumers of the work queue that have held no message for this long
    /// are removed from their group (they belonged to workers that left).
    pub idle_consumers: Duration,
    /// At most this many expired tasks are removed per call.
    pub batch: usize,
}

/// What one [`Housekeeping::housekeep`] call removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Housekept {
    /// Expired tasks whose keys and index entries were removed.
    pub tasks: usize,
    /// Dead letters removed.
    pub dead_letters: usize,
    /// Idle consumers removed.
    pub consumers: usize,
    /// Tally completions sent here: each tally's last item was checked by
    /// a checker that stopped before sending it (a backend whose check is
    /// one atomic step never has any).
    pub tallies: usize,
    /// Messages for endpoints relayed here: a process-manager commit left
    /// them for an endpoint in another slot, and the process that made it
    /// stopped before relaying them (a backend that writes endpoints in
    /// the commit never has any).
    pub relayed: usize,
}

/// One atomic write of the process-manager protocol: the instance (created,
/// updated or deleted), its correlation entries, the messages its handler
/// sent, published and scheduled, and the settlement of the message.
#[derive(Debug, Clone)]
pub struct ProcessCommit<'a> {
    /// The instance to write (`version` is the one it was loaded with; 0 to
    /// create), unless `None`.
    pub instance: Option<&'a ProcessInstance>,
    /// The id of the message this write handles. The write is refused with
    /// [`BackendError::ProcessTombstoned`] if a deleted instance with this
    /// id, or one that owned a correlation entry being claimed, handled
    /// that message: a late duplicate must neither start the process again
    /// nor reach the instance created after it.
    pub handling: Option<&'a str>,
    /// When deleting: how long the tombstone remembers the message ids the
    /// instance handled (its `processed` list).
    pub tombstone_ttl: Duration,
    /// Delete the instance (and its correlation entries) instead of writing it.
    pub delete: bool,
    /// Correlation entries to claim for the instance: a value already owned
    /// by another instance is a conflict. The instance lists every entry
    /// it holds in its [`keys`](ProcessInstance::keys) (the engine keeps
    /// them so): a store whose entries and instances live apart finds an
    /// instance by an entry only if the instance lists it.
    pub add_keys: Vec<(String, String)>,
    /// Correlation entries to release.
    pub remove_keys: Vec<(String, String)>,
    /// Shared correlation entries (fields `#[handles(many)]` correlates
    /// by: a set of instances per value) to join...
    pub add_shared: Vec<(String, String)>,
    /// ... and to leave.
    pub remove_shared: Vec<(String, String)>,
    /// Process-manager envelopes to enqueue.
    pub enqueue: Vec<Envelope>,
    /// Messages for endpoints: `(endpoint, payload)`.
    pub endpoints: Vec<(String, String)>,
    /// Envelopes to deliver later: `(due, wall-clock ms; envelope)`.
    pub schedule: Vec<(u64, Envelope)>,
    /// Tallies the handler opened. One that exists already refuses the
    /// whole write ([`BackendError::TallyExists`]).
    pub tallies: Vec<TallyOpen>,
    /// What to do with the message being handled.
    pub settle: Settle<'a>,
    /// Further messages of the instance this write applies after the one
    /// it handles (messages that waited for it in this process): each is
    /// checked against tombstones like [`handling`](Self::handling) and
    /// acknowledged with the write.
    pub batched: Vec<Batched<'a>>,
}

/// What a process-manager message is for, as the worker found it before
/// handling it: where [`WorkQueue::forward`] sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardTo<'a> {
    /// This instance.
    Instance(&'a str),
    /// No instance holds this correlation value (yet): the message may
    /// create one.
    Value(&'a str),
}

/// A message a [`ProcessCommit`] applies besides the one it handles.
#[derive(Debug, Clone, Copy)]
pub struct Batched<'a> {
    /// Its message id.
    pub message_id: &'a str,
    /// Its delivery, acknowledged by the write.
    pub delivery: &'a Delivery,
}

impl ProcessCommit<'_> {
    /// The ids of the messages the write handles: the tombstones must
    /// remember none of them.
    pub fn handled_ids(&self) -> impl Iterator<Item = &str> {
        self.handling
            .into_iter()
            .chain(self.batched.iter().map(|b| b.message_id))
    }
}

impl<'a> ProcessCommit<'a> {
    /// A write of `instance` (or of nothing but effects, with `None`) that
    /// settles the message as `settle`, with nothing else: fill in the rest.
    pub fn new(instance: Option<&'a ProcessInstance>, settle: Settle<'a>) -> Self {
        ProcessCommit {
            instance,
            handling: None,
            tombstone_ttl: Duration::ZERO,
            delete: false,
            add_keys: Vec::new(),
            remove_keys: Vec::new(),
            add_shared: Vec::new(),
            remove_shared: Vec::new(),
            enqueue: Vec::new(),
            endpoints: Vec::new(),
            schedule: Vec::new(),
            tallies: Vec::new(),
            settle,
            batched: Vec::new(),
        }
    }
}

/// The error type of backend failures that come from below (a dropped
/// connection, a refused command): kept as the source of
/// [`BackendError::Unavailable`].
pub type SourceError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A backend failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The instance would be created by a message a deleted instance with
    /// its id or correlation already handled: a late duplicate.
    #[error("process `{process}`: instance `{instance}` was deleted after handling this message")]
    ProcessTombstoned {
        /// The process manager.
        process: String,
        /// The instance.
        instance: String,
    },
    /// A handler opened a tally its instance had opened before.
    #[error("{0} is already open: give each tally of an instance its own name")]
    TallyExists(TallyRef),
    /// The stored version is not the one the write was based on.
    #[error("task {task}: version conflict (expected {expected}, found {actual})")]
    Conflict {
        /// The task.
        task: TaskId,
        /// The version the write was based on.
        expected: u64,
        /// The stored version.
        actual: u64,
    },
    /// The lease is no longer the latest for the task: another worker took
    /// the lock after it expired. The write was refused.
    #[error("task {task}: lock lost (fencing token {fence} is stale)")]
    LockLost {
        /// The task.
        task: TaskId,
        /// The stale fencing token.
        fence: u64,
    },
    /// The task does not exist.
    #[error("task {0} does not exist")]
    NotFound(TaskId),
    /// A commit with `unless_cancelled` found a cancellation request.
    #[error("task {task}: cancellation was requested")]
    CancelRequested {
        /// The task.
        task: TaskId,
        /// When cancellation was requested.
        at: Timestamp,
    },
    /// Another write to the process-manager instance (or to one of the
    /// correlation entries it claims) came first.
    #[error("process `{process}` instance `{instance}`: a concurrent write came first")]
    ProcessConflict {
        /// The process manager.
        process: String,
        /// The instance.
        instance: String,
    },
    /// The message a process-manager write settles is in another partition
    /// than the instance it writes (a backend that keeps partitions apart,
    /// like Redis Cluster, cannot write both at once): the worker hands it
    /// back, and forwards it to the instance's partition on its next
    /// delivery.
    #[error("process `{process}` instance `{instance}`: the message is in another partition than the instance")]
    ProcessElsewhere {
        /// The process manager.
        process: String,
        /// The instance.
        instance: String,
    },
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

impl BackendError {
    /// [`BackendError::Unavailable`] from any error or message.
    pub fn unavailable(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        BackendError::Unavailable(Arc::from(error.into()))
    }

    /// Whether retrying the same call may succeed (the backend was
    /// unreachable), as opposed to a refusal that will not change.
    pub fn is_transient(&self) -> bool {
        matches!(self, BackendError::Unavailable(_))
    }
}

/// Task records, their leases and their cancellation flags.
#[async_trait]
pub trait TaskStore: Send + Sync + 'static {
    /// Stores a new task (version 0 -> 1) and enqueues `first`, atomically;
    /// if a task with that id exists, writes nothing and returns it, so a
    /// caller may retry a start whose reply was lost.
    async fn create_task(
        &self,
        task: &TaskInstance,
        first: &QueueMessage,
    ) -> Result<Created, BackendError>;

    /// A fresh copy of the task.
    async fn load_task(&self, id: TaskId) -> Result<Option<TaskInstance>, BackendError>;

    /// One page of the tasks of one saga, newest first.
    async fn list_tasks(&self, query: &TaskQuery) -> Result<Vec<TaskInstance>, BackendError>;

    /// How many retained tasks of `saga` are in each status (statuses
    /// with none may be left out). The default reads every task through
    /// [`list_tasks`](Self::list_tasks); a backend with per-status
    /// indexes answers from their sizes.
    async fn count_tasks(&self, saga: &str) -> Result<Vec<(TaskStatus, usize)>, BackendError> {
        let mut counts = std::collections::BTreeMap::<usize, (TaskStatus, usize)>::new();
        let mut query = TaskQuery {
            saga: saga.to_owned(),
            status: None,
            created_from: None,
            created_to: None,
            after: None,
            limit: 1000,
        };
        loop {
            let page = self.list_tasks(&query).await?;
            for task in &page {
                let rank = TaskStatus::ALL.iter().position(|s| *s == task.status);
                counts
                    .entry(rank.unwrap_or(0))
                    .or_insert((task.status, 0))
                    .1 += 1;
            }
            match page.last() {
                Some(last) if page.len() == query.limit => {
                    query.after = Some(TaskCursor::after(last))
                }
                _ => return Ok(counts.into_values().collect()),
            }
        }
    }

    /// Takes the task's lock if it is free (no waiting) and loads the task
    /// and its cancellation flag: what a worker needs first, in one round
    /// trip where the backend allows. For a task that does not exist it
    /// takes nothing (a stray message must not leave keys behind) and
    /// returns `task: None` with a lease of fence 0 that holds nothing.
    async fn lock_and_load(
        &self,
        id: TaskId,
        ttl: Duration,
    ) -> Result<Option<Locked>, BackendError>;

    /// Records an attempt before its call: writes `task` if the stored
    /// version is `task.version` and `lease` holds the latest fence, and
    /// claims `claim` (an attempt's name, unique per task) in the same step.
    /// Returns the new version and whether the claim was won; the write
    /// happens even when the claim is lost. Claims live as long as the task.
    /// `stored_status` is the status stored under `task.version`.
    async fn record_attempt(
        &self,
        task: &TaskInstance,
        stored_status: TaskStatus,
        lease: &Lease,
        claim: &str,
    ) -> Result<(u64, bool), BackendError>;

    /// Records the next attempt of a task the worker goes on with (see
    /// [`NextAttempt`]): like [`record_attempt`](Self::record_attempt),
    /// and in the same atomic write the lease is renewed and the message
    /// kept alive (if asked), and the write refused if `unless_cancelled`
    /// and cancellation was requested. Returns the new version and whether the claim was
    /// won.
    ///
    /// The default makes three calls (the cancellation flag, the record,
    /// a heartbeat); a backend should do it in one round trip.
    async fn record_next_attempt(
        &self,
        next: NextAttempt<'_>,
    ) -> Result<(u64, bool), BackendError> {
        if next.unless_cancelled {
            if let Some(at) = self.cancel_requested(next.task.id).await? {
                return Err(BackendError::CancelRequested {
                    task: next.task.id,
                    at,
                });
            }
        }
        let recorded = self
            .record_attempt(next.task, next.stored_status, next.lease, next.claim)
            .await?;
        if let Some(ttl) = next.renew {
            let _ = self.heartbeat(next.lease, next.delivery, ttl).await?;
        }
        Ok(recorded)
    }

    /// Writes a [`TaskCommit`] atomically and releases its lease; returns
    /// the new version.
    async fn commit(&self, commit: TaskCommit<'_>) -> Result<u64, BackendError>;

    /// Called about once a second while a step runs: extends the lease by
    /// `ttl`, keeps the message from being redelivered and reports a
    /// cancellation requested in any process.
    async fn heartbeat(
        &self,
        lease: &Lease,
        delivery: &Delivery,
        ttl: Duration,
    ) -> Result<Heartbeat, BackendError>;

    /// Releases a held lock; `false` (and no effect) if `lease` no longer
    /// holds it.
    async fn unlock(&self, lease: &Lease) -> Result<bool, BackendError>;

    /// Records a cancellation request and enqueues `wake`, so that a task
    /// waiting for a delayed retry is cancelled now rather than when the
    /// retry falls due. `token` identifies this request: if the flag is
    /// already set by the same token (a retried call whose reply was lost),
    /// this returns `None` as for the first request. Returns when an earlier
    /// request was made otherwise. Records nothing for a task that does not
    /// exist.
    async fn request_cancel(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
    ) -> Result<Option<Timestamp>, BackendError>;

    /// When cancellation of the task was requested, if it was.
    async fn cancel_requested(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError>;

    /// Cancellation requests as they are made, from any process (best effort:
    /// running steps also see the flag through their heartbeat).
    async fn cancellations(&self) -> Result<BoxStream<'static, TaskId>, BackendError>;

    /// Waits until the task may have changed, or `timeout` passed.
    async fn wait_for_change(&self, id: TaskId, timeout: Duration) {
        let _ = id;
        tokio::time::sleep(timeout).await;
    }
}

/// The kinds of work a worker takes: an engine that runs no process
/// managers must not take (and dead-letter) their messages, nor one that
/// runs no sagas saga messages, when deployments share a Redis. An entry
/// that does not decode is for anyone (to dead-letter with the reason); on
/// Redis, for the workers that read the stream it was written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    /// Saga task messages.
    pub sagas: bool,
    /// Process-manager messages and timeouts.
    pub processes: bool,
    /// Which process-manager partitions, a bit each, as
    /// [`Leases::process_partitions`] handed them out (every one by
    /// default). A backend that does not partition ignores it.
    pub process_partitions: u64,
}

impl Interest {
    /// Every kind.
    pub const ALL: Interest = Interest {
        sagas: true,
        processes: true,
        process_partitions: u64::MAX,
    };

    /// Whether a worker with this interest takes `item`.
    pub fn takes(&self, item: &Result<WorkItem, String>) -> bool {
        match item {
            Ok(WorkItem::Process(_)) => self.processes,
            Ok(WorkItem::Saga(_)) => self.sagas,
            Err(_) => true,
        }
    }
}

/// The backlog of the work queue ([`WorkQueue::queue_stats`]), by kind of
/// message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Saga task messages (and entries that decode as nothing).
    pub sagas: QueueBacklog,
    /// Process-manager messages and timeouts.
    pub processes: QueueBacklog,
}

/// The backlog of one kind of message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueBacklog {
    /// Messages on the queue and not yet settled: waiting to be taken, or
    /// taken and being worked on. Delayed messages (retry backoffs,
    /// timeouts) count once they are due and on the queue.
    pub depth: u64,
    /// How long the oldest of them has been on the queue (since it was
    /// enqueued, or last handed back); `None` when there are none.
    pub oldest: Option<Duration>,
}

/// The work queue: [`WorkItem`]s delivered to workers, redelivered when not
/// settled within the visibility timeout, delayed, or dead-lettered.
#[async_trait]
pub trait WorkQueue: Send + Sync + 'static {
    /// How long a delivered, unsettled message stays invisible before it is
    /// delivered again. The engine sizes its task leases on it, so that a
    /// dead worker's tasks resume on the order of this timeout.
    fn visibility_timeout(&self) -> Duration;

    /// Enqueues messages (publishing process-manager messages from outside
    /// a handler).
    async fn enqueue(&self, items: &[WorkItem]) -> Result<(), BackendError>;

    /// Enqueues an entry as it is, without encoding: for bridges and for
    /// tests of bad input. An entry that does not decode is delivered with
    /// an error `item`.
    async fn enqueue_raw(&self, payload: &[u8]) -> Result<(), BackendError>;

    /// The next message of a kind in `interest`, waiting up to `wait` for
    /// one. Messages of other kinds stay for workers that take them.
    async fn receive(
        &self,
        consumer: &str,
        interest: Interest,
        wait: Duration,
    ) -> Result<Option<Delivery>, BackendError>;

    /// Up to `max` messages of kinds in `interest`, waiting up to `wait`
    /// for any: the worker works on all of them at once, so a backend
    /// hands out only what is to be started now. `in_flight` messages
    /// delivered to `consumer` are still being worked on: a backend that
    /// re-reads a consumer's own unsettled messages (after a read whose
    /// reply was lost) must not hand those out again. The default receives
    /// one; a network backend should read several in one round trip.
    async fn receive_many(
        &self,
        consumer: &str,
        interest: Interest,
        wait: Duration,
        max: usize,
        in_flight: usize,
    ) -> Result<Vec<Delivery>, BackendError> {
        let _ = (max, in_flight);
        Ok(self
            .receive(consumer, interest, wait)
            .await?
            .into_iter()
            .collect())
    }

    /// Keeps an in-flight message from being redelivered while it is worked
    /// on.
    async fn touch(&self, delivery: &Delivery) -> Result<(), BackendError>;

    /// Acknowledges a message: it will not be delivered again.
    async fn ack(&self, delivery: &Delivery) -> Result<(), BackendError>;

    /// Hands a message back unsettled, to be delivered again after `delay`
    /// (promptly: not after the visibility timeout). The delivery counts as
    /// answered.
    async fn release(&self, delivery: &Delivery, delay: Duration) -> Result<(), BackendError>;

    /// Hands a message back like [`release`](Self::release), but its
    /// delivery counts as unanswered: for a message this worker cannot
    /// handle (its saga is not deployed here yet), so that one no worker
    /// can handle still reaches the delivery cap.
    async fn defer(&self, delivery: &Delivery, delay: Duration) -> Result<(), BackendError>;

    /// Moves a process-manager message off a partition this worker's engine
    /// owns (see [`Leases::process_partitions`]) onto the stream every
    /// engine reads: for a message of a process manager the owner does not
    /// run, which an engine that runs it must get. `false`: the message was
    /// on that stream already, or this backend does not partition; the
    /// caller then hands it back as usual.
    async fn share(&self, delivery: &Delivery) -> Result<bool, BackendError> {
        let _ = delivery;
        Ok(false)
    }

    /// Moves a process-manager message to the partition of what it is for
    /// (`to`: the instance the worker found, or the correlation value it
    /// may create one under), if that is another than the one it was read
    /// from: a backend whose partitions are apart (Redis Cluster) commits
    /// an instance only together with a message of the instance's own
    /// partition. `false`: it is where it belongs (always, for a backend
    /// that keeps every partition together); the caller handles it.
    /// `true`: it was moved (naming the instance from then on, and as a
    /// delivery that was not answered, so that a message that moves for
    /// ever still reaches the delivery cap), and this delivery is settled.
    async fn forward(
        &self,
        delivery: &Delivery,
        envelope: &Envelope,
        to: ForwardTo<'_>,
    ) -> Result<bool, BackendError> {
        let _ = (delivery, envelope, to);
        Ok(false)
    }

    /// `consumer` is leaving (a graceful shutdown): hands back what was
    /// delivered to it and not handed out yet, so that nothing waits out
    /// the visibility timeout.
    async fn leave(&self, consumer: &str) -> Result<(), BackendError> {
        let _ = consumer;
        Ok(())
    }

    /// Acknowledges a message and parks a copy on the dead-letter queue.
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &str,
        task_id: Option<TaskId>,
    ) -> Result<(), BackendError>;

    /// Moves delayed messages that fell due onto the queue, at most `limit`;
    /// returns how many moved. Backends that promote them on `receive` may
    /// return 0.
    async fn release_due(&self, limit: usize) -> Result<usize, BackendError>;

    /// A page of parked messages, newest first.
    async fn dead_letters(&self, query: &DeadLetterQuery)
        -> Result<Page<DeadLetter>, BackendError>;

    /// One parked message.
    async fn dead_letter_by_id(&self, id: &str) -> Result<Option<DeadLetter>, BackendError>;

    /// Moves a parked message back onto the work queue, atomically; returns
    /// it, or `None` if there is no such entry.
    async fn requeue_dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, BackendError>;

    /// Removes a parked message for good; whether it was there.
    async fn discard_dead_letter(&self, id: &str) -> Result<bool, BackendError>;

    /// How many messages are parked. The default pages through
    /// [`dead_letters`](Self::dead_letters); a backend that knows its
    /// queue's length answers at once.
    async fn dead_letter_count(&self) -> Result<usize, BackendError> {
        let mut query = DeadLetterQuery {
            after: None,
            limit: 1000,
        };
        let mut count = 0;
        loop {
            let page = self.dead_letters(&query).await?;
            count += page.items.len();
            match page.next {
                Some(next) => query.after = Some(next),
                None => return Ok(count),
            }
        }
    }

    /// The queue's backlog, for the `saga_queue_*` metrics: every engine
    /// running workers asks once per housekeeping interval, so it must be
    /// cheap (one round trip, no scan of the messages). `None`, the
    /// default: this backend cannot tell.
    async fn queue_stats(&self) -> Result<Option<QueueStats>, BackendError> {
        Ok(None)
    }
}

/// Process-manager instances, their correlation index and timeouts.
#[async_trait]
pub trait ProcessStore: Send + Sync + 'static {
    /// The instance `id` of process manager `process`.
    async fn process_load(
        &self,
        process: &str,
        id: &str,
    ) -> Result<Option<ProcessInstance>, BackendError>;

    /// An id for a new instance of `process` found by correlation value
    /// `near` (one it does not take its id from): random, and for a
    /// backend whose partitions are apart, in the partition of `near`, so
    /// that the instance and its correlation entry share one.
    fn new_instance_id(&self, process: &str, near: &str) -> String {
        let _ = (process, near);
        uuid::Uuid::new_v4().to_string()
    }

    /// The instance owning the correlation entry `(field, value)`.
    async fn process_find(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Option<ProcessInstance>, BackendError>;

    /// The ids of the instances that share the value `value` of the state
    /// field `field` (one `#[handles(many)]` correlates by).
    async fn process_find_shared(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Vec<String>, BackendError>;

    /// Every instance of a process manager (for operators and tests).
    async fn process_list(&self, process: &str) -> Result<Vec<ProcessInstance>, BackendError>;

    /// About `limit` instances of a process manager from where `after` (a
    /// [`Page::next`] of this call) left off, in no promised order. The
    /// default sorts [`process_list`](Self::process_list) by id; a backend
    /// with a cursor over its set (Redis `SSCAN`) reads only one page.
    async fn process_page(
        &self,
        process: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<ProcessInstance>, BackendError> {
        let mut all = self.process_list(process).await?;
        all.sort_by(|a, b| a.id.cmp(&b.id));
        let rest: Vec<_> = all
            .into_iter()
            .filter(|i| after.is_none_or(|after| i.id.as_str() > after))
            .collect();
        let more = rest.len() > limit;
        let items: Vec<_> = rest.into_iter().take(limit).collect();
        let next = more.then(|| items.last().map(|i| i.id.clone())).flatten();
        Ok(Page { items, next })
    }

    /// Writes a [`ProcessCommit`] atomically; returns the instance's new
    /// version (0 when deleted or not written). A version mismatch, an
    /// existing instance when creating, or a correlation entry owned by
    /// another instance is a [`BackendError::ProcessConflict`].
    async fn process_commit(
        &self,
        process: &str,
        commit: ProcessCommit<'_>,
    ) -> Result<u64, BackendError>;

    /// Moves scheduled envelopes due at `now_ms` onto the queue, at most
    /// `limit`, each exactly once (even with several pollers); returns how
    /// many moved.
    async fn process_release_due(&self, now_ms: u64, limit: usize) -> Result<usize, BackendError>;

    /// The scheduled envelopes: `(due ms, envelope)`, soonest first.
    async fn process_scheduled(&self) -> Result<Vec<(u64, Envelope)>, BackendError>;

    /// The messages sent to an endpoint, oldest first (for consumers that
    /// read it, and tests).
    async fn endpoint_messages(&self, endpoint: &str) -> Result<Vec<String>, BackendError>;
}

/// Tallies ([`crate::process::tally`]): opened by a [`ProcessCommit`],
/// checked and read here. Every operation is one atomic step.
#[async_trait]
pub trait Tallies: Send + Sync + 'static {
    /// Checks `item` off: idempotent per item. The check of the last item
    /// enqueues the tally's completion envelope in the same atomic step,
    /// so it is sent exactly once.
    async fn tally_check(&self, tally: &TallyRef, item: &str) -> Result<TallyCheck, BackendError>;

    /// The tally's progress with at most `missing` unchecked items;
    /// `mark_deadline` records (first) that its deadline has passed, unless
    /// it is complete. `None` when it does not exist.
    async fn tally_progress(
        &self,
        tally: &TallyRef,
        missing: usize,
        mark_deadline: bool,
    ) -> Result<Option<TallyProgress>, BackendError>;
}

/// One message of an endpoint, delivered to a consumer of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointDelivery {
    /// Its id in the endpoint.
    pub id: String,
    /// The envelope as stored.
    pub raw: String,
    /// Deliveries to the group so far, this one included.
    pub deliveries: u32,
}

/// Endpoints ([`crate::endpoint`]): streams written by process-manager
/// commits, read by consumer groups.
#[async_trait]
pub trait Endpoints: Send + Sync + 'static {
    /// The next message of `endpoint` for `consumer` of `group` (a group
    /// that does not exist yet is created, reading from the oldest message
    /// kept): one that another consumer has held unsettled for longer than
    /// `claim_idle` first (its delivery count goes up), else a new one,
    /// waiting up to `block` for one.
    async fn endpoint_receive(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
        claim_idle: Duration,
        block: Duration,
    ) -> Result<Option<EndpointDelivery>, BackendError>;

    /// Keeps message `id` with `consumer`: restarts its idle time (not its
    /// delivery count), so that a long handler keeps its message.
    async fn endpoint_touch(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
        id: &str,
    ) -> Result<(), BackendError>;

    /// Acknowledges a delivery; with `dead: Some(reason)`, parks it on the
    /// endpoint's dead letters in the same step.
    async fn endpoint_settle(
        &self,
        endpoint: &str,
        group: &str,
        delivery: &EndpointDelivery,
        dead: Option<&str>,
    ) -> Result<(), BackendError>;

    /// Removes the messages every group has settled, and the consumers
    /// that hold none and have been idle for `idle_consumers` (their
    /// processes died); returns how many messages went. Nothing goes while
    /// the endpoint has no group.
    async fn endpoint_trim(
        &self,
        endpoint: &str,
        idle_consumers: Duration,
    ) -> Result<usize, BackendError>;

    /// `consumer` leaves `group`, if it holds no message (one it holds
    /// stays, for another consumer to take over).
    async fn endpoint_leave(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
    ) -> Result<(), BackendError>;

    /// The endpoint's dead letters, oldest first (capped).
    async fn endpoint_dead_letters(&self, endpoint: &str) -> Result<Vec<DeadLetter>, BackendError>;
}

/// Named leases: one holder at a time (the timer poller, the janitor).
#[async_trait]
pub trait Leases: Send + Sync + 'static {
    /// Takes or renews the named lease `name` for `token`; `false` if
    /// someone else holds it.
    async fn named_lease(
        &self,
        name: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, BackendError>;

    /// Releases the named lease if `token` holds it.
    async fn release_named_lease(&self, name: &str, token: &str) -> Result<bool, BackendError>;

    /// Registers (or keeps) `member`, an engine that runs process managers,
    /// among the readers of process-manager messages for `ttl`, and returns
    /// the partitions it owns now, a bit each, for [`Interest`]: the
    /// backend balances them over its live members, each partition owned
    /// by one at a time, so that one writer handles the messages of an
    /// instance. `None`: this backend does not partition (every reader
    /// reads every message, and versioning alone settles races).
    async fn process_partitions(
        &self,
        member: &str,
        ttl: Duration,
    ) -> Result<Option<u64>, BackendError> {
        let _ = (member, ttl);
        Ok(None)
    }

    /// Lets go of `member`'s partitions at once (an engine shutting down),
    /// so that the others take them over without waiting for the TTL.
    async fn leave_process_partitions(&self, member: &str) -> Result<(), BackendError> {
        let _ = member;
        Ok(())
    }

    /// Records that `member` runs the process managers `names` for the
    /// next `ttl` (`None`: it stops running them now, shutting down), so
    /// that an engine handed a message for a process manager it does not
    /// run can tell whether another engine does
    /// ([`process_runner_alive`](Self::process_runner_alive)).
    async fn announce_processes(
        &self,
        member: &str,
        names: &[&'static str],
        ttl: Option<Duration>,
    ) -> Result<(), BackendError> {
        let _ = (member, names, ttl);
        Ok(())
    }

    /// Whether an engine that runs process manager `name` announced it
    /// within its TTL. `false` when the backend does not know (the
    /// default): the message then waits for one with growing delays.
    async fn process_runner_alive(&self, name: &str) -> Result<bool, BackendError> {
        let _ = name;
        Ok(false)
    }
}

/// Retention: what keeps a backend's size bounded over a year of traffic.
#[async_trait]
pub trait Housekeeping: Send + Sync + 'static {
    /// Removes expired tasks (every key and index entry; their records
    /// expire on their own where the backend can), dead letters beyond
    /// `retention`, and consumers that left. Safe to call from several
    /// processes at once; the engine calls it under a named lease.
    async fn housekeep(&self, retention: &Retention) -> Result<Housekept, BackendError>;
}

/// What a shared circuit breaker lets a caller do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerDecision {
    /// Make the call; `probe` if it is the one half-open probe.
    Call {
        /// Whether this call decides between closing and reopening.
        probe: bool,
        /// Whether failures are being counted (a success must reset
        /// them). A success that finds nothing to reset is not reported:
        /// a healthy step pays one round trip for its breaker, not two.
        counting: bool,
    },
    /// The breaker is open (or its probe is out): not before `retry_after`.
    Open {
        /// How long until the breaker lets a call through, at the earliest.
        retry_after: Duration,
    },
}

/// How a report changed a shared circuit breaker
/// ([`Breakers::breaker_report`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerChange {
    /// It opened: the threshold was reached, or the probe failed.
    Opened,
    /// It closed: the probe succeeded.
    Closed,
}

/// Circuit breakers shared by every engine on the backend
/// (`#[circuit_breaker(scope = shared)]`): closed, open until a time, then
/// half-open with one probe at a time across the deployment.
#[async_trait]
pub trait Breakers: Send + Sync + 'static {
    /// Asks to call through breaker `name`. A probe holds its slot for at
    /// most `probe_ttl` (a prober that dies must not hold it for ever), and
    /// under `token`, which its report must carry.
    async fn breaker_acquire(
        &self,
        name: &str,
        probe_ttl: Duration,
        token: &str,
    ) -> Result<BreakerDecision, BackendError>;

    /// Reports a call's outcome: a success closes (and resets the count);
    /// a failure counts, and opens the breaker for `open_for` at
    /// `threshold` consecutive failures, or at once after a failed probe.
    /// `None`: the call did not happen after all (its attempt was claimed
    /// elsewhere, the task was cancelled); a probe's slot is freed for the
    /// next caller instead of being held until it expires.
    ///
    /// `probe` is the token of the probe this call was; a probe whose slot
    /// expired and was given to another is ignored, so that a late report
    /// cannot close or reopen the breaker under the current probe.
    ///
    /// Returns the change this report made, if any (for metrics).
    async fn breaker_report(
        &self,
        name: &str,
        probe: Option<&str>,
        failed: Option<bool>,
        threshold: u32,
        open_for: Duration,
    ) -> Result<Option<BreakerChange>, BackendError>;
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
