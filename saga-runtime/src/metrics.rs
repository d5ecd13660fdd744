//! Prometheus metrics (feature `metrics`), recorded through the
//! [`metrics`](https://docs.rs/metrics) facade.
//!
//! The engine records to whatever global `metrics` recorder is installed:
//! [`install`] installs a Prometheus one (with the histogram buckets below)
//! and hands back its [`PrometheusHandle`]; with the `http` feature,
//! [`route`] serves it as `GET /metrics` for your axum application. Any
//! other recorder works too (call [`describe`] after installing it, for the
//! `# HELP` lines).
//!
//! ```no_run
//! # async fn run(engine: saga_runtime::Engine) -> Result<(), saga_runtime::Error> {
//! let handle = saga_runtime::metrics::install()?;
//! # #[cfg(feature = "http")]
//! let app = saga_runtime::http::router(engine).merge(saga_runtime::metrics::route(handle));
//! # Ok(()) }
//! ```
//!
//! # The metrics
//!
//! Counters count in this process since it started; sum them over the
//! processes of a deployment. Labels are bounded: saga, step and process
//! names come from the definitions registered with the engine, never from
//! task ids or error texts.
//!
//! | Name | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `saga_steps_started_total` | counter | `saga`, `step` | Step attempts started, retries included. |
//! | `saga_step_retries_total` | counter | `saga`, `step` | Attempts that were retries: a step's second and later attempts in a task (within one retry budget: an attempt interrupted by a shutdown is made again without counting). Each is in `saga_steps_started_total` too. |
//! | `saga_steps_succeeded_total` | counter | `saga`, `step` | Attempts that returned `Ok`. |
//! | `saga_steps_failed_total` | counter | `saga`, `step`, `kind` | Attempts that failed; `kind` is `transient`, `permanent`, `invalid_payload`, `timeout` (ran past its timeout) or `cancelled` (stopped by the task's cancellation). Whether a failure is retried, compensated or ends the task is the retry policy's business: see `saga_step_retries_total` and `saga_tasks_finished_total`. |
//! | `saga_step_duration_seconds` | histogram | `saga`, `step` | How long each step attempt ran, whatever its outcome. |
//! | `saga_compensations_total` | counter | `saga`, `step` | Compensation attempts started (`step`: the step being undone), retries included. |
//! | `saga_compensation_failures_total` | counter | `saga`, `step` | Compensation attempts that failed. Retried per the compensation's policy; one that fails for good ends its task `CompensationFailed`. |
//! | `saga_tasks_finished_total` | counter | `saga`, `status` | Tasks that reached a terminal status as the workers moved them: `completed`, `compensated`, `failed`, `cancelled`, `compensation_failed` or `dead_lettered`. |
//! | `saga_circuit_breaker_transitions_total` | counter | `saga`, `step`, `to` | Circuit-breaker state changes, `to` is `open`, `half_open` (a probe let through after a break, or again after a probe that did not happen) or `closed`. For `scope = shared` breakers, counted by the engine whose call made the change. |
//! | `saga_dead_letters_total` | counter | `kind` | Messages parked on a dead-letter queue: `saga` (a task's message; `saga_tasks_finished_total{status="dead_lettered"}` has them by saga), `process` (a process manager's message), `endpoint` (a message an endpoint consumer gave up on) or `undecodable` (an entry that decodes as nothing). |
//! | `saga_process_messages_total` | counter | `process`, `outcome` | Process-manager messages by outcome: `handled`, `duplicate`, `ignored` (instance complete, stopped or gone), `unmatched` (a continuing message that found no instance), `failed` (each `#[on_error]` decision), `dead_lettered` or `fanned_out`. `process` is `unknown` for a message of a process manager this engine does not run. The same counts as [`Engine::process_metrics`](crate::Engine::process_metrics). |
//! | `saga_process_conflicts_total` | counter | `process` | Handler runs thrown away because another writer saved the instance first (each re-run counts). |
//! | `saga_process_batched_total` | counter | `process` | Messages saved in the write of another message of their instance (counted as `handled` too). |
//! | `saga_process_timeouts_fired_total` | counter | `process` | Timeouts delivered to their process manager (handled, or ignored because the instance ended). |
//! | `saga_process_timeout_lateness_seconds` | histogram | `process` | How long after it was due each timeout was handled (timer polling, queueing, a backlog). |
//! | `saga_queue_depth` | gauge | `queue` | Messages on the work queue not yet settled (waiting, or taken and being worked on), `queue` being `saga` or `process`. Delayed messages (retry backoffs, timeouts) count once they are due. |
//! | `saga_queue_oldest_pending_age_seconds` | gauge | `queue` | How long the oldest of them has been on the queue (since it was enqueued or last handed back); 0 when there are none. |
//!
//! The two gauges describe the whole deployment's queue, not this process:
//! every engine running workers samples them once per
//! [`housekeeping_interval`](crate::EngineBuilder::housekeeping_interval)
//! (default 30 s; the first time one interval after it starts) with one
//! backend round trip, so aggregate them with `max`, not `sum`. A backend that cannot tell (see
//! [`WorkQueue::queue_stats`](crate::backend::WorkQueue::queue_stats))
//! reports neither.
//!
//! Tasks settled by an operator ([`Engine::resolve`](crate::Engine::resolve)
//! and the other operator actions) are not in `saga_tasks_finished_total`.
//!
//! Recording costs a label vector and a lookup in the recorder per call
//! (label values are the definitions' `&'static str`s, never copied), a
//! handful of calls per step attempt; without the `metrics` feature every
//! call compiles to nothing.
#![cfg_attr(
    not(feature = "metrics"),
    allow(dead_code, unused_imports, unused_variables)
)]

