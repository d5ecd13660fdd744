//! Storage backends: where tasks, locks, idempotency keys, the work queue and
//! the dead-letter queue live.
//!
//! The engine talks to one [`Backend`]. Its operations are shaped around what
//! the engine needs to keep the invariants, not around a key-value API, so that
//! a backend can make each of them one atomic round trip (the Redis backend
//! runs most as one script):
//!
//! - [`Backend::create_task`] stores a task and enqueues its first message;
//! - [`Backend::save_and_claim`] persists the attempt count *before* a call and
//!   claims the attempt's idempotency key;
//! - [`Backend::commit`] records a step's result, enqueues the next message,
//!   acknowledges (or dead-letters) the current one and releases the lock.
//!
//! Every write of a task carries the [`Lease`] it was made under: a write whose
//! fencing token is not the latest one issued for the task is refused, so a
//! worker that lost its lock (a long GC pause, a partition) cannot overwrite
//! the work of the worker that took over.

pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use serde_json::Value;

use crate::task::{TaskId, TaskInstance, Timestamp};

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

/// A message handed to a worker; acknowledge it, release it or dead-letter it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Backend-assigned id (a stream entry id for Redis).
    pub id: String,
    /// The raw payload (JSON of [`QueueMessage`] when well-formed).
    pub payload: String,
    /// How many times this message was delivered, this time included (0
    /// when the backend does not know).
    pub delivery_count: u64,
    /// The consumer it was delivered to.
    pub consumer: String,
}

/// What [`Backend::heartbeat`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Whether the lease is still held (and was extended).
    pub lock_held: bool,
    /// When cancellation was requested, if it was.
    pub cancel_requested: Option<Timestamp>,
}

/// What the work queue carries: "advance task `task_id` of saga `saga`".
///
/// The task record decides what advancing means; `seq` lets a worker tell a
/// stale duplicate (whose effect is already recorded) from the live message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueMessage {
    /// The task.
    pub task_id: TaskId,
    /// The saga the task belongs to.
    pub saga: String,
    /// The task's sequence number when this message was enqueued.
    pub seq: u64,
}

impl QueueMessage {
    /// The JSON payload.
    pub fn to_payload(&self) -> String {
        serde_json::to_string(self).expect("a QueueMessage always serializes")
    }
}

/// A message parked for manual inspection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Id to requeue it by.
    pub id: String,
    /// The raw payload, exactly as it was received.
    pub payload: String,
    /// Why it was parked.
    pub reason: String,
    /// The task it concerns, when the payload named one.
    pub task_id: Option<TaskId>,
    /// When it was parked.
    pub at: Timestamp,
}

/// How [`Backend::commit`] settles the message being processed.
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

/// What [`Backend::try_lock_and_load`] returns when the lock was free.
#[derive(Debug, Clone)]
pub struct Locked {
    /// The lease now held.
    pub lease: Lease,
    /// A fresh copy of the task, if it exists.
    pub task: Option<TaskInstance>,
    /// When cancellation was requested, if it was.
    pub cancel_requested: Option<Timestamp>,
}

/// What happened to a process-manager instance, in its audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum ProcessAuditAction {
    /// The handler ran and its result was saved.
    Handled,
    /// The instance was completed by this message.
    Completed,
    /// The message arrived after completion (or stop) and was ignored.
    Ignored {
        /// Why.
        reason: String,
    },
    /// `#[on_error]` said `Skip`.
    Skipped {
        /// The handler's error.
        error: String,
    },
    /// `#[on_error]` said `Stop` (or the default policy gave up).
    Stopped {
        /// The handler's error.
        error: String,
    },
}

/// One line of an instance's audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessAudit {
    /// When.
    pub at: Timestamp,
    /// The message's type.
    pub message_type: String,
    /// The message's id.
    pub message_id: String,
    /// What happened.
    #[serde(flatten)]
    pub action: ProcessAuditAction,
}

/// Where an instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InstanceStatus {
    /// Handling messages.
    Active,
    /// `ctx.mark_complete()`: later messages are ignored.
    Completed,
    /// Stopped by `#[on_error]`: later messages are ignored.
    Stopped,
}

/// A stored process-manager instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessInstance {
    /// The process manager's name.
    pub process: String,
    /// The instance's id (its correlation id when a correlation-id message
    /// created it, else a UUID).
    pub id: String,
    /// The state, as JSON.
    pub state: Value,
    /// Active, completed or stopped.
    pub status: InstanceStatus,
    /// Incremented by every write; writes compare it (0: not stored yet).
    pub version: u64,
    /// The correlation entries it owns: `(state field, value)`.
    pub keys: Vec<(String, String)>,
    /// Ids of the most recent messages it handled, to drop exact duplicates.
    pub processed: Vec<String>,
    /// The most recent events (bounded).
    pub audit_log: Vec<ProcessAudit>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it was last written.
    pub updated_at: Timestamp,
}

