//! The work queue: ready, delayed and in-flight messages, and dead letters.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{later, MemoryBackend, State};
use crate::backend::{
    truncate_payload, BackendError, DeadLetter, Delivery, Handling, Interest, QueueMessage,
    QueueStats, Settle, WorkItem, WorkQueue,
};
use crate::model::task::{TaskId, Timestamp};

#[derive(Clone)]
pub(super) struct Message {
    pub(super) id: String,
    pub(super) raw: Vec<u8>,
    /// Deliveries not answered so far.
    pub(super) deliveries: u32,
    /// A process-manager message (else a saga message, or an entry that
    /// decodes as nothing): for [`WorkQueue::queue_stats`].
    pub(super) process: bool,
    /// When it was (or, delayed, will be) put on the queue; a hand-back
    /// puts it on again.
    pub(super) since: Instant,
}

impl State {
    pub(super) fn push(&mut self, raw: Vec<u8>, deliveries: u32, delay: Duration, process: bool) {
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

    pub(super) fn push_item(&mut self, item: &WorkItem, delay: Duration) {
        let process = matches!(item, WorkItem::Process(_));
        self.push(item.encode().into_bytes(), 0, delay, process);
    }

    /// Puts an entry on the queue as it is.
    pub(super) fn push_raw(&mut self, raw: Vec<u8>) {
        let process = matches!(WorkItem::decode(&raw), Ok(WorkItem::Process(_)));
        self.push(raw, 0, Duration::ZERO, process);
    }

    /// Moves due delayed messages and expired in-flight ones back to ready.
    pub(super) fn promote(&mut self, now: Instant) {
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

    pub(super) fn next_wakeup(&self) -> Option<Instant> {
        let delayed = self.delayed.iter().map(|(at, _)| *at);
        let in_flight = self.in_flight.values().map(|(_, at)| *at);
        delayed.chain(in_flight).min()
    }

    pub(super) fn park(
        &mut self,
        delivery: &Delivery,
        reason: &str,
        task_id: Option<TaskId>,
        limit: usize,
    ) {
        self.in_flight.remove(&delivery.id);
        self.park_raw(&delivery.raw, reason, task_id, limit);
    }

    /// Parks `raw` on the dead-letter queue (cut to `limit`).
    pub(super) fn park_raw(
        &mut self,
        raw: &str,
        reason: &str,
        task_id: Option<TaskId>,
        limit: usize,
    ) {
        let (payload, truncated) = truncate_payload(raw, limit);
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

    pub(super) fn settle(&mut self, settle: Settle<'_>, task_id: Option<TaskId>, limit: usize) {
        match settle {
            Settle::Nothing => {}
            Settle::Ack(d) => {
                self.in_flight.remove(&d.id);
            }
            Settle::DeadLetter(d, reason) => self.park(d, reason, task_id, limit),
            Settle::ResolveDeadLetter(id) => self.dead.retain(|d| d.id != id),
        }
    }
}

#[async_trait]
impl WorkQueue for MemoryBackend {
    fn visibility_timeout(&self) -> Duration {
        self.shared.visibility_timeout
    }

    async fn wake(&self, message: &QueueMessage) -> Result<bool, BackendError> {
        let raw = WorkItem::Saga(message.clone()).encode().into_bytes();
        let woken = {
            let mut state = self.state();
            let now = Instant::now();
            match state.delayed.iter().position(|(_, m)| m.raw == raw) {
                Some(i) => {
                    let (_, mut m) = state.delayed.swap_remove(i);
                    m.since = now;
                    state.ready.push_back(m);
                    true
                }
                None => false,
            }
        };
        if woken {
            self.queue_changed();
        }
        Ok(woken)
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

    async fn settle_delivery(
        &self,
        delivery: &Delivery,
        how: Handling<'_>,
    ) -> Result<(), BackendError> {
        match how {
            Handling::Ack => {
                self.state().in_flight.remove(&delivery.id);
                Ok(())
            }
            Handling::Release(delay) => self.hand_back(delivery, delay, true),
            Handling::Defer(delay) => self.hand_back(delivery, delay, false),
            Handling::DeadLetter {
                reason,
                task: task_id,
            } => {
                self.state()
                    .park(delivery, reason, task_id, self.shared.payload_limit);
                Ok(())
            }
        }
    }

    async fn park(&self, payload: &str, reason: &str) -> Result<(), BackendError> {
        self.state()
            .park_raw(payload, reason, None, self.shared.payload_limit);
        Ok(())
    }

    async fn release_due(&self, _limit: usize) -> Result<usize, BackendError> {
        // `receive` promotes due messages itself, to the instant.
        Ok(0)
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
