//! [`EngineBuilder`]: what an engine runs and how.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::Engine;
use crate::backend::memory::MemoryBackend;
use crate::backend::Backend;
use crate::error::Error;
use crate::policy::RetryPolicy;
use crate::process::{ErasedProcess, ProcessManager};
use crate::saga::{ErasedSaga, Saga, SagaRegistry};
use crate::worker::runtime::{Runtime, Settings};

/// Configures an [`Engine`].
pub struct EngineBuilder {
    backend: Option<Arc<dyn Backend>>,
    sagas: Vec<Arc<dyn ErasedSaga>>,
    processes: Vec<Arc<dyn ErasedProcess>>,
    transports: Vec<Arc<dyn crate::transport::Transport>>,
    workers: usize,
    settings: Settings,
}

impl EngineBuilder {
    pub(super) fn new() -> Self {
        EngineBuilder {
            backend: None,
            sagas: Vec::new(),
            processes: Vec::new(),
            transports: Vec::new(),
            workers: 4,
            settings: Settings::default(),
        }
    }

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

    /// Talks to other services through `transport` (a broker: see
    /// [`crate::transport`]): every process manager's messages arrive
    /// from it, the sagas it was told to start from commands, and the
    /// endpoints it was told to relay go out through it. Several
    /// transports may be given, each with a name of its own.
    pub fn transport(mut self, transport: impl crate::transport::Transport) -> Self {
        self.transports.push(Arc::new(transport));
        self
    }

    /// How many messages may wait on the store's work queue before the
    /// transports stop taking more from their brokers (default 10,000):
    /// the broker holds the rest, rather than the store growing without
    /// bound behind slow handlers.
    pub fn transport_backlog(mut self, messages: u64) -> Self {
        self.settings.transport_backlog = messages.max(1);
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

    /// How many messages each worker works on at once (default 1). Each
    /// runs as a task of its own; a worker with free slots reads several
    /// messages per read (under load it lets a couple of milliseconds pass
    /// for more slots to free up, never longer). On Redis, with no-op
    /// steps, 8 workers of concurrency 16 do about twice the steps per
    /// second of 8 workers of 1, for a fraction of the reads per step
    /// (`examples/bench_redis`). Steps of one task never run at once
    /// whatever this is: the task's lease sees to it.
    ///
    /// The cost: a message that crashes its process (an abort, running out
    /// of memory) takes the messages in flight beside it down too, and each
    /// of those deliveries counts towards their own poison cap
    /// ([`max_deliveries`](Self::max_deliveries)). Raise the cap with the
    /// concurrency where crashes are possible; the default of 1 keeps a
    /// crash to the message that caused it.
    pub fn worker_concurrency(mut self, n: usize) -> Self {
        self.settings.worker_concurrency = n.max(1);
        self
    }

    /// How long one attempt of a step (or compensation, or process-manager
    /// handler) may run when its `#[saga_step(n, timeout_ms = ..)]` says
    /// nothing (default 5 minutes). A timed-out attempt's
    /// `ctx.cancelled()` fires; after the [stop grace](Self::stop_grace) it
    /// is dropped and counts as a transient failure.
    pub fn step_timeout(mut self, timeout: Duration) -> Self {
        self.settings.step_timeout = timeout;
        self
    }

    /// How long an attempt asked to stop (its timeout ran out, or its task
    /// was cancelled) has to return before it is dropped (default 5 s).
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.settings.stop_grace = grace;
        self
    }

    /// TTL of the task lease (default: the backend's visibility timeout).
    /// The lease is renewed while a step runs, so this bounds how long a
    /// dead worker's task stays blocked, not how long a step may run.
    pub fn lock_ttl(mut self, ttl: Duration) -> Self {
        self.settings.lease_ttl = Some(ttl);
        self
    }

    /// How soon a message for a locked task is tried again (default 100 ms).
    pub fn lock_retry_delay(mut self, delay: Duration) -> Self {
        self.settings.lock_retry_delay = delay;
        self
    }

    /// How often a running step renews its lease and polls for a
    /// cancellation requested in another process (default 1 s, and at least
    /// three times per lease). Requests made through this engine reach the
    /// step at once.
    pub fn cancel_poll_interval(mut self, interval: Duration) -> Self {
        self.settings.heartbeat = interval;
        self
    }

