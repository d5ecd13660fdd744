//! What the engine and its workers share: the backend, the registered sagas
//! and process managers, the settings, the circuit breakers and the
//! cancellation tokens of the tasks running in this process.
//!
//! It lives apart from both so that data flows one way: the engine builds a
//! [`Runtime`] and starts workers on it; workers never reach back into the
//! engine.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use std::future::Future;

use crate::backend::BackendError;
use crate::error::Error;
use crate::policy::Backoff;
use tokio_util::task::TaskTracker;

use super::process::ProcessMetrics;
use crate::backend::memory::MemoryBackend;
use crate::backend::{
    Backend, Breakers, Leases, Limits, Partitions, ProcessBackend, Retention, Runners,
};
use crate::circuit::CircuitBreaker;
use crate::model::task::{TaskId, TaskStatus};
use crate::policy::{BackoffKind, RetryPolicy};
use crate::process::ErasedProcess;
use crate::saga::{SagaRegistry, StepDefinition};
use crate::util::Unpoisoned;

/// Tunables shared by every worker of an engine; see the builder methods of
/// [`EngineBuilder`](crate::engine::EngineBuilder) for what each one means.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// `None`: the backend's visibility timeout.
    pub lease_ttl: Option<Duration>,
    pub lock_retry_delay: Duration,
    pub receive_wait: Duration,
    pub worker_concurrency: usize,
    pub heartbeat: Duration,
    pub shutdown_grace: Duration,
    pub timer_poll: Duration,
    pub dead_letter_unmatched: bool,
    pub hold_unmatched: Duration,
    pub transport_backlog: u64,
    pub process_tombstone_ttl: Duration,
    pub step_timeout: Duration,
    pub stop_grace: Duration,
    pub max_deliveries: u32,
    pub retention: Option<Duration>,
    pub attention_retention: Option<Duration>,
    pub dead_letters_max: usize,
    pub idle_consumers: Duration,
    pub housekeeping_interval: Duration,
    pub client_retry: RetryPolicy,
}

/// How long a deleted process-manager instance's handled message ids are
/// remembered, so that a late duplicate of the message that started it does
/// not start it again (`EngineBuilder::process_tombstones`).
pub const DEFAULT_PROCESS_TOMBSTONE_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a continuing process-manager message that finds no instance
/// is held for it by default (`EngineBuilder::hold_unmatched`): 1 hour.
pub const DEFAULT_HOLD_UNMATCHED: Duration = Duration::from_secs(60 * 60);

/// The default retention of finished tasks: 7 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// The default retention of tasks that need an operator
/// (`CompensationFailed`, `DeadLettered`) and of dead letters: 30 days.
pub const DEFAULT_ATTENTION_RETENTION: Duration = Duration::from_secs(30 * 24 * 60 * 60);

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lease_ttl: None,
            lock_retry_delay: Duration::from_millis(100),
            receive_wait: Duration::from_secs(1),
            worker_concurrency: 1,
            heartbeat: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(30),
            timer_poll: Duration::from_millis(100),
            dead_letter_unmatched: true,
            hold_unmatched: DEFAULT_HOLD_UNMATCHED,
            transport_backlog: 10_000,
            process_tombstone_ttl: DEFAULT_PROCESS_TOMBSTONE_TTL,
            step_timeout: Duration::from_secs(5 * 60),
            stop_grace: Duration::from_secs(5),
            max_deliveries: 10,
            retention: Some(DEFAULT_RETENTION),
            attention_retention: Some(DEFAULT_ATTENTION_RETENTION),
            dead_letters_max: 100_000,
            idle_consumers: Duration::from_secs(10 * 60),
            housekeeping_interval: Duration::from_secs(30),
            // 50 ms, 100 ms, ... capped at 1 s: about 25 s in all.
            client_retry: RetryPolicy::new(30, BackoffKind::Exponential, 50)
                .with_max_delay_ms(1000)
                .with_jitter(true),
        }
    }
}

impl Settings {
    /// How long a finished task is kept, by its status (`None`: for ever).
    pub fn retention_for(&self, status: TaskStatus) -> Option<Duration> {
        match status {
            TaskStatus::CompensationFailed | TaskStatus::DeadLettered => self.attention_retention,
            s if s.is_terminal() => self.retention,
            _ => None,
        }
    }

    /// What the janitor removes.
    pub fn housekeeping(&self) -> Retention {
        Retention {
            dead_letters: self.attention_retention,
            dead_letters_max: self.dead_letters_max,
            idle_consumers: self.idle_consumers,
            batch: 1000,
        }
    }
}