use crate::backend::Backend;
use crate::error::StepErrorKind;
use crate::model::task::TaskStatus;
use crate::saga::state_machine::{Outcome, Phase};

#[cfg(feature = "metrics")]
pub use metrics_exporter_prometheus::PrometheusHandle;

/// Step attempts started (counter; `saga`, `step`).
pub const STEPS_STARTED: &str = "saga_steps_started_total";
/// Step attempts that were retries (counter; `saga`, `step`).
pub const STEP_RETRIES: &str = "saga_step_retries_total";
/// Step attempts that succeeded (counter; `saga`, `step`).
pub const STEPS_SUCCEEDED: &str = "saga_steps_succeeded_total";
/// Step attempts that failed (counter; `saga`, `step`, `kind`).
pub const STEPS_FAILED: &str = "saga_steps_failed_total";
/// Step attempt durations (histogram, seconds; `saga`, `step`).
pub const STEP_DURATION: &str = "saga_step_duration_seconds";
/// Compensation attempts started (counter; `saga`, `step`).
pub const COMPENSATIONS: &str = "saga_compensations_total";
/// Compensation attempts that failed (counter; `saga`, `step`).
pub const COMPENSATION_FAILURES: &str = "saga_compensation_failures_total";
/// Tasks finished, by terminal status (counter; `saga`, `status`).
pub const TASKS_FINISHED: &str = "saga_tasks_finished_total";
/// Circuit-breaker state changes (counter; `saga`, `step`, `to`).
pub const BREAKER_TRANSITIONS: &str = "saga_circuit_breaker_transitions_total";
/// Messages dead-lettered (counter; `kind`).
pub const DEAD_LETTERS: &str = "saga_dead_letters_total";
/// Process-manager messages by outcome (counter; `process`, `outcome`).
pub const PROCESS_MESSAGES: &str = "saga_process_messages_total";
/// Process-manager handler runs lost to a concurrent write (counter; `process`).
pub const PROCESS_CONFLICTS: &str = "saga_process_conflicts_total";
/// Process-manager messages saved in another's write (counter; `process`).
pub const PROCESS_BATCHED: &str = "saga_process_batched_total";
/// Process-manager timeouts delivered (counter; `process`).
pub const PROCESS_TIMEOUTS_FIRED: &str = "saga_process_timeouts_fired_total";
/// How late each timeout was handled (histogram, seconds; `process`).
pub const PROCESS_TIMEOUT_LATENESS: &str = "saga_process_timeout_lateness_seconds";
/// Messages on the work queue not yet settled (gauge; `queue`).
pub const QUEUE_DEPTH: &str = "saga_queue_depth";
/// Age of the oldest of them (gauge, seconds; `queue`).
pub const QUEUE_OLDEST_AGE: &str = "saga_queue_oldest_pending_age_seconds";

