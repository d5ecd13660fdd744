//! The engine: start, wait for, inspect and cancel tasks; run workers; manage
//! the dead-letter queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backend::memory::MemoryBackend;
use crate::backend::{Backend, BackendError, QueueMessage, Settle};
use crate::circuit::CircuitBreaker;
use crate::error::Error;
use crate::process::{Envelope, EnvelopeKind, ErasedProcess, Message, ProcessManager};
use crate::saga::{BoxFuture, Cancellable, ErasedSaga, Saga};
use crate::task::{AuditAction, AuditEntry, StepStatus, TaskId, TaskInstance, TaskStatus};
use crate::worker;

pub use crate::backend::ProcessInstance;

/// Counters of process-manager outcomes in this engine (like metrics: per
/// process, since start).
#[derive(Debug, Default)]
pub struct ProcessMetrics {
    /// Messages whose handler ran and whose result was saved.
    pub handled: std::sync::atomic::AtomicU64,
    /// Continuing messages that matched no instance.
    pub unmatched: std::sync::atomic::AtomicU64,
    /// Exact duplicates dropped.
    pub duplicates: std::sync::atomic::AtomicU64,
    /// Messages ignored because the instance was complete, stopped or gone.
    pub ignored: std::sync::atomic::AtomicU64,
    /// Handler failures (each `#[on_error]` decision).
    pub failed: std::sync::atomic::AtomicU64,
    /// Messages dead-lettered.
    pub dead_lettered: std::sync::atomic::AtomicU64,
}

pub use crate::backend::DeadLetter;

/// The result of [`Engine::cancel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CancelResult {
    /// Cancellation was recorded: the running step's token is signalled and
    /// the completed steps will be compensated in reverse order; the task
    /// ends `Cancelled` (or `CompensationFailed`).
    Cancelled,
    /// No such task.
    NotFound,
    /// The task already completed; nothing to cancel.
    AlreadyCompleted,
    /// Cancellation was already requested (or the task is cancelled).
    AlreadyCancelled,
    /// The task already ended another way (failed, compensated, dead-lettered)
    /// or is compensating after a failure: cancelling has no meaning.
    NotCancellable(TaskStatus),
}

/// Tunables shared by every worker of an engine.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub lock_ttl: Duration,
    pub idempotency_ttl: Duration,
    pub lock_retry_delay: Duration,
    pub receive_wait: Duration,
    pub cancel_poll: Duration,
    pub shutdown_grace: Duration,
    pub timeout_poll: Duration,
    pub dead_letter_unmatched: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lock_ttl: Duration::from_secs(5 * 60),
            idempotency_ttl: Duration::from_secs(24 * 60 * 60),
            lock_retry_delay: Duration::from_millis(100),
            receive_wait: Duration::from_secs(1),
            cancel_poll: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(30),
            timeout_poll: Duration::from_millis(100),
            dead_letter_unmatched: false,
        }
    }
}

/// Configures an [`Engine`].
pub struct EngineBuilder {
    backend: Option<Arc<dyn Backend>>,
    sagas: Vec<Arc<dyn ErasedSaga>>,
    processes: Vec<Arc<dyn ErasedProcess>>,
    workers: usize,
    settings: Settings,
}

impl EngineBuilder {
    /// Registers a saga (its dependencies live in `saga`).
    pub fn saga<S: Saga>(mut self, saga: S) -> Self {
        self.sagas.push(Arc::new(saga));
        self
    }

    /// Registers a process manager (its dependencies live in `pm`).
    pub fn process_manager<P: ProcessManager>(mut self, pm: P) -> Self {
        self.processes.push(Arc::new(pm));
        self
    }

    /// Dead-letter continuing messages that match no instance, instead of
    /// only logging and counting them (default: off).
    pub fn dead_letter_unmatched(mut self, yes: bool) -> Self {
        self.settings.dead_letter_unmatched = yes;
        self
    }

    /// How often the timeout poller looks for due timeouts (default 100 ms).
    pub fn timeout_poll_interval(mut self, interval: Duration) -> Self {
        self.settings.timeout_poll = interval;
        self
    }

    /// Uses `backend` instead of a fresh [`MemoryBackend`].
    pub fn backend(mut self, backend: impl Backend) -> Self {
        self.backend = Some(Arc::new(backend));
        self
    }