/// The state shared by an engine's handles and its workers.
pub(crate) struct Runtime {
    pub backend: Arc<dyn Backend>,
    pub sagas: SagaRegistry,
    pub processes: HashMap<&'static str, Arc<dyn ErasedProcess>>,
    /// Message type -> the process managers that handle it.
    pub routes: HashMap<&'static str, Vec<&'static str>>,
    pub metrics: ProcessMetrics,
    pub settings: Settings,
    /// Names this engine's consumers: unique per engine, so two processes
    /// (two containers whose pid is 1) never share a consumer.
    pub instance: String,
    breakers: Mutex<HashMap<(&'static str, &'static str), Arc<CircuitBreaker>>>,
    running: Mutex<HashMap<TaskId, CancellationToken>>,
    pub shutdown: CancellationToken,
    /// Every task the engine spawns in this process (workers, their
    /// background duties, lease releases left to a dropped attempt):
    /// a shutdown is over only once they all are, or the process could
    /// exit with a step half-way and a lease held.
    pub tasks: TaskTracker,
    /// One process-manager handler per instance at a time in this process.
    pub instance_locks: super::process::instance_lock::InstanceLocks,
    /// Each process-manager message's place among its instance's, in the
    /// order read (`process::lanes`).
    pub lanes: Arc<super::process::lanes::Lanes>,
    /// Taken by a worker loop of an engine that runs process managers from
    /// before its read until its messages have their tickets in their
    /// lanes: two loops reading at once could ticket the later message of
    /// an instance first (their replies return in any order), and the
    /// lanes would then hand it to the instance's lock first.
    pub reading: tokio::sync::Mutex<()>,
    /// The brokers, each with what it carries (`transport`).
    pub transports: Vec<Arc<super::transports::Carried>>,
    /// The process-manager partitions this engine's workers read.
    pub partitions: super::partitions::Ownership,
    /// Messages recovered from a worker that stopped answering them run
    /// alone (see `isolation`).
    pub isolation: super::isolation::Isolation,
    /// The backend's process-manager store, if it has one.
    process_store: Option<Arc<dyn ProcessBackend>>,
    /// Named leases: the backend's, shared by the deployment, or this
    /// process's own.
    leases: Arc<dyn Leases>,
    /// `scope = shared` circuit breakers: the backend's, or this
    /// process's own.
    shared_breakers: Arc<dyn Breakers>,
    /// Placement of process-manager work: the backend's, or none (this
    /// process's own, which keeps everything together).
    partitions_placement: Arc<dyn Partitions>,
    runners: Arc<dyn Runners>,
    /// Flow-control limits: the backend's, shared by the deployment, or
    /// this process's own.
    limits: Arc<dyn Limits>,
}

impl Runtime {
    pub fn new(
        backend: Arc<dyn Backend>,
        sagas: SagaRegistry,
        processes: HashMap<&'static str, Arc<dyn ErasedProcess>>,
        routes: HashMap<&'static str, Vec<&'static str>>,
        settings: Settings,
    ) -> Self {
        // Leases and breakers held in this process, for a backend that
        // shares none between engines: one process has no one else to
        // coordinate with.
        let local_leases = || Arc::new(MemoryBackend::new()) as Arc<dyn Leases>;
        let local_breakers = || Arc::new(MemoryBackend::new()) as Arc<dyn Breakers>;
        let random = uuid::Uuid::new_v4().simple().to_string();
        Runtime {
            backend: backend.clone(),
            sagas,
            processes,
            routes,
            metrics: ProcessMetrics::default(),
            settings,
            instance: format!("{}.{}", std::process::id(), &random[..6]),
            breakers: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            instance_locks: Default::default(),
            lanes: Default::default(),
            reading: Default::default(),
            transports: Vec::new(),
            partitions: Default::default(),
            isolation: Default::default(),
            process_store: backend.clone().processes(),
            leases: backend.clone().leases().unwrap_or_else(local_leases),
            shared_breakers: backend.clone().breakers().unwrap_or_else(local_breakers),
            partitions_placement: backend
                .clone()
                .partitions()
                .unwrap_or_else(|| Arc::new(MemoryBackend::new())),
            runners: backend
                .clone()
                .runners()
                .unwrap_or_else(|| Arc::new(MemoryBackend::new())),
            limits: backend
                .clone()
                .limits()
                .unwrap_or_else(|| Arc::new(MemoryBackend::new())),
        }
    }

    /// The backend's process-manager store. A backend without one is
    /// refused when the engine is built with a process manager, so this
    /// fails only for an operator call (a tally, an instance) on an
    /// engine that runs none.
    pub fn processes(&self) -> Result<&dyn ProcessBackend, BackendError> {
        self.process_store.as_deref().ok_or_else(no_process_store)
    }