/// The buckets of `saga_step_duration_seconds`, in seconds: from 5 ms to the
/// default step timeout (5 minutes).
pub const STEP_DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Where a dead letter came from (the `kind` label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum DeadLetterKind {
    Saga,
    Process,
    Endpoint,
    Undecodable,
}

/// A circuit breaker's new state (the `to` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BreakerState {
    Open,
    HalfOpen,
    Closed,
}

/// When a step attempt began; nothing without the feature.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch {
    #[cfg(feature = "metrics")]
    start: std::time::Instant,
}

impl Stopwatch {
    #[inline]
    fn start() -> Self {
        Stopwatch {
            #[cfg(feature = "metrics")]
            start: std::time::Instant::now(),
        }
    }
}

/// A step (or compensation) attempt begins; `retry` when it is not the
/// step's first attempt in its retry budget.
#[inline]
pub(crate) fn attempt_started(
    saga: &'static str,
    step: &'static str,
    phase: Phase,
    retry: bool,
) -> Stopwatch {
    #[cfg(feature = "metrics")]
    match phase {
        Phase::Step => {
            ::metrics::counter!(STEPS_STARTED, "saga" => saga, "step" => step).increment(1);
            if retry {
                ::metrics::counter!(STEP_RETRIES, "saga" => saga, "step" => step).increment(1);
            }
        }
        Phase::Compensation => {
            ::metrics::counter!(COMPENSATIONS, "saga" => saga, "step" => step).increment(1);
        }
    }
    Stopwatch::start()
}

/// A step (or compensation) attempt ended with `outcome`.
#[inline]
pub(crate) fn attempt_ended(
    saga: &'static str,
    step: &'static str,
    phase: Phase,
    outcome: &Outcome,
    since: Stopwatch,
) {
    #[cfg(feature = "metrics")]
    {
        let failed = match outcome {
            Outcome::Succeeded(_) => None,
            Outcome::Failed { kind, .. } => Some(match kind {
                StepErrorKind::Transient => "transient",
                StepErrorKind::Permanent => "permanent",
                StepErrorKind::InvalidPayload => "invalid_payload",
            }),
            Outcome::TimedOut { .. } => Some("timeout"),
            Outcome::Cancelled { .. } => Some("cancelled"),
            // Not the attempt's own outcome: it was stopped by a shutdown
            // (and is made again), or never ran.
            Outcome::Interrupted
            | Outcome::AlreadyClaimed
            | Outcome::CircuitOpen(_)
            | Outcome::CircuitWait { .. } => return,
        };
        match (phase, failed) {
            (Phase::Step, None) => {
                ::metrics::counter!(STEPS_SUCCEEDED, "saga" => saga, "step" => step).increment(1);
            }
            (Phase::Step, Some(kind)) => {
                ::metrics::counter!(STEPS_FAILED, "saga" => saga, "step" => step, "kind" => kind)
                    .increment(1);
            }
            (Phase::Compensation, None) => {}
            (Phase::Compensation, Some(_)) => {
                ::metrics::counter!(COMPENSATION_FAILURES, "saga" => saga, "step" => step)
                    .increment(1);
            }
        }
        if phase == Phase::Step {
            ::metrics::histogram!(STEP_DURATION, "saga" => saga, "step" => step)
                .record(since.start.elapsed());
        }
    }
}

/// The `status` label of a terminal status.
#[cfg(feature = "metrics")]
fn status_label(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Pending => "pending",
        TaskStatus::Running => "running",
        TaskStatus::Completed => "completed",
        TaskStatus::Compensating => "compensating",
        TaskStatus::Compensated => "compensated",
        TaskStatus::Failed => "failed",
        TaskStatus::Cancelled => "cancelled",
        TaskStatus::CompensationFailed => "compensation_failed",
        TaskStatus::DeadLettered => "dead_lettered",
        TaskStatus::Resolved => "resolved",
    }
}

/// A task of `saga` was committed with terminal `status`.
#[inline]
pub(crate) fn task_finished(saga: &'static str, status: TaskStatus) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(TASKS_FINISHED, "saga" => saga, "status" => status_label(status))
        .increment(1);
}

