//! The embedded in-memory backend: everything in-process, for tests,
//! examples and single-process deployments that can lose their state.
//!
//! It keeps the same contract as the Redis backend (leases with fencing,
//! visibility timeouts, fresh copies on load) so that code tested against it
//! behaves the same in production. Time is tokio's, so tests under a paused
//! clock control lock and key expiry exactly.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::{broadcast, Notify};
use tokio::time::Instant;
use uuid::Uuid;

use super::{
    Backend, BackendError, DeadLetter, Delivery, Lease, ProcessCommit, ProcessInstance, Settle,
};
use crate::task::{TaskId, TaskInstance, Timestamp};

/// The default visibility timeout: how long a delivered, unsettled message
/// stays invisible before it is delivered again.
pub const DEFAULT_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(30);

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
}

#[derive(Default)]
struct State {
    tasks: HashMap<TaskId, TaskInstance>,
    locks: HashMap<TaskId, (String, Instant)>,
    fences: HashMap<TaskId, u64>,
    claims: HashMap<String, Instant>,
    ready: VecDeque<Message>,
    delayed: Vec<(Instant, Message)>,
    in_flight: HashMap<String, (Message, Instant)>,
    dead: Vec<DeadLetter>,
    cancels: HashMap<TaskId, Timestamp>,
    next_id: u64,
    instances: HashMap<(String, String), ProcessInstance>,
    index: HashMap<(String, String, String), String>,
    scheduled: Vec<(u64, String)>,
    endpoints: HashMap<String, Vec<String>>,
    leases: HashMap<String, (String, Instant)>,
}

#[derive(Clone)]
struct Message {
    id: String,
    payload: String,
    deliveries: u64,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

impl MemoryBackend {
    /// An empty store with the default visibility timeout.
    pub fn new() -> Self {
        MemoryBackend::with_visibility_timeout(DEFAULT_VISIBILITY_TIMEOUT)
    }

