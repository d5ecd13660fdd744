//! Recording through the `metrics` facade (feature `metrics`): to whatever
//! global recorder is installed, [`install`]'s Prometheus one or another.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use ::metrics::{counter, gauge, histogram};
pub use metrics_exporter_prometheus::PrometheusHandle;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use super::{
    attempt_result, status_label, BreakerState, DeadLetterKind, BREAKER_TRANSITIONS, COMPENSATIONS,
    COMPENSATION_FAILURES, DEAD_LETTERS, PROCESS_BATCHED, PROCESS_CONFLICTS, PROCESS_MESSAGES,
    PROCESS_TIMEOUTS_FIRED, PROCESS_TIMEOUT_LATENESS, QUEUE_DEPTH, QUEUE_OLDEST_AGE, STEPS_FAILED,
    STEPS_STARTED, STEPS_SUCCEEDED, STEP_DURATION, STEP_DURATION_BUCKETS, STEP_RETRIES,
    TASKS_AWAITING_OPERATOR, TASKS_FINISHED, TASKS_REOPENED, TASKS_STARTED,
};
use super::{ENDPOINT_FULL, TRANSPORT_RECEIVED, TRANSPORT_RELAYED};
use super::{LIMIT_CAPACITY, LIMIT_IN_USE, LIMIT_SLOTS_LOST, LIMIT_WAIT, LIMIT_WAITS};
use crate::backend::Backend;
use crate::backend::LimitCause;
use crate::model::task::TaskStatus;
use crate::saga::state_machine::{Outcome, Phase};
use crate::util::{Unpoisoned, UnpoisonedRw};

/// When a step attempt began, for `saga_step_duration_seconds`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch(Instant);

/// A step (or compensation) attempt begins; `retry` when it is not the
/// step's first attempt in its retry budget.
#[inline]
pub(crate) fn attempt_started(
    saga: &'static str,
    step: &'static str,
    phase: Phase,
    retry: bool,
) -> Stopwatch {
    match phase {
        Phase::Step => {
            counter!(STEPS_STARTED, "saga" => saga, "step" => step).increment(1);
            if retry {
                counter!(STEP_RETRIES, "saga" => saga, "step" => step).increment(1);
            }
        }
        Phase::Compensation => {
            counter!(COMPENSATIONS, "saga" => saga, "step" => step).increment(1);
        }
    }
    Stopwatch(Instant::now())
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
    let Some(result) = attempt_result(outcome) else {
        return;
    };
    match (phase, result) {
        (Phase::Step, Ok(())) => {
            counter!(STEPS_SUCCEEDED, "saga" => saga, "step" => step).increment(1);
        }
        (Phase::Step, Err(kind)) => {
            counter!(STEPS_FAILED, "saga" => saga, "step" => step, "kind" => kind).increment(1);
        }
        (Phase::Compensation, Ok(())) => {}
        (Phase::Compensation, Err(_)) => {
            counter!(COMPENSATION_FAILURES, "saga" => saga, "step" => step).increment(1);
        }
    }
    if phase == Phase::Step {
        histogram!(STEP_DURATION, "saga" => saga, "step" => step).record(since.0.elapsed());
    }
}

/// A task of `saga` was created (not an idempotent start that found it).
#[inline]
pub(crate) fn task_started(saga: &'static str) {
    counter!(TASKS_STARTED, "saga" => saga).increment(1);
}

/// An operator sent a finished task of `saga` back to work (`action`:
/// `compensation_retried`, `requeued`): it will count in
/// `saga_tasks_finished_total` again when it ends again.
#[inline]
pub(crate) fn task_reopened(saga: &'static str, action: &'static str) {
    counter!(TASKS_REOPENED, "saga" => saga, "action" => action).increment(1);
}

/// A task of `saga` was committed with terminal `status`.
#[inline]
pub(crate) fn task_finished(saga: &'static str, status: TaskStatus) {
    counter!(TASKS_FINISHED, "saga" => saga, "status" => status_label(status)).increment(1);
}

/// The saga names registered with an engine of this process: the only
/// `saga` label values a name read from a record may become.
static SAGAS: std::sync::RwLock<std::collections::BTreeSet<&'static str>> =
    std::sync::RwLock::new(std::collections::BTreeSet::new());

/// The label value a record's saga name may become.
pub(crate) const OTHER_SAGA: &str = "other";

/// Remembers the saga names an engine registered (every engine of the
/// process shares the global recorder, so they share the names).
pub(crate) fn register_sagas(names: impl IntoIterator<Item = &'static str>) {
    let mut sagas = SAGAS.write_locked();
    sagas.extend(names);
}

