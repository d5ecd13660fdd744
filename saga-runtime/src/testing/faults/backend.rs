//! The in-memory backend, with the faults a real deployment sees injected
//! at the seam the engine uses, so the engine under test is the real one:
//!
//! - a *crash*: the write that carries a body's outcome fails, and the
//!   worker's hand-back and unlock are lost with it, as if its process had
//!   died: the message comes back after the visibility timeout and the
//!   lease after its TTL, and the body runs again;
//! - a *lost acknowledgement*: a commit lands but its message stays
//!   unacknowledged, and is delivered again later;
//! - a *duplicate*: a commit's next message is delivered twice, the copy
//!   up to 20 s after the original;
//! - a *delay*: a message is held back up to 30 s the first time it is
//!   delivered, which reorders it against the other tasks' messages.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;

use super::journal::Journal;
use crate::backend::memory::MemoryBackend;
use crate::backend::write::{Answer, Write};
use crate::backend::{
    Backend, BackendError, Breakers, Created, DeadLetter, DeadLetterQuery, DeadLetters, Delivery,
    Handling, Heartbeat, Housekeeping, Housekept, Interest, Lease, Leases, Locked, NextAttempt,
    Page, ProcessBackend, QueueMessage, QueueStats, Retention, Settle, TaskCommit, TaskQuery,
    TaskStore, TaskWrite, WorkItem, WorkQueue,
};
use crate::model::task::{AuditEntry, TaskId, TaskInstance, TaskStatus, Timestamp};
use crate::util::Unpoisoned;

pub(super) struct FaultyBackend {
    inner: MemoryBackend,
    journal: Arc<Journal>,
    /// Delivery ids and lease tokens of workers that "crashed": what they
    /// do afterwards (hand the message back, unlock) never happens.
    dead: Mutex<HashSet<String>>,
}

impl FaultyBackend {
    pub(super) fn new(inner: MemoryBackend, journal: Arc<Journal>) -> Self {
        FaultyBackend {
            inner,
            journal,
            dead: Mutex::new(HashSet::new()),
        }
    }

    fn dead(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.dead.locked()
    }

    fn is_dead(&self, key: &str) -> bool {
        self.dead().contains(key)
    }

    /// The worker holding `lease` and `delivery` dies here.
    fn crash(&self, lease: &Lease, delivery: Option<&Delivery>) -> BackendError {
        let mut dead = self.dead();
        dead.insert(lease.token.clone());
        if let Some(delivery) = delivery {
            dead.insert(delivery.id.clone());
        }
        // Not transient, so the worker does not retry the write, and not a
        // refusal, so it does not dead-letter the message: it hands the
        // message back, which the crash swallows.
        BackendError::Misconfigured("fault kit: injected crash before the commit".to_owned())
    }
}

#[async_trait]
impl TaskStore for FaultyBackend {
    async fn create_task(
        &self,
        task: &TaskInstance,
        first: &QueueMessage,
    ) -> Result<Created, BackendError> {
        self.inner.create_task(task, first).await
    }

    async fn load_task(&self, id: TaskId) -> Result<Option<TaskInstance>, BackendError> {
        self.inner.load_task(id).await
    }

    async fn list_tasks(&self, query: &TaskQuery) -> Result<Vec<TaskInstance>, BackendError> {
        self.inner.list_tasks(query).await
    }

    async fn lock_and_load(
        &self,
        id: TaskId,
        ttl: Duration,
    ) -> Result<Option<Locked>, BackendError> {
        self.inner.lock_and_load(id, ttl).await
    }

    /// Passed through: the faults are injected where the engine makes its
    /// writes, `record_attempt`, `record_next_attempt` and `commit` (which
    /// know what a write carries: an attempt's start, or a body's
    /// outcome), each of which ends in the inner store's `apply`.
    async fn apply(&self, write: &Write<'_>) -> Result<Answer, BackendError> {
        self.inner.apply(write).await
    }

    async fn record_attempt(
        &self,
        task: &TaskInstance,
        stored_status: TaskStatus,
        lease: &Lease,
        claim: &str,
    ) -> Result<TaskWrite<(u64, bool)>, BackendError> {
        self.journal.written(task.id);
        self.inner
            .record_attempt(task, stored_status, lease, claim)
            .await
    }

    async fn record_next_attempt(
        &self,
        next: NextAttempt<'_>,
    ) -> Result<TaskWrite<(u64, bool)>, BackendError> {
        if self.journal.crash(next.task.id) {
            return Err(self.crash(next.lease, Some(next.delivery)));
        }
        self.inner.record_next_attempt(next).await
    }