    /// Uses a shared backend.
    pub fn backend_arc(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Background workers started by [`build`](Self::build) (default 4).
    /// Use 0 for a process that only starts and inspects tasks and leaves
    /// the work to [`Engine::run_workers`] elsewhere.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// TTL of the task lock (default 5 minutes). The lock is extended while a
    /// step runs, so this bounds how long a dead worker's task stays blocked.
    pub fn lock_ttl(mut self, ttl: Duration) -> Self {
        self.settings.lock_ttl = ttl;
        self
    }

    /// TTL of idempotency keys (default 24 hours).
    pub fn idempotency_ttl(mut self, ttl: Duration) -> Self {
        self.settings.idempotency_ttl = ttl;
        self
    }

    /// How soon a message for a locked task is tried again (default 100 ms;
    /// backends with a visibility timeout may take longer).
    pub fn lock_retry_delay(mut self, delay: Duration) -> Self {
        self.settings.lock_retry_delay = delay;
        self
    }

    /// How often a running step polls the backend for a cancellation request
    /// made in another process (default 1 s). Requests made through this
    /// engine reach the step at once.
    pub fn cancel_poll_interval(mut self, interval: Duration) -> Self {
        self.settings.cancel_poll = interval;
        self
    }

    /// How long a graceful shutdown waits for running steps (default 30 s)
    /// before handing their messages back for redelivery.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.settings.shutdown_grace = grace;
        self
    }

    /// Builds the engine and starts its background workers.
    pub async fn build(self) -> Result<Engine, Error> {
        let mut sagas = HashMap::new();
        for saga in self.sagas {
            let name = saga.definition().name;
            if sagas.insert(name, saga).is_some() {
                return Err(Error::DuplicateSaga(name.to_owned()));
            }
        }
        let mut processes = HashMap::new();
        let mut routes: HashMap<&'static str, Vec<&'static str>> = HashMap::new();
        for pm in self.processes {
            let def = pm.definition();
            for (i, handler) in def.handlers.iter().enumerate() {
                if def.handlers[..i]
                    .iter()
                    .any(|h| h.message_type == handler.message_type)
                {
                    return Err(Error::DuplicateMessageType {
                        process: def.name.to_owned(),
                        message_type: handler.message_type.to_owned(),
                    });
                }
                routes
                    .entry(handler.message_type)
                    .or_default()
                    .push(def.name);
            }
            if processes.insert(def.name, pm).is_some() {
                return Err(Error::DuplicateSaga(def.name.to_owned()));
            }
        }
        let backend = self
            .backend
            .unwrap_or_else(|| Arc::new(MemoryBackend::new()));
        let inner = Arc::new(Inner {
            backend,
            sagas,
            processes,
            routes,
            metrics: ProcessMetrics::default(),
            settings: self.settings,
            breakers: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            shutdown: CancellationToken::new(),
        });
        let listener = inner.clone();
        let mut cancellations = inner.backend.cancellations().await?;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = listener.shutdown.cancelled() => return,
                    next = cancellations.next() => match next {
                        Some(id) => listener.signal_cancel(id),
                        None => return,
                    },
                }
            }
        });
        let engine = Engine {
            inner: inner.clone(),
            _owner: Arc::new(Owner(inner.shutdown.clone())),
        };
        for n in 0..self.workers {
            let inner = inner.clone();
            tokio::spawn(async move { worker::run(inner, format!("bg-{n}")).await });
        }
        if self.workers > 0 && !inner.processes.is_empty() {
            tokio::spawn(worker::poll_timeouts(inner.clone()));
        }
        Ok(engine)
    }
}

/// Stops the background workers when the last [`Engine`] handle is dropped.
struct Owner(CancellationToken);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

pub(crate) struct Inner {
    pub backend: Arc<dyn Backend>,
    pub sagas: HashMap<&'static str, Arc<dyn ErasedSaga>>,
    pub processes: HashMap<&'static str, Arc<dyn ErasedProcess>>,
    /// Message type -> the process managers that handle it.
    pub routes: HashMap<&'static str, Vec<&'static str>>,
    pub metrics: ProcessMetrics,
    pub settings: Settings,
    breakers: Mutex<HashMap<(&'static str, &'static str), Arc<CircuitBreaker>>>,
    running: Mutex<HashMap<TaskId, CancellationToken>>,
    pub shutdown: CancellationToken,
}

