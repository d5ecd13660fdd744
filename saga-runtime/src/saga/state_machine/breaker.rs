//! What a step's circuit breaker does to a task, when it is declared
//! `when_open = wait`: a task that meets the open breaker is parked until
//! the break ends, and a failed half-open probe costs the task that made
//! it nothing.
//!
//! Parking exists so that an outage undoes nothing, however long it lasts.
//! A probe is a real call and its failure is recorded (an `AttemptFailed`
//! entry, the step's error), but it proves only that the dependency is
//! still down, which the breaker already knew: charging it to the prober
//! would make an outage of N breaks cost N attempts, and compensate the
//! tasks that happened to probe. Not even the first probe of an outage is
//! charged: a task whose last attempt was left when the breaker opened
//! would be compensated by it.
//!
//! What is charged is every call through a closed breaker, so a step that
//! fails for one task only (the others' successes keep the breaker closed)
//! spends its retries as usual. A task whose own failures alone hold the
//! breaker open, with no other traffic to close it, looks exactly like an
//! outage and waits like one; its failures count again once a call goes
//! through a closed breaker. So that such a task cannot keep the breaker
//! open for everyone by winning every probe, a failed prober waits out the
//! new break and the whole release window after it: every other task
//! parked in that break comes back first, and the next probe is theirs.

use std::time::Duration;

use super::{after, failed, on_outcome, Call, NextMove, Outcome, Phase, Transition};
use crate::circuit::{CircuitBreakerConfig, WhenOpen};
use crate::error::StepErrorKind;
use crate::model::task::{AuditAction, AuditEntry, StepStatus, TaskInstance};
use crate::saga::SagaDefinition;

/// The shortest a task parked by a breaker waits: a parked task that came
/// straight back would spin on the breaker.
const MIN_PARK: Duration = Duration::from_millis(100);

/// Applies the outcome of a call that was its breaker's half-open probe.
/// Under `when_open = wait` a transient failure (an error or a timeout)
/// parks the task again without spending its budget; anything else, or a
/// breaker that fails tasks, is an ordinary outcome.
pub(crate) fn on_probe_outcome(
    task: &mut TaskInstance,
    def: &SagaDefinition,
    call: Call,
    outcome: Outcome,
    worker: &str,
) -> Transition {
    let config = def.steps[call.idx]
        .circuit_breaker
        .filter(|c| call.phase == Phase::Step && c.when_open == WhenOpen::Wait);
    let Some(config) = config else {
        return on_outcome(task, def, call, outcome, worker);
    };
    let error = match &outcome {
        Outcome::Failed {
            error,
            kind: StepErrorKind::Transient,
        } => error.clone(),
        Outcome::TimedOut { after, dropped } => {
            task.steps[call.idx].lost_outcomes += u32::from(*dropped);
            super::timed_out(*after)
        }
        _ => return on_outcome(task, def, call, outcome, worker),
    };
    probe_failed(task, def, call.idx, config, error, worker)
}

/// A failed probe: recorded, not counted, and the task parked past the
/// break it began and the release window after it.
fn probe_failed(
    task: &mut TaskInstance,
    def: &SagaDefinition,
    idx: usize,
    config: CircuitBreakerConfig,
    error: String,
    worker: &str,
) -> Transition {
    let name = def.steps[idx].name;
    let window = config.duration / 2;
    let delay = (config.duration + window).max(MIN_PARK) + release_spread(task, Some(config));
    let rec = &mut task.steps[idx];
    let attempt = rec.attempt_count;
    rec.retry_base += 1;
    rec.status = StepStatus::Pending;
    rec.error = Some(error.clone());
    rec.next_attempt_at = Some(after(delay));
    task.audit(
        failed(Phase::Step, name, attempt, &error, Some(delay), false)
            .details(format!(
                "half-open probe failed: not counted against the retry budget; parked until \
                 the break ends, tried again in {}",
                humantime::format_duration(Duration::from_millis(delay.as_millis() as u64))
            ))
            .worker(worker),
    );
    Transition::wait(task, NextMove::After(delay))
}

/// A task that met the open breaker of a step that waits: parked until the
/// break ends (`retry_after`), no retry spent.
pub(super) fn parked(
    task: &mut TaskInstance,
    def: &SagaDefinition,
    idx: usize,
    error: String,
    retry_after: Duration,
) -> Transition {
    let name = def.steps[idx].name;
    let delay = retry_after.max(MIN_PARK) + release_spread(task, def.steps[idx].circuit_breaker);
    task.audit(
        AuditEntry::new(AuditAction::CircuitOpen)
            .step(name)
            .error(&error)
            .details(format!(
                "parked until the break ends: tried again in {}",
                humantime::format_duration(Duration::from_millis(delay.as_millis() as u64))
            )),
    );
    task.steps[idx].status = StepStatus::Pending;
    Transition::wait(task, NextMove::After(delay))
}

/// How much later than the end of the break a parked task comes back: a
/// share of half the break, fixed per task (pure: derived from its id), so
/// that tasks parked together return spread out instead of all at once on
/// a dependency that has only just recovered.
fn release_spread(task: &TaskInstance, breaker: Option<CircuitBreakerConfig>) -> Duration {
    let Some(config) = breaker else {
        return Duration::ZERO;
    };
    let window = config.duration / 2;
    let share = (task.id.0.as_u128() % 1000) as u32;
    window * share / 1000
}
