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
//! task ids or error texts; a saga name read from a stored record (a task
//! parked by a worker that does not run its saga) that no engine of this
//! process registered counts as `other`.
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
//! | `saga_tasks_started_total` | counter | `saga` | Tasks created by this process (an idempotent start that finds its task is not counted; a start in your PostgreSQL transaction counts when it is written into it, before your commit). |
//! | `saga_tasks_finished_total` | counter | `saga`, `status` | Each time a task reaches a terminal status: `completed`, `compensated`, `failed`, `cancelled`, `compensation_failed` or `dead_lettered` as the workers move it, `resolved` when an operator settles it ([`Engine::resolve`](crate::Engine::resolve)). A task an operator reopens (see the next row) counts again when it ends again: a retried compensation counts `compensation_failed`, then `compensated`. |
//! | `saga_tasks_reopened_total` | counter | `saga`, `action` | Finished tasks an operator sent back to work: `compensation_retried` ([`Engine::retry_compensation`](crate::Engine::retry_compensation)) or `requeued` (a dead letter requeued). Tasks in flight = started + reopened - finished. |
//! | `saga_tasks_awaiting_operator` | gauge | `saga`, `status` | Retained tasks that wait for an operator: `status` is `compensation_failed` or `dead_lettered` (what the console's overview shows). Deployment-wide, sampled like the queue gauges below. |
//! | `saga_circuit_breaker_transitions_total` | counter | `saga`, `step`, `to` | Circuit-breaker state changes, `to` is `open`, `half_open` (a probe let through after a break, or again after a probe that did not happen) or `closed`. For `scope = shared` breakers, counted by the engine whose call made the change. |
//! | `saga_dead_letters_total` | counter | `kind` | Messages parked on a dead-letter queue: `saga` (a task's message; `saga_tasks_finished_total{status="dead_lettered"}` has them by saga), `process` (a process manager's message), `endpoint` (a message an endpoint consumer gave up on) or `undecodable` (an entry that decodes as nothing). |
//! | `saga_process_messages_total` | counter | `process`, `outcome` | Process-manager messages by outcome: `handled`, `duplicate`, `ignored` (instance complete, stopped or gone), `held` (a continuing message that found no instance yet, held for it), `unmatched` (one that found none, once its hold ended), `failed` (each `#[on_error]` decision), `dead_lettered` or `fanned_out`. `process` is `unknown` for a message of a process manager this engine does not run. The same counts as [`Engine::process_metrics`](crate::Engine::process_metrics). |
//! | `saga_process_conflicts_total` | counter | `process` | Handler runs thrown away because another writer saved the instance first (each re-run counts). |
//! | `saga_process_batched_total` | counter | `process` | Messages saved in the write of another message of their instance (counted as `handled` too). |
//! | `saga_process_timeouts_fired_total` | counter | `process` | Timeouts delivered to their process manager (handled, or ignored because the instance ended). |
//! | `saga_process_timeout_lateness_seconds` | histogram | `process` | How long after it was due each timeout was handled (timer polling, queueing, a backlog). |
//! | `saga_limit_waits_total` | counter | `limit`, `cause` | Attempts (and process-manager messages) a flow-control limit held back: `cause` is `concurrency` (every slot taken) or `rate` (no token yet). A task counts again each time it comes back and still waits. |
//! | `saga_limit_wait_seconds` | histogram | `limit` | How long a step waited for its limit, from the first refusal to its start. |
//! | `saga_limit_in_use` / `saga_limit_capacity` | gauge | `limit` | Slots held (or reserved for a woken waiter) of each unkeyed concurrency limit, and how many there are: saturation is their ratio. Deployment-wide, sampled like the queue gauges below. Keyed limits are not sampled (one series per key would be unbounded): see [`Engine::limits`](crate::Engine::limits). |
//! | `saga_limit_slots_lost_total` | counter | `limit` | Slots that expired while their attempt still ran (its heartbeat came too late): the limit may be exceeded by one until the attempt ends. |
//! | `saga_endpoint_full_total` | counter | `endpoint` | Process-manager writes refused because an endpoint a consumer group reads holds its cap (`RedisConfig::endpoint_max_len`, `PostgresConfig::endpoint_max_len`; 100,000): its consumers are behind or gone. The message waits (handed back every second) rather than any being dropped. |
//! | `saga_transport_received_total` | counter | `transport` | Broker deliveries a bridge took into the store and acknowledged (`rabbitmq`, `nats`); the ones that were not messages are in `saga_dead_letters_total{kind="undecodable"}` too. |
//! | `saga_transport_relayed_total` | counter | `transport`, `outcome` | Endpoint messages a relay handed to a broker: `published` (confirmed), `failed` (a publish that was not confirmed: retried), `dead_lettered` (given up on after the delivery cap: unroutable or refused each time, on the endpoint's dead letters). |
//! | `saga_queue_depth` | gauge | `queue` | Messages on the work queue not yet settled (waiting, or taken and being worked on), `queue` being `saga` or `process`. Delayed messages (retry backoffs, timeouts) count once they are due. |
//! | `saga_queue_oldest_pending_age_seconds` | gauge | `queue` | How long the oldest of them has been on the queue (since it was enqueued or last handed back); 0 when there are none. |
//!
//! The queue gauges describe the whole deployment's queue, not this process:
//! every engine running workers samples them once per
//! [`housekeeping_interval`](crate::EngineBuilder::housekeeping_interval)
//! (default 30 s; the first time one interval after it starts) with one
//! backend round trip, so aggregate them with `max`, not `sum`. A backend that cannot tell (see
//! [`WorkQueue::queue_stats`](crate::backend::WorkQueue::queue_stats))
//! reports neither.
//!
//! `saga_tasks_awaiting_operator` is sampled on the same beat, for the
//! sagas this engine runs, with one more round trip (an index-only count
//! on PostgreSQL, index sizes on Redis).
//!
//! Recording costs a label vector and a lookup in the recorder per call
//! (label values are the definitions' `&'static str`s, never copied), a
//! handful of calls per step attempt; without the `metrics` feature every
//! call compiles to nothing.