/// One atomic write of the process-manager protocol: the instance (created,
/// updated or deleted), its correlation entries, the messages its handler
/// sent, published and scheduled, and the settlement of the message.
#[derive(Debug, Clone)]
pub struct ProcessCommit<'a> {
    /// The instance to write (`version` is the one it was loaded with; 0 to
    /// create), unless `None`.
    pub instance: Option<&'a ProcessInstance>,
    /// Delete the instance (and its correlation entries) instead of writing it.
    pub delete: bool,
    /// Correlation entries to claim for the instance: a value already owned
    /// by another instance is a conflict.
    pub add_keys: Vec<(String, String)>,
    /// Correlation entries to release.
    pub remove_keys: Vec<(String, String)>,
    /// Process-manager envelopes to enqueue.
    pub enqueue: Vec<String>,
    /// Messages for endpoints: `(endpoint, payload)`.
    pub endpoints: Vec<(String, String)>,
    /// Envelopes to deliver later: `(due, wall-clock ms; payload)`.
    pub schedule: Vec<(u64, String)>,
    /// What to do with the message being handled.
    pub settle: Settle<'a>,
}

/// A backend failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
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
    /// A stored value could not be read.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// The backend could not be reached or failed.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
}

/// A store for tasks, locks, idempotency keys and queues.
///
/// Every implementation must pass the conformance suite in
/// `tests/conformance.rs`. Loads return fresh copies.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Stores a new task (version 0 -> 1) and enqueues `message`, atomically.
    async fn create_task(&self, task: &TaskInstance, message: &str) -> Result<(), BackendError>;

    /// A fresh copy of the task.
    async fn load_task(&self, id: TaskId) -> Result<Option<TaskInstance>, BackendError>;

    /// Every task of `saga` (for reconciliation and operators).
    async fn list_tasks(&self, saga: &str) -> Result<Vec<TaskInstance>, BackendError>;

    /// Writes `task` if the stored version is `task.version` and `lease` is
    /// the task's latest lease; claims the idempotency key `claim` (`SET NX`
    /// with `ttl`) in the same step. Returns the new version and whether the
    /// claim was won. The write happens even when the claim is lost.
    async fn save_and_claim(
        &self,
        task: &TaskInstance,
        lease: &Lease,
        claim: &str,
        ttl: Duration,
    ) -> Result<(u64, bool), BackendError>;

    /// Atomically: writes `task` (same checks as [`save_and_claim`]), enqueues
    /// `enqueue`, settles the current message and releases `lease`. Returns
    /// the new version.
    ///
    /// With `unless_cancelled`, the write is refused with
    /// [`BackendError::CancelRequested`] if cancellation of the task was
    /// requested: a worker passes it when it ends a running task another way
    /// (completed, failed), so that an accepted cancellation is never
    /// overtaken.
    ///
    /// [`save_and_claim`]: Backend::save_and_claim
    async fn commit(
        &self,
        task: &TaskInstance,
        lease: &Lease,
        enqueue: Option<&str>,
        settle: Settle<'_>,
        unless_cancelled: bool,
    ) -> Result<u64, BackendError>;

    /// Takes the task's lock if it is free and loads the task and its
    /// cancellation flag: what a worker needs first, in one round trip where
    /// the backend allows.
    async fn try_lock_and_load(
        &self,
        id: TaskId,
        ttl: Duration,
    ) -> Result<Option<Locked>, BackendError> {
        let Some(lease) = self.try_lock(id, ttl).await? else {
            return Ok(None);
        };
        let task = self.load_task(id).await?;
        let cancel_requested = self.cancel_requested(id).await?;
        Ok(Some(Locked {
            lease,
            task,
            cancel_requested,
        }))
    }

    /// Takes the task's lock if it is free (no waiting).
    async fn try_lock(&self, id: TaskId, ttl: Duration) -> Result<Option<Lease>, BackendError>;

    /// Extends a held lock; `false` if it is no longer held by `lease`.
    async fn extend_lock(&self, lease: &Lease, ttl: Duration) -> Result<bool, BackendError>;

    /// Releases a held lock; `false` (and no effect) if `lease` no longer
    /// holds it.
    async fn unlock(&self, lease: &Lease) -> Result<bool, BackendError>;

    /// Claims an idempotency key: `true` the first time within `ttl`.
    async fn try_claim(&self, key: &str, ttl: Duration) -> Result<bool, BackendError>;

    /// Enqueues a raw payload.
    async fn enqueue(&self, payload: &str) -> Result<(), BackendError>;

    /// The next message, waiting up to `wait` for one. A message not settled
    /// within the backend's visibility timeout is delivered again.
    async fn receive(
        &self,
        consumer: &str,
        wait: Duration,
    ) -> Result<Option<Delivery>, BackendError>;

    /// Keeps an in-flight message from being redelivered while it is worked on.
    async fn touch(&self, delivery: &Delivery) -> Result<(), BackendError>;

    /// Called about once a second while a step runs or waits to retry:
    /// extends the lease by `ttl`, keeps the message from being redelivered
    /// and reports a cancellation requested in any process. One round trip
    /// where the backend allows.
    async fn heartbeat(
        &self,
        lease: &Lease,
        delivery: &Delivery,
        ttl: Duration,
    ) -> Result<Heartbeat, BackendError> {
        let lock_held = self.extend_lock(lease, ttl).await?;
        self.touch(delivery).await?;
        let cancel_requested = self.cancel_requested(lease.task_id).await?;
        Ok(Heartbeat {
            lock_held,
            cancel_requested,
        })
    }

    /// Acknowledges a message: it will not be delivered again.
    async fn ack(&self, delivery: &Delivery) -> Result<(), BackendError>;

    /// Hands a message back unsettled, to be delivered again no sooner than
    /// `delay` (a backend may take longer: Redis redelivers after its
    /// visibility timeout).
    async fn release(&self, delivery: &Delivery, delay: Duration) -> Result<(), BackendError>;

    /// Acknowledges a message and parks a copy on the dead-letter queue.
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &str,
        task_id: Option<TaskId>,
    ) -> Result<(), BackendError>;

    /// The parked messages, oldest first.
    async fn dead_letters(&self) -> Result<Vec<DeadLetter>, BackendError>;

    /// Moves a parked message back onto the work queue, atomically; returns
    /// it, or `None` if there is no such entry.
    async fn requeue_dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, BackendError>;

    /// Records a cancellation request; returns when it was first requested
    /// if it already was.
    async fn request_cancel(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError>;

    /// When cancellation of the task was requested, if it was.
    async fn cancel_requested(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError>;

    /// Cancellation requests as they are made, from any process (best effort:
    /// workers also poll [`cancel_requested`](Backend::cancel_requested)).
    async fn cancellations(&self) -> Result<BoxStream<'static, TaskId>, BackendError>;

    /// The instance `id` of process manager `process`.
    async fn process_load(
        &self,
        process: &str,
        id: &str,
    ) -> Result<Option<ProcessInstance>, BackendError>;

    /// The instance owning the correlation entry `(field, value)`.
    async fn process_find(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Option<ProcessInstance>, BackendError>;

    /// Every instance of a process manager (for operators and tests).
    async fn process_list(&self, process: &str) -> Result<Vec<ProcessInstance>, BackendError>;

    /// Writes a [`ProcessCommit`] atomically; returns the instance's new
    /// version (0 when deleted or not written). A version mismatch, an
    /// existing instance when creating, or a correlation entry owned by
    /// another instance is a [`BackendError::Conflict`].
    async fn process_commit(
        &self,
        process: &str,
        commit: ProcessCommit<'_>,
    ) -> Result<u64, BackendError>;

    /// Enqueues process-manager envelopes (publishing from outside a handler).
    async fn process_enqueue(&self, payloads: &[String]) -> Result<(), BackendError>;

    /// Moves scheduled envelopes due at `now_ms` onto the queue, at most
    /// `limit`, each exactly once (even with several pollers); returns how
    /// many moved.
    async fn process_release_due(&self, now_ms: u64, limit: usize) -> Result<usize, BackendError>;

    /// The scheduled envelopes: `(due ms, payload)`, soonest first.
    async fn process_scheduled(&self) -> Result<Vec<(u64, String)>, BackendError>;

    /// The messages sent to an endpoint, oldest first (for consumers that
    /// read it, and tests).
    async fn endpoint_messages(&self, endpoint: &str) -> Result<Vec<String>, BackendError>;

    /// Takes or renews the named lease `name` for `token` (a poller's
    /// lease); `false` if someone else holds it.
    async fn named_lease(
        &self,
        name: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, BackendError>;

    /// Releases the named lease if `token` holds it.
    async fn release_named_lease(&self, name: &str, token: &str) -> Result<bool, BackendError>;

    /// Waits until the task may have changed, or `timeout` passed.
    async fn wait_for_change(&self, id: TaskId, timeout: Duration) {
        let _ = id;
        tokio::time::sleep(timeout).await;
    }
}