/// `saga` as a label value: the registered name, else [`OTHER_SAGA`]. A
/// record's saga name is whatever was written into the store, and each
/// new label value is a new time series in every scraper, kept for good.
fn saga_label(saga: &str) -> &'static str {
    let sagas = SAGAS.read_locked();
    sagas.get(saga).copied().unwrap_or(OTHER_SAGA)
}

/// A task was parked `DeadLettered` by a worker that may not run its saga
/// (the name comes from the task, so only a registered one is a label).
pub(crate) fn task_parked(saga: &str) {
    counter!(
        TASKS_FINISHED,
        "saga" => saga_label(saga),
        "status" => status_label(TaskStatus::DeadLettered)
    )
    .increment(1);
}

/// A circuit breaker of a saga step changed state.
#[inline]
pub(crate) fn breaker_transition(saga: &'static str, step: &'static str, to: BreakerState) {
    counter!(BREAKER_TRANSITIONS, "saga" => saga, "step" => step, "to" => to.label()).increment(1);
}

/// A message was parked on a dead-letter queue.
#[inline]
pub(crate) fn dead_lettered(kind: DeadLetterKind) {
    counter!(DEAD_LETTERS, "kind" => kind.label()).increment(1);
}

/// A write an endpoint refused for being full (endpoint names come from
/// the definitions: bounded).
#[inline]
pub(crate) fn endpoint_full(endpoint: &str) {
    counter!(ENDPOINT_FULL, "endpoint" => endpoint.to_owned()).increment(1);
}

/// Broker deliveries taken into the store (the transport's name is the
/// engine's, a handful per deployment).
#[inline]
pub(crate) fn bridged(transport: &str, n: usize) {
    counter!(TRANSPORT_RECEIVED, "transport" => transport.to_owned()).increment(n as u64);
}