// The implementation, chosen here once for the whole module: `recording.rs`
// records through the `metrics` facade; `noop.rs` has the same crate-internal
// functions with empty bodies. Callers write `crate::metrics::..` alike in
// both builds, and a build without the feature records nothing.
#[cfg(feature = "metrics")]
mod recording;
#[cfg(feature = "metrics")]
pub use recording::*;

#[cfg(not(feature = "metrics"))]
mod noop;
#[cfg(not(feature = "metrics"))]
pub(crate) use noop::*;

// What the callers hand over, in both builds.

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

impl From<crate::circuit::Transition> for BreakerState {
    fn from(change: crate::circuit::Transition) -> Self {
        match change {
            crate::circuit::Transition::Opened => BreakerState::Open,
            crate::circuit::Transition::HalfOpened => BreakerState::HalfOpen,
            crate::circuit::Transition::Closed => BreakerState::Closed,
        }
    }
}

// The metric names, buckets and label values: only a recorder reads them, so
// they exist with the feature only (without it they would be compiled and
// never read). Defined in this inline module so that one `cfg` covers them;
// their public paths are `saga_runtime::metrics::NAME` all the same.
#[cfg(feature = "metrics")]
pub use names::*;

#[cfg(feature = "metrics")]
mod names {
    use super::{BreakerState, DeadLetterKind};
    use crate::error::StepErrorKind;
    use crate::model::task::TaskStatus;
    use crate::saga::state_machine::Outcome;

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
    /// Tasks created (counter; `saga`).
    pub const TASKS_STARTED: &str = "saga_tasks_started_total";
    /// Finished tasks sent back to work by an operator (counter; `saga`, `action`).
    pub const TASKS_REOPENED: &str = "saga_tasks_reopened_total";
    /// Retained tasks waiting for an operator (gauge; `saga`, `status`).
    pub const TASKS_AWAITING_OPERATOR: &str = "saga_tasks_awaiting_operator";
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
    /// Attempts a limit made wait (counter; `limit`, `cause`).
    pub const LIMIT_WAITS: &str = "saga_limit_waits_total";
    /// How long attempts waited for a limit (histogram, seconds; `limit`).
    pub const LIMIT_WAIT: &str = "saga_limit_wait_seconds";
    /// Slots held of an unkeyed concurrency limit (gauge; `limit`).
    pub const LIMIT_IN_USE: &str = "saga_limit_in_use";
    /// Its capacity (gauge; `limit`).
    pub const LIMIT_CAPACITY: &str = "saga_limit_capacity";
    /// Slots that expired under a running attempt (counter; `limit`).
    pub const LIMIT_SLOTS_LOST: &str = "saga_limit_slots_lost_total";
    /// Process-manager writes an endpoint refused for being full (counter;
    /// `endpoint`).
    pub const ENDPOINT_FULL: &str = "saga_endpoint_full_total";
    /// Broker deliveries taken into the store (counter; `transport`).
    pub const TRANSPORT_RECEIVED: &str = "saga_transport_received_total";
    /// Endpoint messages published to a broker and confirmed (counter;
    /// `transport`, `outcome`: `published`, `failed`, `dead_lettered`).
    pub const TRANSPORT_RELAYED: &str = "saga_transport_relayed_total";