/// A task was parked `DeadLettered` by a worker that may not run its saga
/// (the name comes from the task: rare, so copied).
pub(crate) fn task_parked(saga: &str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(
        TASKS_FINISHED,
        "saga" => saga.to_owned(),
        "status" => status_label(TaskStatus::DeadLettered)
    )
    .increment(1);
}

impl From<crate::circuit::Transition> for BreakerState {
    fn from(change: crate::circuit::Transition) -> Self {
        match change {
            crate::circuit::Transition::Opened => BreakerState::Open,
            crate::circuit::Transition::HalfOpened => BreakerState::HalfOpen,
            crate::circuit::Transition::Closed => BreakerState::Closed,
        }
    }
}

/// A circuit breaker of a saga step changed state.
#[inline]
pub(crate) fn breaker_transition(saga: &'static str, step: &'static str, to: BreakerState) {
    #[cfg(feature = "metrics")]
    {
        let to = match to {
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Closed => "closed",
        };
        ::metrics::counter!(BREAKER_TRANSITIONS, "saga" => saga, "step" => step, "to" => to)
            .increment(1);
    }
}

/// A message was parked on a dead-letter queue.
#[inline]
pub(crate) fn dead_lettered(kind: DeadLetterKind) {
    #[cfg(feature = "metrics")]
    {
        let kind = match kind {
            DeadLetterKind::Saga => "saga",
            DeadLetterKind::Process => "process",
            DeadLetterKind::Endpoint => "endpoint",
            DeadLetterKind::Undecodable => "undecodable",
        };
        ::metrics::counter!(DEAD_LETTERS, "kind" => kind).increment(1);
    }
}

/// A process-manager message's outcome (see `ProcessMetrics`).
#[inline]
pub(crate) fn process_message(process: &'static str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(PROCESS_MESSAGES, "process" => process, "outcome" => outcome).increment(1);
}

/// A process-manager handler run lost to a concurrent write.
#[inline]
pub(crate) fn process_conflict(process: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(PROCESS_CONFLICTS, "process" => process).increment(1);
}

/// A process-manager message saved in another's write.
#[inline]
pub(crate) fn process_batched(process: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(PROCESS_BATCHED, "process" => process).increment(1);
}

/// A timeout was delivered to its process manager, `late` after it was
/// due (unknown for timeouts scheduled by older versions).
#[inline]
pub(crate) fn timeout_fired(process: &'static str, late: Option<std::time::Duration>) {
    #[cfg(feature = "metrics")]
    {
        ::metrics::counter!(PROCESS_TIMEOUTS_FIRED, "process" => process).increment(1);
        if let Some(late) = late {
            ::metrics::histogram!(PROCESS_TIMEOUT_LATENESS, "process" => process)
                .record(late.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (process, late);
}

/// Samples the queue gauges from `backend` (one round trip); does nothing
/// without the feature, or if the backend cannot tell.
pub(crate) async fn sample_queue(backend: &dyn Backend) {
    #[cfg(feature = "metrics")]
    match backend.queue_stats().await {
        Ok(Some(stats)) => {
            for (queue, backlog) in [("saga", stats.sagas), ("process", stats.processes)] {
                ::metrics::gauge!(QUEUE_DEPTH, "queue" => queue).set(backlog.depth as f64);
                let age = backlog.oldest.unwrap_or_default();
                ::metrics::gauge!(QUEUE_OLDEST_AGE, "queue" => queue).set(age.as_secs_f64());
            }
        }
        Ok(None) => {}
        Err(error) => tracing::debug!(%error, "sampling the queue for metrics failed"),
    }
}

/// Registers the `# HELP` text and unit of every metric above with the
/// installed recorder. [`install`] calls it; call it yourself after
/// installing another recorder.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(STEPS_STARTED, "Step attempts started, retries included.");
    describe_counter!(
        STEP_RETRIES,
        "Step attempts that were retries (a step's second and later attempts)."
    );
    describe_counter!(STEPS_SUCCEEDED, "Step attempts that succeeded.");
    describe_counter!(
        STEPS_FAILED,
        "Step attempts that failed, by kind of failure."
    );
    describe_histogram!(
        STEP_DURATION,
        Unit::Seconds,
        "How long each step attempt ran."
    );
    describe_counter!(
        COMPENSATIONS,
        "Compensation attempts started, retries included."
    );
    describe_counter!(COMPENSATION_FAILURES, "Compensation attempts that failed.");
    describe_counter!(TASKS_FINISHED, "Tasks that reached a terminal status.");
    describe_counter!(BREAKER_TRANSITIONS, "Circuit-breaker state changes.");
    describe_counter!(DEAD_LETTERS, "Messages parked on a dead-letter queue.");
    describe_counter!(PROCESS_MESSAGES, "Process-manager messages, by outcome.");
    describe_counter!(
        PROCESS_CONFLICTS,
        "Process-manager handler runs thrown away because another writer saved the instance first."
    );
    describe_counter!(
        PROCESS_BATCHED,
        "Process-manager messages saved in the write of another message of their instance."
    );
    describe_counter!(
        PROCESS_TIMEOUTS_FIRED,
        "Process-manager timeouts delivered to their process manager."
    );
    describe_histogram!(
        PROCESS_TIMEOUT_LATENESS,
        Unit::Seconds,
        "How long after it was due each process-manager timeout was handled."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        "Messages on the work queue not yet settled (deployment-wide; aggregate with max)."
    );
    describe_gauge!(
        QUEUE_OLDEST_AGE,
        Unit::Seconds,
        "Age of the oldest message on the work queue not yet settled (deployment-wide; aggregate with max)."
    );
}

/// A Prometheus recorder builder with this crate's histogram buckets
/// ([`STEP_DURATION_BUCKETS`]), for a recorder of your own (global labels,
/// idle timeouts, more buckets, ...): what [`install`] installs when left
/// as it is.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn prometheus_builder() -> metrics_exporter_prometheus::PrometheusBuilder {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(STEP_DURATION.to_owned()),
            STEP_DURATION_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(PROCESS_TIMEOUT_LATENESS.to_owned()),
                STEP_DURATION_BUCKETS,
            )
        })
        .expect("the buckets are not empty")
}