/// An endpoint message handed to a broker, and how that went.
#[inline]
pub(crate) fn relayed(transport: &str, outcome: &'static str) {
    counter!(TRANSPORT_RELAYED, "transport" => transport.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// A process-manager message's outcome (see `ProcessMetrics`).
#[inline]
pub(crate) fn process_message(process: &'static str, outcome: &'static str) {
    counter!(PROCESS_MESSAGES, "process" => process, "outcome" => outcome).increment(1);
}

/// A process-manager handler run lost to a concurrent write.
#[inline]
pub(crate) fn process_conflict(process: &'static str) {
    counter!(PROCESS_CONFLICTS, "process" => process).increment(1);
}

/// A process-manager message saved in another's write.
#[inline]
pub(crate) fn process_batched(process: &'static str) {
    counter!(PROCESS_BATCHED, "process" => process).increment(1);
}

/// A timeout was delivered to its process manager, `late` after it was
/// due (unknown for timeouts scheduled by older versions).
#[inline]
pub(crate) fn timeout_fired(process: &'static str, late: Option<Duration>) {
    counter!(PROCESS_TIMEOUTS_FIRED, "process" => process).increment(1);
    if let Some(late) = late {
        histogram!(PROCESS_TIMEOUT_LATENESS, "process" => process).record(late.as_secs_f64());
    }
}

/// A limit made an attempt wait.
#[inline]
pub(crate) fn limit_waited(limit: &'static str, cause: LimitCause) {
    let cause = match cause {
        LimitCause::Concurrency => "concurrency",
        LimitCause::Rate => "rate",
    };
    counter!(LIMIT_WAITS, "limit" => limit, "cause" => cause).increment(1);
}

/// An attempt that waited for `limit` starts, `waited` after its wait
/// began.
#[inline]
pub(crate) fn limit_wait_ended(limit: &'static str, waited: Duration) {
    histogram!(LIMIT_WAIT, "limit" => limit).record(waited.as_secs_f64());
}

/// A running attempt's slot expired before it was renewed.
#[inline]
pub(crate) fn limit_slot_lost(limit: &'static str) {
    counter!(LIMIT_SLOTS_LOST, "limit" => limit).increment(1);
}

/// An unkeyed concurrency limit's use, as sampled.
#[inline]
pub(crate) fn limit_in_use(limit: &'static str, in_use: u32, capacity: u32) {
    gauge!(LIMIT_IN_USE, "limit" => limit).set(f64::from(in_use));
    gauge!(LIMIT_CAPACITY, "limit" => limit).set(f64::from(capacity));
}

/// Samples the queue gauges from `backend` (one round trip); does nothing
/// if the backend cannot tell.
pub(crate) async fn sample_queue(backend: &dyn Backend) {
    match backend.queue_stats().await {
        Ok(Some(stats)) => {
            for (queue, backlog) in [("saga", stats.sagas), ("process", stats.processes)] {
                gauge!(QUEUE_DEPTH, "queue" => queue).set(backlog.depth as f64);
                let age = backlog.oldest.unwrap_or_default();
                gauge!(QUEUE_OLDEST_AGE, "queue" => queue).set(age.as_secs_f64());
            }
        }
        Ok(None) => {}
        Err(error) => tracing::debug!(%error, "sampling the queue for metrics failed"),
    }
}

/// Samples how many tasks of each of `sagas` wait for an operator
/// (`CompensationFailed`, `DeadLettered`) from `backend`: one round trip
/// on Redis and PostgreSQL. Every saga gets a value, 0 included, so that a
/// resolved backlog shows as 0 rather than as the last value seen.
pub(crate) async fn sample_tasks(backend: &dyn Backend, sagas: &[&'static str]) {
    const WAITING: [TaskStatus; 2] = [TaskStatus::CompensationFailed, TaskStatus::DeadLettered];
    match backend.count_in_statuses(sagas, &WAITING).await {
        Ok(counts) => {
            for saga in sagas {
                for status in WAITING {
                    let n = counts
                        .iter()
                        .find(|(s, st, _)| s == saga && *st == status)
                        .map_or(0, |(_, _, n)| *n);
                    gauge!(TASKS_AWAITING_OPERATOR, "saga" => *saga, "status" => status_label(status))
                        .set(n as f64);
                }
            }
        }
        Err(error) => tracing::debug!(%error, "sampling the tasks for metrics failed"),
    }
}

/// Registers the `# HELP` text and unit of every metric above with the
/// installed recorder. [`install`] calls it; call it yourself after
/// installing another recorder.
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
    describe_counter!(TASKS_STARTED, "Tasks created.");
    describe_counter!(
        TASKS_FINISHED,
        "Tasks that reached a terminal status (a reopened task counts again when it ends again)."
    );
    describe_counter!(
        TASKS_REOPENED,
        "Finished tasks an operator sent back to work (compensation retried, dead letter requeued)."
    );
    describe_gauge!(
        TASKS_AWAITING_OPERATOR,
        "Retained tasks that wait for an operator, by status (deployment-wide; aggregate with max)."
    );
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
    describe_counter!(
        LIMIT_WAITS,
        "Attempts a flow-control limit held back, by cause."
    );
    describe_histogram!(
        LIMIT_WAIT,
        Unit::Seconds,
        "How long steps waited for a flow-control limit before they started."
    );
    describe_gauge!(
        LIMIT_IN_USE,
        "Slots held of each unkeyed concurrency limit (deployment-wide; aggregate with max)."
    );
    describe_gauge!(LIMIT_CAPACITY, "Slots of each unkeyed concurrency limit.");
    describe_counter!(
        LIMIT_SLOTS_LOST,
        "Limit slots that expired while their attempt still ran."
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
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
// The exporter refuses only an empty bucket list; ours is a constant
// that is not.
#[allow(clippy::expect_used)]
pub fn prometheus_builder() -> PrometheusBuilder {
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
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(LIMIT_WAIT.to_owned()), STEP_DURATION_BUCKETS)
        })
        .expect("the buckets are not empty")
}

/// How often the recorder installed by [`install`] folds recorded
/// histogram samples into its buckets when nobody scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The handle of the recorder [`install`] installed, so that a second call
/// hands it back instead of failing.
static INSTALLED: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

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
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn install() -> Result<PrometheusHandle, crate::Error> {
    let mut installed = INSTALLED.locked();
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

/// `GET /metrics`: what `handle` renders, in the Prometheus text format
/// (`text/plain; version=0.0.4`). A router of its own, to
/// [`merge`](axum::Router::merge) into your application (under your
/// authentication layers, or on an internal port).
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(all(feature = "metrics", feature = "http"))))]
pub fn route(handle: PrometheusHandle) -> axum::Router {
    use axum::http::header::CONTENT_TYPE;
    /// The content type of the Prometheus text exposition format.
    const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let handle = handle.clone();
            async move { ([(CONTENT_TYPE, TEXT_FORMAT)], handle.render()) }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record written straight into the store names whatever saga it
    /// likes: only a registered name becomes a `saga` label value.
    #[test]
    fn a_records_saga_name_becomes_a_label_only_if_registered() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        register_sagas(["labels-registered"]);
        ::metrics::with_local_recorder(&recorder, || {
            task_parked("labels-registered");
            task_parked("forged-4111-1111");
            task_parked("forged-another");
        });
        let text = handle.render();
        assert!(!text.contains("forged"), "{text}");
        assert!(
            text.contains(
                r#"saga_tasks_finished_total{saga="labels-registered",status="dead_lettered"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"saga_tasks_finished_total{saga="other",status="dead_lettered"} 2"#),
            "{text}"
        );
    }
}