    /// The buckets of `saga_step_duration_seconds`, in seconds: from 5 ms to the
    /// default step timeout (5 minutes).
    pub const STEP_DURATION_BUCKETS: &[f64] = &[
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    ];

    impl DeadLetterKind {
        /// The `kind` label of `saga_dead_letters_total`.
        pub(in crate::metrics) fn label(self) -> &'static str {
            match self {
                DeadLetterKind::Saga => "saga",
                DeadLetterKind::Process => "process",
                DeadLetterKind::Endpoint => "endpoint",
                DeadLetterKind::Undecodable => "undecodable",
            }
        }
    }

    impl BreakerState {
        /// The `to` label of `saga_circuit_breaker_transitions_total`.
        pub(in crate::metrics) fn label(self) -> &'static str {
            match self {
                BreakerState::Open => "open",
                BreakerState::HalfOpen => "half_open",
                BreakerState::Closed => "closed",
            }
        }
    }

    /// The `status` label of a terminal status.
    pub(in crate::metrics) fn status_label(status: TaskStatus) -> &'static str {
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

    /// What an attempt's `outcome` counts as: `Ok` it succeeded, `Err(kind)`
    /// it failed (`kind` the label of `saga_steps_failed_total`), `None` it
    /// is not the attempt's own outcome and counts nowhere.
    pub(in crate::metrics) fn attempt_result(
        outcome: &Outcome,
    ) -> Option<Result<(), &'static str>> {
        match outcome {
            Outcome::Succeeded(_) => Some(Ok(())),
            Outcome::Failed { kind, .. } => Some(Err(match kind {
                StepErrorKind::Transient => "transient",
                StepErrorKind::Permanent => "permanent",
                StepErrorKind::InvalidPayload => "invalid_payload",
            })),
            Outcome::TimedOut { .. } => Some(Err("timeout")),
            Outcome::Cancelled { .. } => Some(Err("cancelled")),
            // Not the attempt's own outcome: it was stopped by a shutdown
            // (and is made again), or never ran.
            Outcome::Interrupted { .. }
            | Outcome::AlreadyClaimed
            | Outcome::CircuitOpen(_)
            | Outcome::CircuitWait { .. }
            | Outcome::LimitWait(_) => None,
        }
    }
}