impl Inner {
    /// The process managers that handle `message_type`.
    pub fn subscribers(&self, message_type: &str) -> Vec<&'static str> {
        self.routes.get(message_type).cloned().unwrap_or_default()
    }

    /// The breaker of one saga step, shared by every task of this engine.
    pub fn breaker(
        &self,
        saga: &'static str,
        step: &crate::saga::StepDefinition,
    ) -> Option<Arc<CircuitBreaker>> {
        let config = step.circuit_breaker?;
        let mut breakers = self.breakers.lock().unwrap_or_else(|p| p.into_inner());
        Some(
            breakers
                .entry((saga, step.name))
                .or_insert_with(|| Arc::new(CircuitBreaker::new(config)))
                .clone(),
        )
    }

    /// Registers the token of a task that starts running here.
    pub fn register_running(&self, id: TaskId) -> CancellationToken {
        let token = CancellationToken::new();
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, token.clone());
        token
    }

    pub fn unregister_running(&self, id: TaskId) {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    fn signal_cancel(&self, id: TaskId) {
        if let Some(token) = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
        {
            token.cancel();
        }
    }
}

/// Starts, inspects and cancels tasks. Cheap to clone; every clone is the
/// same engine. Dropping the last clone stops its background workers.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
    _owner: Arc<Owner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<_> = self.inner.sagas.keys().collect();
        names.sort();
        f.debug_struct("Engine")
            .field("sagas", &names)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// A builder with the in-memory backend and 4 background workers.
    pub fn builder() -> EngineBuilder {
        EngineBuilder {
            backend: None,
            sagas: Vec::new(),
            processes: Vec::new(),
            workers: 4,
            settings: Settings::default(),
        }
    }

    /// The definitions of the registered sagas, sorted by name.
    pub fn sagas(&self) -> Vec<&'static crate::saga::SagaDefinition> {
        let mut defs: Vec<_> = self.inner.sagas.values().map(|s| s.definition()).collect();
        defs.sort_by_key(|d| d.name);
        defs
    }

    /// The backend, for operators and tests.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Starts a task of saga `S`; returns at once with its id.
    pub async fn start<S: Saga>(&self, input: S::Input) -> Result<TaskId, Error> {
        let def = S::definition();
        if !self.inner.sagas.contains_key(def.name) {
            return Err(Error::UnknownSaga(def.name.to_owned()));
        }
        let input = serde_json::to_value(input)?;
        let steps = def.steps.iter().map(|s| (s.name.to_owned(), s.order));
        let task = TaskInstance::new(def.name, input, steps);
        let message = QueueMessage {
            task_id: task.id,
            saga: def.name.to_owned(),
            seq: 0,
        };
        self.inner
            .backend
            .create_task(&task, &message.to_payload())
            .await?;
        tracing::info!(task_id = %task.id, saga = def.name, trace_id = %task.trace_id, "task started");
        Ok(task.id)
    }

    /// A fresh copy of the task, if it exists.
    pub async fn task(&self, id: TaskId) -> Result<Option<TaskInstance>, Error> {
        Ok(self.inner.backend.load_task(id).await?)
    }

    /// Every task of the saga named `saga`.
    pub async fn tasks_of(&self, saga: &str) -> Result<Vec<TaskInstance>, Error> {
        Ok(self.inner.backend.list_tasks(saga).await?)
    }

    /// Waits until the task reaches a terminal status and returns it.
    pub async fn wait(&self, id: TaskId) -> Result<TaskInstance, Error> {
        loop {
            match self.inner.backend.load_task(id).await? {
                None => return Err(Error::TaskNotFound(id)),
                Some(task) if task.status.is_terminal() => return Ok(task),
                Some(_) => {
                    self.inner
                        .backend
                        .wait_for_change(id, Duration::from_millis(50))
                        .await
                }
            }
        }
    }

    /// Requests cancellation of a task of a `#[cancellable]` saga.
    ///
    /// Returns once the request is recorded: the running step's
    /// [`StepContext::cancelled`](crate::StepContext::cancelled) fires (in
    /// whichever process runs it), then the completed steps are compensated
    /// in reverse order. [`wait`](Self::wait) for the final status.
    // Returns a boxed future whose type does not mention `S`: the
    // `Cancellable` bound is then checked once, at the call, and a saga
    // without `#[cancellable]` gets one error instead of one per use of the
    // future.
    pub fn cancel<S: Cancellable>(&self, id: TaskId) -> BoxFuture<'_, Result<CancelResult, Error>> {
        Box::pin(self.cancel_by_name(S::NAME, id))
    }

    /// [`cancel`](Self::cancel) by saga name, for callers that only have the
    /// name (the HTTP routes). Fails with [`Error::WrongSaga`] when the task
    /// belongs to another saga.
    pub(crate) async fn cancel_by_name(
        &self,
        saga: &str,
        id: TaskId,
    ) -> Result<CancelResult, Error> {
        let Some(task) = self.inner.backend.load_task(id).await? else {
            return Ok(CancelResult::NotFound);
        };
        if task.saga != saga {
            return Err(Error::WrongSaga {
                task: id,
                expected: saga.to_owned(),
                actual: task.saga,
            });
        }
        match task.status {
            TaskStatus::Completed => return Ok(CancelResult::AlreadyCompleted),
            TaskStatus::Cancelled => return Ok(CancelResult::AlreadyCancelled),
            _ if task.cancelled_at.is_some() => return Ok(CancelResult::AlreadyCancelled),
            TaskStatus::Pending | TaskStatus::Running => {}
            other => return Ok(CancelResult::NotCancellable(other)),
        }
        if self.inner.backend.request_cancel(id).await?.is_some() {
            return Ok(CancelResult::AlreadyCancelled);
        }
        // The task may have ended between the status check and the request.
        // From here on a worker cannot complete or fail it (its commit is
        // refused while the flag is set), so what the store says now decides.
        match self.inner.backend.load_task(id).await?.map(|t| t.status) {
            Some(TaskStatus::Completed) => return Ok(CancelResult::AlreadyCompleted),
            Some(
                status @ (TaskStatus::Failed
                | TaskStatus::DeadLettered
                | TaskStatus::Compensated
                | TaskStatus::CompensationFailed),
            ) => return Ok(CancelResult::NotCancellable(status)),
            _ => {}
        }
        self.inner.signal_cancel(id);
        tracing::info!(task_id = %id, saga, "cancellation requested");
        Ok(CancelResult::Cancelled)
    }

    /// Publishes `msg` to every registered process manager that handles its
    /// type; returns how many that is (0 is logged: nothing handles it).
    pub async fn publish<M: Message>(&self, msg: M) -> Result<usize, Error> {
        self.publish_with_id(&uuid::Uuid::new_v4().to_string(), msg)
            .await
    }

    /// [`publish`](Self::publish) with the message's own id: publishing the
    /// same id twice (a producer's retry) is recognised by the instance and
    /// the duplicate changes nothing.
    pub async fn publish_with_id<M: Message>(
        &self,
        message_id: &str,
        msg: M,
    ) -> Result<usize, Error> {
        let payload = serde_json::to_value(&msg)?;
        let subscribers = self.inner.subscribers(M::TYPE);
        if subscribers.is_empty() {
            tracing::warn!(
                message_type = M::TYPE,
                "published message has no process manager to handle it"
            );
            return Ok(0);
        }
        let envelopes: Vec<String> = subscribers
            .iter()
            .map(|process| {
                Envelope {
                    message_id: message_id.to_owned(),
                    process: (*process).to_owned(),
                    message_type: M::TYPE.to_owned(),
                    payload: payload.clone(),
                    kind: EnvelopeKind::Message,
                    instance_id: None,
                    failures: 0,
                }
                .to_payload()
            })
            .collect();
        self.inner.backend.process_enqueue(&envelopes).await?;
        Ok(envelopes.len())
    }

    /// The instance `id` of process manager `P`.
    pub async fn process_instance<P: ProcessManager>(
        &self,
        id: &str,
    ) -> Result<Option<ProcessInstance>, Error> {
        Ok(self.inner.backend.process_load(P::NAME, id).await?)
    }

    /// The instance of `P` whose correlated state field `field` is `value`.
    pub async fn find_process<P: ProcessManager>(
        &self,
        field: &str,
        value: &str,
    ) -> Result<Option<ProcessInstance>, Error> {
        Ok(self
            .inner
            .backend
            .process_find(P::NAME, field, value)
            .await?)
    }

    /// The state of instance `id` of `P`, decoded.
    pub async fn process_state<P: ProcessManager>(
        &self,
        id: &str,
    ) -> Result<Option<P::State>, Error> {
        match self.inner.backend.process_load(P::NAME, id).await? {
            Some(instance) => Ok(Some(serde_json::from_value(instance.state)?)),
            None => Ok(None),
        }
    }

    /// Every instance of `P`.
    pub async fn process_instances<P: ProcessManager>(
        &self,
    ) -> Result<Vec<ProcessInstance>, Error> {
        Ok(self.inner.backend.process_list(P::NAME).await?)
    }

    /// Process-manager counters of this engine.
    pub fn process_metrics(&self) -> &ProcessMetrics {
        &self.inner.metrics
    }

    /// Runs `n` workers in this task until Ctrl-C or [`shutdown`](Self::shutdown).
    ///
    /// Use it in worker processes (with `.workers(0)` on the builder). On
    /// shutdown the workers stop taking messages and finish their current
    /// step within the grace period; a step still running then is abandoned
    /// and its message redelivered to another worker.
    pub async fn run_workers(&self, n: usize) -> Result<(), Error> {
        let mut set = JoinSet::new();
        for i in 0..n {
            let inner = self.inner.clone();
            set.spawn(async move { worker::run(inner, format!("fg-{i}")).await });
        }
        if n > 0 && !self.inner.processes.is_empty() {
            set.spawn(worker::poll_timeouts(self.inner.clone()));
        }
        let shutdown = self.inner.shutdown.clone();
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::signal::ctrl_c() => {
                tracing::info!("Ctrl-C: stopping workers");
                shutdown.cancel();
            }
        }
        while set.join_next().await.is_some() {}
        Ok(())
    }

    /// Stops every worker of this engine (background and `run_workers`).
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    /// The messages parked on the dead-letter queue.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, Error> {
        Ok(self.inner.backend.dead_letters().await?)
    }

    /// Puts a dead-lettered message back on the queue.
    ///
    /// For a task parked by `on_exhausted = dead_letter`, the failed step gets
    /// a fresh retry budget (attempt numbers keep counting, so idempotency
    /// keys stay unique) and the task resumes `Running`.
    pub async fn requeue(&self, dead_letter_id: &str) -> Result<(), Error> {
        let backend = &self.inner.backend;
        let letter = backend
            .dead_letters()
            .await?
            .into_iter()
            .find(|d| d.id == dead_letter_id)
            .ok_or_else(|| Error::DeadLetterNotFound(dead_letter_id.to_owned()))?;
        let parked = match letter.task_id {
            Some(id) => backend
                .load_task(id)
                .await?
                .is_some_and(|t| t.status == TaskStatus::DeadLettered),
            None => false,
        };
        if !parked {
            // Bad input (or a task that moved on): put the raw message back.
            return match backend.requeue_dead_letter(dead_letter_id).await? {
                Some(_) => Ok(()),
                None => Err(Error::DeadLetterNotFound(dead_letter_id.to_owned())),
            };
        }
        let id = letter.task_id.expect("parked implies a task id");
        // The task is parked, so its lock is normally free; wait at most one
        // lease for a straggler to let go.
        let deadline = tokio::time::Instant::now() + self.inner.settings.lock_ttl;
        let locked = loop {
            if let Some(locked) = backend
                .try_lock_and_load(id, self.inner.settings.lock_ttl)
                .await?
            {
                break locked;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Backend(BackendError::Unavailable(format!(
                    "task {id} stayed locked; try the requeue again"
                ))));
            }
            tokio::time::sleep(self.inner.settings.lock_retry_delay).await;
        };
        let Some(mut task) = locked.task.filter(|t| t.status == TaskStatus::DeadLettered) else {
            backend.unlock(&locked.lease).await?;
            return Err(Error::DeadLetterNotFound(dead_letter_id.to_owned()));
        };
        for step in task
            .steps
            .iter_mut()
            .filter(|s| s.status == StepStatus::Failed)
        {
            step.status = StepStatus::Pending;
            step.retry_base = step.attempt_count;
        }
        task.error = None;
        task.audit(
            AuditEntry::new(AuditAction::Requeued).details(format!("dead letter {dead_letter_id}")),
        );
        task.set_status(TaskStatus::Running);
        task.seq += 1;
        let message = QueueMessage {
            task_id: task.id,
            saga: task.saga.clone(),
            seq: task.seq,
        };
        let committed = backend
            .commit(
                &task,
                &locked.lease,
                Some(&message.to_payload()),
                Settle::ResolveDeadLetter(dead_letter_id),
                false,
            )
            .await;
        if committed.is_err() {
            let _ = backend.unlock(&locked.lease).await;
        }
        committed?;
        Ok(())
    }
}
