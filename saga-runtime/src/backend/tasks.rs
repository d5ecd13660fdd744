//! Task records, their leases (with fencing), attempt claims, the atomic
//! commit of a step's outcome, cancellation flags and paged listing.

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;

use super::write::{Answer, Write};
use super::{BackendError, Delivery, QueueMessage, Settle};
use crate::model::task::{AuditEntry, TaskId, TaskInstance, TaskStatus, Timestamp};

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

/// What [`TaskStore::heartbeat`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Whether the lease is still held (and was extended).
    pub lock_held: bool,
    /// When cancellation was requested, if it was.
    pub cancel_requested: Option<Timestamp>,
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
    /// Refuse the write ([`TaskRefusal::CancelRequested`]) if
    /// cancellation of the task was requested: a worker passes it when it
    /// ends a running task another way (completed, failed), so that an
    /// accepted cancellation is never overtaken, and when a running task
    /// waits for a delayed message (a retry's backoff, a breaker, a
    /// limit), so that a cancellation does not wait that out. A store
    /// decides nothing else by the flag: `next` is enqueued after its
    /// `delay`, as given.
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
    /// Refuse the write ([`TaskRefusal::CancelRequested`]) if
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

/// Why a task write was refused: what the protocol expects to happen
/// (another worker took the task over, a write raced ours, the task was
/// cancelled or removed), not a failure of the store. Nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TaskRefusal {
    /// The write's fencing token is not the task's latest: another worker
    /// took the lease after it expired.
    #[error("the lease was lost (fencing token {fence} is stale)")]
    LockLost {
        /// The stale fencing token.
        fence: u64,
    },
    /// The stored version is not the one the write was based on.
    #[error("version conflict (expected {expected}, found {actual})")]
    Conflict {
        /// The version the write was based on.
        expected: u64,
        /// The stored version.
        actual: u64,
    },
    /// The task does not exist (it expired, or was never created).
    #[error("the task does not exist")]
    Missing,
    /// The write asked to be refused once cancellation was requested, and
    /// it was.
    #[error("cancellation was requested")]
    CancelRequested {
        /// When cancellation was requested.
        at: Timestamp,
    },
}

/// A task write's answer: written (`Ok`, with what the write returns) or
/// refused (`Err`), the backend having answered either way.
pub type TaskWrite<T> = Result<T, TaskRefusal>;

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

    /// How many retained tasks of each of `sagas` are in each of
    /// `statuses`, as `(saga, status, count)` (pairs with none may be left
    /// out). The metrics sample it on every housekeeping beat for the
    /// statuses that wait for an operator, so it must not read the tasks:
    /// the default asks [`count_tasks`](Self::count_tasks) per saga, which
    /// a backend with per-status indexes answers from their sizes; one
    /// whose `count_tasks` reads rows answers the few statuses asked for
    /// from an index instead.
    async fn count_in_statuses(
        &self,
        sagas: &[&str],
        statuses: &[TaskStatus],
    ) -> Result<Vec<(String, TaskStatus, usize)>, BackendError> {
        let mut counts = Vec::new();
        for saga in sagas {
            for (status, n) in self.count_tasks(saga).await? {
                if statuses.contains(&status) {
                    counts.push(((*saga).to_owned(), status, n));
                }
            }
        }
        Ok(counts)
    }

    /// The names of the sagas with tasks stored here, sorted: what an
    /// engine that runs no saga (`sagactl`) tells an operator who asked
    /// for a saga with none (a misspelt name). `None` when this backend
    /// cannot tell (the default). The built-in backends look at their
    /// per-saga indexes (on Redis, a `SCAN` of each partition's keys):
    /// meant for an operator's error path, not for a hot one.
    async fn saga_names(&self) -> Result<Option<Vec<String>>, BackendError> {
        Ok(None)
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

    /// Checks `write`'s guards, every one before any effect, and applies
    /// its effects, atomically: the one write of the task protocol (see
    /// [`write`](mod@super::write)). A failed guard is the answer's
    /// refusal, and nothing is written. The store decides nothing: which
    /// guards and effects a write carries was decided by the engine.
    ///
    /// This is the write a store implements; [`record_attempt`](Self::record_attempt),
    /// [`record_next_attempt`](Self::record_next_attempt) and
    /// [`commit`](Self::commit) are the engine's names for the writes it
    /// makes, each lowered into one `apply`.
    async fn apply(&self, write: &Write<'_>) -> Result<Answer, BackendError>;

    /// Records an attempt before its call: writes `task` if the stored
    /// version is `task.version` and `lease` holds the latest fence, and
    /// claims `claim` (an attempt's name, unique per task) in the same step.
    /// Returns the new version and whether the claim was won; the write
    /// happens even when the claim is lost. Claims live as long as the task.
    /// `stored_status` is the status stored under `task.version`.
    ///
    /// Provided ([`Write::attempt`] applied): a store does not implement it.
    async fn record_attempt(
        &self,
        task: &TaskInstance,
        stored_status: TaskStatus,
        lease: &Lease,
        claim: &str,
    ) -> Result<TaskWrite<(u64, bool)>, BackendError> {
        let write = Write::attempt(task, stored_status, lease, claim);
        Ok(self.apply(&write).await?.map(|a| (a.version, a.claimed)))
    }

    /// Records the next attempt of a task the worker goes on with (see
    /// [`NextAttempt`]): like [`record_attempt`](Self::record_attempt),
    /// and in the same atomic write the lease is renewed and the message
    /// kept alive (if asked), and the write refused if `unless_cancelled`
    /// and cancellation was requested. Returns the new version and whether
    /// the claim was won.
    ///
    /// Provided ([`NextAttempt::write`] applied): a store does not
    /// implement it.
    async fn record_next_attempt(
        &self,
        next: NextAttempt<'_>,
    ) -> Result<TaskWrite<(u64, bool)>, BackendError> {
        let write = next.write();
        Ok(self.apply(&write).await?.map(|a| (a.version, a.claimed)))
    }

    /// Writes a [`TaskCommit`] atomically and releases its lease; returns
    /// the new version.
    ///
    /// Provided ([`TaskCommit::write`] applied): a store does not
    /// implement it.
    async fn commit(&self, commit: TaskCommit<'_>) -> Result<TaskWrite<u64>, BackendError> {
        let write = commit.write();
        Ok(self.apply(&write).await?.map(|a| a.version))
    }

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

    /// [`request_cancel`](Self::request_cancel), appending `entry` (who
    /// asked, and why) to the task's audit log in the same write when this
    /// call is the one that records the request (not for a retry of it,
    /// nor when an earlier request stands). The task may be running under
    /// a worker's lease meanwhile, so the entry cannot wait for a write of
    /// the task's own: the built-in backends keep the audit log apart from
    /// the record and append to it. The default records the request
    /// without the entry, for a backend that cannot append on its own.
    async fn request_cancel_audited(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
        entry: &AuditEntry,
    ) -> Result<Option<Timestamp>, BackendError> {
        let _ = entry;
        self.request_cancel(id, token, wake).await
    }

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