/// How often the recorder installed by [`install`] folds recorded
/// histogram samples into its buckets when nobody scrapes.
#[cfg(feature = "metrics")]
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(feature = "metrics")]
static INSTALLED: std::sync::Mutex<Option<PrometheusHandle>> = std::sync::Mutex::new(None);

/// Installs a Prometheus recorder ([`prometheus_builder`]) as the process's
/// global `metrics` recorder, registers the descriptions ([`describe`]) and
/// returns the handle that renders it (see [`route`]).
///
/// Idempotent: a second call returns the handle of the recorder the first
/// one installed. It fails with [`Error::MetricsRecorder`](crate::Error::MetricsRecorder)
/// if another global recorder was installed some other way (only one
/// recorder per process can be: hand that one's handle to [`route`]
/// instead, or render it yourself).
///
/// It also starts a thread that keeps the recorder's histograms drained
/// (what a scrape does too), so that memory stays bounded when nobody
/// scrapes.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn install() -> Result<PrometheusHandle, crate::Error> {
    let mut installed = INSTALLED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(handle) = installed.as_ref() {
        return Ok(handle.clone());
    }
    let handle = prometheus_builder()
        .install_recorder()
        .map_err(|e| crate::Error::MetricsRecorder(e.to_string()))?;
    describe();
    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("saga-metrics-upkeep".to_owned())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_EVERY);
            upkeep.run_upkeep();
        })
        .map_err(|e| crate::Error::MetricsRecorder(format!("starting its upkeep thread: {e}")))?;
    *installed = Some(handle.clone());
    Ok(handle)
}

/// The content type of the Prometheus text exposition format.
#[cfg(all(feature = "metrics", feature = "http"))]
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics`: what `handle` renders, in the Prometheus text format
/// (`text/plain; version=0.0.4`). A router of its own, to
/// [`merge`](axum::Router::merge) into your application (under your
/// authentication layers, or on an internal port).
#[cfg(all(feature = "metrics", feature = "http"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "metrics", feature = "http"))))]
pub fn route(handle: PrometheusHandle) -> axum::Router {
    use axum::http::header::CONTENT_TYPE;
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let handle = handle.clone();
            async move { ([(CONTENT_TYPE, TEXT_FORMAT)], handle.render()) }
        }),
    )
}