    /// An empty store whose unsettled messages are redelivered after `timeout`.
    pub fn with_visibility_timeout(timeout: Duration) -> Self {
        MemoryBackend {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                queue_changed: Notify::new(),
                task_changed: Notify::new(),
                cancels: broadcast::channel(1024).0,
                visibility_timeout: timeout,
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
}

impl State {
    fn push(&mut self, payload: &str) {
        self.next_id += 1;
        self.ready.push_back(Message {
            id: format!("m-{}", self.next_id),
            payload: payload.to_owned(),
            deliveries: 0,
        });
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

    fn write(&mut self, task: &TaskInstance) -> u64 {
        let mut stored = task.clone();
        stored.version += 1;
        stored.updated_at = Timestamp::now();
        let version = stored.version;
        self.tasks.insert(task.id, stored);
        version
    }

    fn claim(&mut self, key: &str, ttl: Duration, now: Instant) -> bool {
        match self.claims.get(key) {
            Some(expires) if *expires > now => false,
            _ => {
                self.claims.insert(key.to_owned(), now + ttl);
                true
            }
        }
    }

    fn lock_held_by(&self, lease: &Lease, now: Instant) -> bool {
        matches!(self.locks.get(&lease.task_id), Some((token, exp)) if *token == lease.token && *exp > now)
    }

    /// Moves due delayed messages and expired in-flight ones back to ready.
    fn promote(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.delayed.len() {
            if self.delayed[i].0 <= now {
                let (_, m) = self.delayed.swap_remove(i);
                self.ready.push_back(m);
            } else {
                i += 1;
            }
        }
        let expired: Vec<String> = self
            .in_flight
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            if let Some((m, _)) = self.in_flight.remove(&id) {
                self.ready.push_back(m);
            }
        }
    }

    fn next_wakeup(&self) -> Option<Instant> {
        let delayed = self.delayed.iter().map(|(at, _)| *at);
        let in_flight = self.in_flight.values().map(|(_, at)| *at);
        delayed.chain(in_flight).min()
    }

    fn settle(&mut self, settle: Settle<'_>, task_id: Option<TaskId>) {
        match settle {
            Settle::Nothing => {}
            Settle::Ack(d) => {
                self.in_flight.remove(&d.id);
            }
            Settle::DeadLetter(d, reason) => {
                self.in_flight.remove(&d.id);
                self.dead.push(DeadLetter {
                    id: d.id.clone(),
                    payload: d.payload.clone(),
                    reason: reason.to_owned(),
                    task_id,
                    at: Timestamp::now(),
                });
            }
            Settle::ResolveDeadLetter(id) => self.dead.retain(|d| d.id != id),
        }
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn create_task(&self, task: &TaskInstance, message: &str) -> Result<(), BackendError> {
        {
            let mut state = self.state();
            let mut stored = task.clone();
            stored.version = 1;
            state.tasks.insert(task.id, stored);
            state.push(message);
        }
        self.queue_changed();
        self.task_changed();
        Ok(())
    }

    async fn load_task(&self, id: TaskId) -> Result<Option<TaskInstance>, BackendError> {
        Ok(self.state().tasks.get(&id).cloned())
    }

    async fn list_tasks(&self, saga: &str) -> Result<Vec<TaskInstance>, BackendError> {
        let state = self.state();
        let mut tasks: Vec<_> = state
            .tasks
            .values()
            .filter(|t| t.saga == saga)
            .cloned()
            .collect();
        tasks.sort_by_key(|t| (t.created_at, t.id));
        Ok(tasks)
    }

    async fn save_and_claim(
        &self,
        task: &TaskInstance,
        lease: &Lease,
        claim: &str,
        ttl: Duration,
    ) -> Result<(u64, bool), BackendError> {
        let result = {
            let mut state = self.state();
            state.check_write(task, lease)?;
            let version = state.write(task);
            let claimed = state.claim(claim, ttl, Instant::now());
            (version, claimed)
        };
        self.task_changed();
        Ok(result)
    }

    async fn commit(
        &self,
        task: &TaskInstance,
        lease: &Lease,
        enqueue: Option<&str>,
        settle: Settle<'_>,
        unless_cancelled: bool,
    ) -> Result<u64, BackendError> {
        let version = {
            let mut state = self.state();
            state.check_write(task, lease)?;
            if let Some(at) = state.cancels.get(&task.id).filter(|_| unless_cancelled) {
                return Err(BackendError::CancelRequested {
                    task: task.id,
                    at: *at,
                });
            }
            let version = state.write(task);
            if let Some(payload) = enqueue {
                state.push(payload);
            }
            state.settle(settle, Some(task.id));
            if state.lock_held_by(lease, Instant::now()) {
                state.locks.remove(&lease.task_id);
            }
            version
        };
        self.queue_changed();
        self.task_changed();
        Ok(version)
    }

    async fn try_lock(&self, id: TaskId, ttl: Duration) -> Result<Option<Lease>, BackendError> {
        let mut state = self.state();
        let now = Instant::now();
        if matches!(state.locks.get(&id), Some((_, exp)) if *exp > now) {
            return Ok(None);
        }
        let token = Uuid::new_v4().simple().to_string();
        let fence = {
            let f = state.fences.entry(id).or_insert(0);
            *f += 1;
            *f
        };
        state.locks.insert(id, (token.clone(), now + ttl));
        Ok(Some(Lease {
            task_id: id,
            token,
            fence,
        }))
    }

    async fn extend_lock(&self, lease: &Lease, ttl: Duration) -> Result<bool, BackendError> {
        let mut state = self.state();
        let now = Instant::now();
        if !state.lock_held_by(lease, now) {
            return Ok(false);
        }
        state
            .locks
            .insert(lease.task_id, (lease.token.clone(), now + ttl));
        Ok(true)
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

    async fn try_claim(&self, key: &str, ttl: Duration) -> Result<bool, BackendError> {
        Ok(self.state().claim(key, ttl, Instant::now()))
    }

    async fn enqueue(&self, payload: &str) -> Result<(), BackendError> {
        self.state().push(payload);
        self.queue_changed();
        Ok(())
    }

    async fn receive(
        &self,
        consumer: &str,
        wait: Duration,
    ) -> Result<Option<Delivery>, BackendError> {
        // Nothing below suspends when a message is ready, so without this a
        // worker whose message bounces (a locked task, handed back) would
        // never give its thread to the worker holding the lock. A network
        // backend yields on its I/O anyway.
        tokio::task::yield_now().await;
        let deadline = Instant::now() + wait;
        loop {
            // Register interest before looking, so a push between the look
            // and the wait is not missed.
            let notified = self.shared.queue_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wake = {
                let mut state = self.state();
                let now = Instant::now();
                state.promote(now);
                if let Some(mut m) = state.ready.pop_front() {
                    m.deliveries += 1;
                    let delivery = Delivery {
                        id: m.id.clone(),
                        payload: m.payload.clone(),
                        delivery_count: m.deliveries,
                        consumer: consumer.to_owned(),
                    };
                    let visible_again = now + self.shared.visibility_timeout;
                    state.in_flight.insert(m.id.clone(), (m, visible_again));
                    return Ok(Some(delivery));
                }
                if now >= deadline {
                    return Ok(None);
                }
                state.next_wakeup().map_or(deadline, |at| at.min(deadline))
            };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
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
        {
            let mut state = self.state();
            if let Some((m, _)) = state.in_flight.remove(&delivery.id) {
                state.delayed.push((Instant::now() + delay, m));
            }
        }
        self.queue_changed();
        Ok(())
    }

    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &str,
        task_id: Option<TaskId>,
    ) -> Result<(), BackendError> {
        self.state()
            .settle(Settle::DeadLetter(delivery, reason), task_id);
        Ok(())
    }

    async fn dead_letters(&self) -> Result<Vec<DeadLetter>, BackendError> {
        Ok(self.state().dead.clone())
    }

    async fn requeue_dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        let letter = {
            let mut state = self.state();
            let index = state.dead.iter().position(|d| d.id == id);
            let letter = index.map(|i| state.dead.remove(i));
            if let Some(letter) = &letter {
                state.push(&letter.payload);
            }
            letter
        };
        self.queue_changed();
        Ok(letter)
    }

    async fn request_cancel(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError> {
        let previous = {
            let mut state = self.state();
            let previous = state.cancels.get(&id).copied();
            state.cancels.entry(id).or_insert_with(Timestamp::now);
            previous
        };
        if previous.is_none() {
            let _ = self.shared.cancels.send(id);
        }
        Ok(previous)
    }

    async fn cancel_requested(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError> {
        Ok(self.state().cancels.get(&id).copied())
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
            if let Some(instance) = commit.instance {
                let key = (process.to_owned(), instance.id.clone());
                let stored = state.instances.get(&key).map_or(0, |i| i.version);
                if stored != instance.version {
                    return Err(BackendError::ProcessConflict {
                        process: process.to_owned(),
                        instance: instance.id.clone(),
                    });
                }
                for (field, value) in &commit.add_keys {
                    let ikey = (process.to_owned(), field.clone(), value.clone());
                    if matches!(state.index.get(&ikey), Some(owner) if *owner != instance.id) {
                        return Err(BackendError::ProcessConflict {
                            process: process.to_owned(),
                            instance: instance.id.clone(),
                        });
                    }
                }
                for (field, value) in &commit.remove_keys {
                    let ikey = (process.to_owned(), field.clone(), value.clone());
                    if state.index.get(&ikey) == Some(&instance.id) {
                        state.index.remove(&ikey);
                    }
                }
                if commit.delete {
                    state.instances.remove(&key);
                    let id = instance.id.clone();
                    state
                        .index
                        .retain(|(p, _, _), owner| !(p == process && *owner == id));
                } else {
                    for (field, value) in &commit.add_keys {
                        state.index.insert(
                            (process.to_owned(), field.clone(), value.clone()),
                            instance.id.clone(),
                        );
                    }
                    let mut stored = instance.clone();
                    stored.version += 1;
                    stored.updated_at = Timestamp::now();
                    version = stored.version;
                    state.instances.insert(key, stored);
                }
            }
            for payload in &commit.enqueue {
                state.push(payload);
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
            state.settle(commit.settle, None);
            version
        };
        self.queue_changed();
        Ok(version)
    }

    async fn process_enqueue(&self, payloads: &[String]) -> Result<(), BackendError> {
        {
            let mut state = self.state();
            for payload in payloads {
                state.push(payload);
            }
        }
        self.queue_changed();
        Ok(())
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
            let released: Vec<(u64, String)> = state.scheduled.drain(..due).collect();
            for (_, payload) in &released {
                state.push(payload);
            }
            released.len()
        };
        if moved > 0 {
            self.queue_changed();
        }
        Ok(moved)
    }

    async fn process_scheduled(&self) -> Result<Vec<(u64, String)>, BackendError> {
        Ok(self.state().scheduled.clone())
    }

    async fn endpoint_messages(&self, endpoint: &str) -> Result<Vec<String>, BackendError> {
        Ok(self
            .state()
            .endpoints
            .get(endpoint)
            .cloned()
            .unwrap_or_default())
    }

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

    async fn wait_for_change(&self, _id: TaskId, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.shared.task_changed.notified()).await;
    }
}
