//! Task records, leases with fencing, attempt claims and commits (the
//! writes through the interpreter, `write.rs`).

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use tokio::time::Instant;
use uuid::Uuid;

use super::{MemoryBackend, State};
use crate::backend::write::{Answer, Write};
use crate::backend::{
    BackendError, Created, Delivery, Heartbeat, Lease, Locked, QueueMessage, TaskQuery, TaskStore,
    WorkItem,
};
use crate::model::task::{AuditEntry, TaskId, TaskInstance, TaskStatus, Timestamp, AUDIT_LOG_CAP};

impl State {
    /// Stores `task`, appending its unstored audit entries to the stored
    /// log (capped) as a backend that keeps the log apart must.
    pub(super) fn write(&mut self, task: &TaskInstance) -> u64 {
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

    pub(super) fn lock_held_by(&self, lease: &Lease, now: Instant) -> bool {
        matches!(self.locks.get(&lease.task_id), Some((token, exp)) if *token == lease.token && *exp > now)
    }

    pub(super) fn remove_task(&mut self, id: TaskId) {
        self.tasks.remove(&id);
        self.expiry.remove(&id);
        self.locks.remove(&id);
        self.fences.remove(&id);
        self.claims.remove(&id);
        self.cancels.remove(&id);
    }
}

impl MemoryBackend {
    /// Records a cancellation request (and `entry` in the task's audit
    /// log, as the log's own append: the task may be leased to a worker)
    /// unless one stands; answers an earlier request's time.
    fn cancel_request(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
        entry: Option<&AuditEntry>,
    ) -> Option<Timestamp> {
        {
            let mut state = self.state();
            if let Some((at, by)) = state.cancels.get(&id) {
                return (by != token).then_some(*at);
            }
            // Nothing is recorded for a task that does not exist.
            let task = state.tasks.get_mut(&id)?;
            if let Some(entry) = entry {
                task.audit_log.push(entry.clone());
                let excess = task.audit_log.len().saturating_sub(AUDIT_LOG_CAP);
                task.audit_log.drain(..excess);
                task.audit_saved();
            }
            state
                .cancels
                .insert(id, (Timestamp::now(), token.to_owned()));
            state.push_item(&WorkItem::Saga(wake.clone()), Duration::ZERO);
        }
        let _ = self.shared.cancels.send(id);
        self.queue_changed();
        None
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

    async fn saga_names(&self) -> Result<Option<Vec<String>>, BackendError> {
        let names: std::collections::BTreeSet<String> = self
            .state()
            .tasks
            .values()
            .map(|t| t.saga.clone())
            .collect();
        Ok(Some(names.into_iter().collect()))
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

    async fn apply(&self, write: &Write<'_>) -> Result<Answer, BackendError> {
        Ok(self.interpret(write))
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
        Ok(self.cancel_request(id, token, wake, None))
    }

    async fn request_cancel_audited(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
        entry: &AuditEntry,
    ) -> Result<Option<Timestamp>, BackendError> {
        Ok(self.cancel_request(id, token, wake, Some(entry)))
    }

    async fn cancel_requested(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError> {
        Ok(self.state().cancels.get(&id).map(|(at, _)| *at))
    }

    async fn cancellations(&self) -> Result<BoxStream<'static, TaskId>, BackendError> {
        // One process: every request is made here, and sent on the channel.
        Ok(crate::util::broadcast_stream(
            self.shared.cancels.subscribe(),
        ))
    }

    async fn wait_for_change(&self, _id: TaskId, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.shared.task_changed.notified()).await;
    }
}