    /// How long a graceful shutdown waits for running steps (default 30 s).
    /// A step still running then sees `ctx.cancelled()` fire, gets the
    /// [`stop_grace`](Self::stop_grace) to return, and is handed to another
    /// worker as *interrupted*: made again at once, without counting
    /// against its retry budget (a redeploy does not fail a step that
    /// allows no retries). Side effects of the interrupted attempt may have
    /// happened: steps use [`StepContext::idempotency_key`](crate::StepContext::idempotency_key).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.settings.shutdown_grace = grace;
        self
    }

    /// Deliveries a message may go through without any worker settling it
    /// (each one's worker died handling it) before it is dead-lettered as
    /// poison (default 10). A saga task whose message is poison ends
    /// `DeadLettered`.
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.settings.max_deliveries = n;
        self
    }

    /// How long a task that ended `Completed`, `Compensated`, `Failed` or
    /// `Cancelled` is kept (default 7 days; `None` keeps it for ever). Every
    /// key of the task goes when it expires.
    pub fn retention(mut self, keep: Option<Duration>) -> Self {
        self.settings.retention = keep;
        self
    }

    /// How long a task that ended `CompensationFailed` or `DeadLettered`,
    /// and a dead letter, is kept for an operator (default 30 days; `None`
    /// keeps them for ever).
    pub fn attention_retention(mut self, keep: Option<Duration>) -> Self {
        self.settings.attention_retention = keep;
        self
    }

    /// The most dead letters kept (per queue partition; default 100,000):
    /// older ones are removed first.
    pub fn max_dead_letters(mut self, n: usize) -> Self {
        self.settings.dead_letters_max = n;
        self
    }

    /// How long a queue consumer may sit idle with nothing in hand before
    /// housekeeping removes it from its group (default 10 minutes): a worker
    /// process that exited leaves its consumers behind.
    pub fn idle_consumer_timeout(mut self, idle: Duration) -> Self {
        self.settings.idle_consumers = idle;
        self
    }

    /// How often housekeeping runs (default 30 s; one engine at a time).
    pub fn housekeeping_interval(mut self, every: Duration) -> Self {
        self.settings.housekeeping_interval = every;
        self
    }

    /// How `start`, `wait`, `task` and `cancel` retry a backend that is
    /// briefly unreachable (default: exponential from 50 ms, capped at 1 s,
    /// 30 retries: about 25 s) before returning [`Error::Unavailable`].
    pub fn client_retry(mut self, policy: RetryPolicy) -> Self {
        self.settings.client_retry = policy;
        self
    }

    /// What becomes of a continuing (`#[handles]`) message whose hold
    /// ended without an instance (see [`hold_unmatched`](Self::hold_unmatched)),
    /// unless its handler says (`#[handles(then = drop)]`): parked on the
    /// dead-letter queue (`true`, the default), or dropped with a warning
    /// and counted as `unmatched` (`false`).
    pub fn dead_letter_unmatched(mut self, yes: bool) -> Self {
        self.settings.dead_letter_unmatched = yes;
        self
    }

    /// How long a continuing (`#[handles]`) message that finds no
    /// instance is held for it, unless its handler says
    /// (`#[handles(hold = "10m")]`): default 1 hour
    /// ([`DEFAULT_HOLD_UNMATCHED`](crate::DEFAULT_HOLD_UNMATCHED)); zero
    /// holds nothing. A held message waits durably under the correlation
    /// value it looked for (at most [`HOLD_CAP`](crate::process::HOLD_CAP)
    /// per value) and is handled, in the order held, as soon as the
    /// instance starts or takes the value; past its hold,
    /// [`dead_letter_unmatched`](Self::dead_letter_unmatched) decides.
    pub fn hold_unmatched(mut self, hold: Duration) -> Self {
        self.settings.hold_unmatched = hold;
        self
    }

    /// How long a deleted process-manager instance (`ctx.stop()`,
    /// `on_complete = delete`) leaves a tombstone of the message ids it
    /// handled (default 24 h): a late duplicate of one of them is dropped
    /// instead of starting the process again. Past it, such a duplicate
    /// starts a new instance; keep it longer than your brokers' redelivery
    /// horizon.
    pub fn process_tombstones(mut self, ttl: Duration) -> Self {
        self.settings.process_tombstone_ttl = ttl;
        self
    }

    /// How often due retries and timeouts are moved onto the queue
    /// (default 100 ms; one engine at a time).
    pub fn timeout_poll_interval(mut self, interval: Duration) -> Self {
        self.settings.timer_poll = interval;
        self
    }

    fn check(&self) -> Result<(), Error> {
        let s = &self.settings;
        let positive = [
            ("step_timeout", s.step_timeout),
            ("cancel_poll_interval", s.heartbeat),
            ("timeout_poll_interval", s.timer_poll),
            ("housekeeping_interval", s.housekeeping_interval),
        ];
        for (name, value) in positive {
            if value.is_zero() {
                return Err(Error::Config(format!("`{name}` must be longer than zero")));
            }
        }
        if s.max_deliveries == 0 {
            return Err(Error::Config(
                "`max_deliveries` must be at least 1: every message needs one delivery".into(),
            ));
        }
        Ok(())
    }

    /// Builds the engine and starts its background workers.
    pub async fn build(self) -> Result<Engine, Error> {
        self.check()?;
        let sagas = SagaRegistry::new(self.sagas)?;
        // The only saga names a record may turn into a metrics label.
        crate::metrics::register_sagas(sagas.latest().iter().map(|d| d.name));
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
        if !processes.is_empty() && backend.clone().processes().is_none() {
            return Err(Error::Config(
                "a process manager is registered, but the backend stores no process managers \
                 (`Backend::processes` is `None`; the SQLite store has none yet): use a \
                 backend that does: the in-memory, PostgreSQL or Redis backend"
                    .to_owned(),
            ));
        }
        let declared = crate::worker::limits::declared(
            sagas.all(),
            processes.values().map(|p| p.definition()),
        )?;
        if !declared.is_empty() && backend.clone().limits().is_none() {
            tracing::warn!(
                limits = ?declared.keys().collect::<Vec<_>>(),
                "the backend shares no flow-control limits (`Backend::limits` is `None`): each engine \
                 keeps its own, so a limit holds per engine, not across the deployment"
            );
        }
        let carried = carried(self.transports, &sagas, &processes).await?;
        let mut runtime = Runtime::new(backend, sagas, processes, routes, self.settings);
        runtime.transports = carried;
        let rt = Arc::new(runtime);
        let listener = rt.clone();
        let mut cancellations = rt.backend.cancellations().await?;
        rt.tasks.spawn(async move {
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
        let engine = Engine::from_runtime(rt);
        engine.spawn_workers(self.workers);
        Ok(engine)
    }
}

/// The transports with what each carries, their topology declared (a
/// broker that is away now is declared by the first duty that reaches it;
/// a topology it refuses is an error now).
async fn carried(
    transports: Vec<Arc<dyn crate::transport::Transport>>,
    sagas: &SagaRegistry,
    processes: &HashMap<&'static str, Arc<dyn ErasedProcess>>,
) -> Result<Vec<Arc<crate::worker::transports::Carried>>, Error> {
    use crate::transport::{RouteKind, TransportError};
    let mut names = Vec::new();
    let mut carried = Vec::new();
    for transport in transports {
        let name = transport.name().to_owned();
        if names.contains(&name) {
            return Err(Error::Config(format!(
                "two transports are named `{name}`: their leases and metrics would be one"
            )));
        }
        names.push(name.clone());
        for route in transport.asked().routes {
            if let RouteKind::Start { saga } = route.kind {
                if sagas.versions(saga).is_none() {
                    return Err(Error::UnknownSaga(saga.to_owned()));
                }
            }
        }
        let mut pms: Vec<_> = processes
            .values()
            .map(|pm| {
                let def = pm.definition();
                (
                    def.name,
                    def.handlers.iter().map(|h| h.message_type).collect(),
                )
            })
            .collect();
        pms.sort();
        let c = Arc::new(crate::worker::transports::Carried::new(transport, pms));
        match c.declared().await {
            Ok(()) => {}
            Err(TransportError::Unavailable(why)) => tracing::warn!(
                transport = %name, %why,
                "the broker is away: its topology is declared once it is back"
            ),
            Err(error) => return Err(Error::Config(format!("transport `{name}`: {error}"))),
        }
        carried.push(c);
    }
    Ok(carried)
}