    async fn commit(&self, commit: TaskCommit<'_>) -> Result<TaskWrite<u64>, BackendError> {
        let id = commit.task.id;
        let delivery = match commit.settle {
            Settle::Ack(d) | Settle::DeadLetter(d, _) => Some(d),
            _ => None,
        };
        if self.journal.crash(id) {
            return Err(self.crash(commit.lease, delivery));
        }
        let version = commit.task.version;
        let mut commit = commit;
        if matches!(commit.settle, Settle::Ack(_)) && self.journal.lose_ack(id, version) {
            commit.settle = Settle::Nothing;
        }
        let duplicate = match &commit.next {
            Some(next) => self
                .journal
                .duplicate(id, version)
                .map(|after| (next.message.clone(), next.delay + after)),
            None => None,
        };
        let status = commit.task.status;
        let written = self.inner.commit(commit).await?;
        if written.is_ok() {
            if status.is_terminal() {
                self.journal.ended(id, status);
            }
            if let Some((message, after)) = duplicate {
                let inner = self.inner.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let _ = inner.enqueue(&[WorkItem::Saga(message)]).await;
                });
            }
        }
        Ok(written)
    }

    async fn heartbeat(
        &self,
        lease: &Lease,
        delivery: &Delivery,
        ttl: Duration,
    ) -> Result<Heartbeat, BackendError> {
        self.inner.heartbeat(lease, delivery, ttl).await
    }

    async fn unlock(&self, lease: &Lease) -> Result<bool, BackendError> {
        if self.is_dead(&lease.token) {
            return Ok(true);
        }
        self.inner.unlock(lease).await
    }

    async fn request_cancel(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
    ) -> Result<Option<Timestamp>, BackendError> {
        self.inner.request_cancel(id, token, wake).await
    }

    async fn request_cancel_audited(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
        entry: &AuditEntry,
    ) -> Result<Option<Timestamp>, BackendError> {
        self.inner
            .request_cancel_audited(id, token, wake, entry)
            .await
    }

    async fn cancel_requested(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError> {
        self.inner.cancel_requested(id).await
    }

    async fn cancellations(&self) -> Result<BoxStream<'static, TaskId>, BackendError> {
        self.inner.cancellations().await
    }

    async fn wait_for_change(&self, id: TaskId, timeout: Duration) {
        self.inner.wait_for_change(id, timeout).await
    }
}

#[async_trait]
impl WorkQueue for FaultyBackend {
    fn visibility_timeout(&self) -> Duration {
        self.inner.visibility_timeout()
    }

    async fn enqueue(&self, items: &[WorkItem]) -> Result<(), BackendError> {
        self.inner.enqueue(items).await
    }

    async fn enqueue_raw(&self, payload: &[u8]) -> Result<(), BackendError> {
        self.inner.enqueue_raw(payload).await
    }

    async fn receive(
        &self,
        consumer: &str,
        interest: Interest,
        wait: Duration,
    ) -> Result<Option<Delivery>, BackendError> {
        let delivery = self.inner.receive(consumer, interest, wait).await?;
        if let Some(d) = &delivery {
            if let (Ok(WorkItem::Saga(m)), None) = (&d.item, &d.lease) {
                if let Some(by) = self.journal.delay(m.task_id, m.seq) {
                    self.inner.release(d, by).await?;
                    return Ok(None);
                }
            }
        }
        Ok(delivery)
    }

    async fn touch(&self, delivery: &Delivery) -> Result<(), BackendError> {
        if self.is_dead(&delivery.id) {
            return Ok(());
        }
        self.inner.touch(delivery).await
    }

    async fn settle_delivery(
        &self,
        delivery: &Delivery,
        how: Handling<'_>,
    ) -> Result<(), BackendError> {
        // A worker that "died" (`crash`) settles nothing after; a dead
        // letter was parked all the same, as before.
        if !matches!(how, Handling::DeadLetter { .. }) && self.is_dead(&delivery.id) {
            return Ok(());
        }
        self.inner.settle_delivery(delivery, how).await
    }

    async fn leave(&self, consumer: &str) -> Result<(), BackendError> {
        self.inner.leave(consumer).await
    }

    async fn park(&self, payload: &str, reason: &str) -> Result<(), BackendError> {
        self.inner.park(payload, reason).await
    }

    async fn release_due(&self, limit: usize) -> Result<usize, BackendError> {
        self.inner.release_due(limit).await
    }

    async fn queue_stats(&self) -> Result<Option<QueueStats>, BackendError> {
        self.inner.queue_stats().await
    }
}

#[async_trait]
impl DeadLetters for FaultyBackend {
    async fn dead_letters(
        &self,
        query: &DeadLetterQuery,
    ) -> Result<Page<DeadLetter>, BackendError> {
        self.inner.dead_letters(query).await
    }

    async fn dead_letter_by_id(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        self.inner.dead_letter_by_id(id).await
    }

    async fn requeue_dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        self.inner.requeue_dead_letter(id).await
    }

    async fn discard_dead_letter(&self, id: &str) -> Result<bool, BackendError> {
        self.inner.discard_dead_letter(id).await
    }
}

#[async_trait]
impl Housekeeping for FaultyBackend {
    async fn housekeep(&self, retention: &Retention) -> Result<Housekept, BackendError> {
        self.inner.housekeep(retention).await
    }
}

impl Backend for FaultyBackend {
    fn processes(self: Arc<Self>) -> Option<Arc<dyn ProcessBackend>> {
        Arc::new(self.inner.clone()).processes()
    }

    fn leases(self: Arc<Self>) -> Option<Arc<dyn Leases>> {
        Arc::new(self.inner.clone()).leases()
    }

    fn breakers(self: Arc<Self>) -> Option<Arc<dyn Breakers>> {
        Arc::new(self.inner.clone()).breakers()
    }
}