    /// The same, to keep.
    pub fn process_store(&self) -> Result<Arc<dyn ProcessBackend>, BackendError> {
        self.process_store.clone().ok_or_else(no_process_store)
    }

    /// Named leases (the backend's, or this process's own).
    pub fn leases(&self) -> &dyn Leases {
        &*self.leases
    }

    /// Placement of process-manager work over partitions (the backend's,
    /// or everything together).
    pub fn placement(&self) -> &dyn Partitions {
        &*self.partitions_placement
    }

    /// Which engines run what (the backend's, or none known beside this
    /// one).
    pub fn runners(&self) -> &dyn Runners {
        &*self.runners
    }

    /// Flow-control limits (the backend's, or this process's own).
    pub fn limits(&self) -> &dyn Limits {
        &*self.limits
    }

    /// `scope = shared` circuit breakers (the backend's, or this
    /// process's own).
    pub fn shared_breakers(&self) -> &dyn Breakers {
        &*self.shared_breakers
    }

    /// The task lease's TTL: short, renewed by the heartbeat, so that a
    /// killed worker's tasks resume once their messages are redelivered.
    pub fn lease_ttl(&self) -> Duration {
        self.settings
            .lease_ttl
            .unwrap_or_else(|| self.backend.visibility_timeout())
            .max(Duration::from_millis(30))
    }

    /// How often a running step's lease and message are renewed: a third
    /// of the shorter of the lease and the visibility timeout (a lease
    /// longer than the visibility timeout must not let the message go idle
    /// and be claimed away mid-step), at most the heartbeat setting.
    pub fn heartbeat_every(&self) -> Duration {
        (self.lease_ttl().min(self.backend.visibility_timeout()) / 3)
            .min(self.settings.heartbeat)
            .max(Duration::from_millis(10))
    }

    /// The process managers that handle `message_type`.
    pub fn subscribers(&self, message_type: &str) -> Vec<&'static str> {
        self.routes.get(message_type).cloned().unwrap_or_default()
    }

    /// The breaker of one saga step, shared by every task of this engine.
    pub fn breaker(
        &self,
        saga: &'static str,
        step: &StepDefinition,
    ) -> Option<Arc<CircuitBreaker>> {
        let config = step.circuit_breaker?;
        let mut breakers = self.breakers.locked();
        Some(
            breakers
                .entry((saga, step.name))
                .or_insert_with(|| Arc::new(CircuitBreaker::new(config)))
                .clone(),
        )
    }

    /// Runs `call` until it succeeds, fails for good, or the backend stayed
    /// unreachable for the whole client retry policy.
    pub async fn retrying<T, F, Fut>(
        &self,
        operation: &'static str,
        mut call: F,
    ) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, BackendError>>,
    {
        let mut schedule = self.settings.client_retry.schedule(0);
        let mut attempts = 0u32;
        loop {
            // A dropped connection is only noticed when used, and the
            // failure sets up a fresh one: each try gets one immediate
            // second chance on it before we back off.
            attempts += 2;
            let error = match call().await {
                Ok(value) => return Ok(value),
                Err(error) if error.is_transient() => match call().await {
                    Ok(value) => return Ok(value),
                    Err(again) if again.is_transient() => again,
                    Err(again) => return Err(again.into()),
                },
                Err(error) => return Err(error.into()),
            };
            let Some(delay) = schedule.next_backoff() else {
                return Err(Error::Unavailable {
                    operation,
                    attempts,
                    source: error,
                });
            };
            tracing::debug!(operation, %error, ?delay, "backend unavailable; retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// Registers the token of a task that starts running here; the token is
    /// forgotten when the returned guard drops.
    pub fn register_running(self: &Arc<Self>, id: TaskId) -> Running {
        let token = CancellationToken::new();
        self.running.locked().insert(id, token.clone());
        Running {
            runtime: self.clone(),
            id,
            token,
        }
    }

    /// Fires the token of a task running here, if it is.
    pub fn signal_cancel(&self, id: TaskId) {
        if let Some(token) = self.running.locked().get(&id) {
            token.cancel();
        }
    }
}

fn no_process_store() -> BackendError {
    BackendError::Misconfigured(
        "this backend stores no process managers (`Backend::processes` is `None`)".to_owned(),
    )
}

/// A task running in this process: its cancellation token, registered for
/// as long as this guard lives (however the run ends, a shutdown included).
pub(crate) struct Running {
    runtime: Arc<Runtime>,
    id: TaskId,
    pub token: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.runtime.running.locked().remove(&self.id);
    }
}
