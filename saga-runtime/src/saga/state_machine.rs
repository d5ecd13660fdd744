//! What happens next to a task: the saga protocol as a pure function of the
//! task record and an event, with no I/O.
//!
//! A worker that holds a task's lease asks [`plan`] what the task needs now.
//! The answer is either a call (the next attempt of a step or of a
//! compensation) or a change to commit without calling anything (begin a
//! cancellation, give up on a step whose last attempt never reported back,
//! finish). After a call, [`on_outcome`] turns its result into the task's
//! next state and the [`Transition`] the commit must carry: the next message,
//! now or after a backoff delay, or none for a terminal status.
//!
//! A retry is a delayed message, not a sleep: no worker and no lease is
//! held while a backoff runs, and a crash between attempts loses nothing.
//! (An outcome whose next move is `Now` may be followed by the next attempt
//! under the same delivery: the worker's business, not this module's.)
//!
//! Everything here mutates the task in memory; the worker persists it.
//! Keeping the decisions in one place, free of Redis and tokio, is what lets
//! the tests below go through every transition exhaustively.

use std::time::Duration;

use serde_json::Value;

use crate::error::StepErrorKind;
use crate::model::task::{
    AuditAction, AuditEntry, StepStatus, TaskInstance, TaskStatus, Timestamp,
};
use crate::policy::{Backoff, OnExhausted, RetryPolicy};
use crate::saga::{completed_json, unknown_json, SagaDefinition};

/// Whether an attempt runs a step or its compensation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Step,
    Compensation,
}

/// The attempt a worker is to make: step (or compensation of step) `idx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Call {
    pub phase: Phase,
    pub idx: usize,
}

impl Call {
    /// The method called: the step's, or its compensation's.
    pub fn method(&self, def: &SagaDefinition) -> &'static str {
        let step = &def.steps[self.idx];
        match (self.phase, &step.compensation) {
            (Phase::Compensation, Some(c)) => c.name,
            _ => step.name,
        }
    }

    /// The retry policy that governs this attempt.
    pub fn policy(&self, def: &SagaDefinition) -> RetryPolicy {
        let step = &def.steps[self.idx];
        match (self.phase, &step.compensation) {
            (Phase::Compensation, Some(c)) => c.retry,
            _ => step.retry,
        }
    }

    /// The call's JSON input: the saga's input for step 1, the previous
    /// step's output for later steps, the step's own output for its
    /// compensation; for a compensation that takes [`Outcome`](crate::Outcome),
    /// that output as `Outcome::Completed`, or the step's input as
    /// `Outcome::Unknown` when the step has no output (what it did was
    /// lost).
    pub fn input(&self, def: &SagaDefinition, task: &TaskInstance) -> Value {
        let output = |i: usize| task.steps[i].output.clone().unwrap_or(Value::Null);
        let step_input = |i: usize| match i {
            0 => task.input.clone(),
            i => output(i - 1),
        };
        let i = self.idx;
        let handles_unknown = def.steps[i]
            .compensation
            .as_ref()
            .is_some_and(|c| c.handles_unknown);
        match (self.phase, handles_unknown, &task.steps[i].output) {
            (Phase::Step, ..) => step_input(i),
            (Phase::Compensation, false, _) => output(i),
            (Phase::Compensation, true, Some(out)) => completed_json(out.clone()),
            (Phase::Compensation, true, None) => unknown_json(step_input(i)),
        }
    }
}

/// What [`plan`] decided.
#[derive(Debug)]
pub(crate) enum Plan {
    /// Make this attempt: [`record_attempt`], persist, call, then
    /// [`on_outcome`].
    Call(Call),
    /// Commit the task as [`plan`] left it, with this transition.
    Commit(Transition),
    /// Nothing to do: the task has ended.
    Nothing,
}

/// When the task's next message is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NextMove {
    /// The task has ended: no message.
    Stop,
    /// At once.
    Now,
    /// After a backoff delay (durable: a scheduled message).
    After(Duration),
}

/// What the commit of a transition must carry besides the task.
#[derive(Debug)]
pub(crate) struct Transition {
    pub next: NextMove,
    /// Park the message on the dead-letter queue with this reason.
    pub dead_letter: Option<String>,
    /// Set when this transition ends the running phase (completed, failed,
    /// dead-lettered, compensating after a failure): the task as it was just
    /// before that decision. The commit is then refused if cancellation was
    /// requested meanwhile, and the worker applies [`begin_cancel`] to this
    /// copy instead, so an accepted cancellation is never overtaken. Also
    /// set, to the task as the transition leaves it, when a running task
    /// waits for a later message (a retry's backoff, an open breaker, a
    /// limit; see [`Transition::wait`]): a requested cancellation does not
    /// wait that out.
    pub guard: Option<Box<TaskInstance>>,
}

impl Transition {
    /// No message: the task has ended.
    pub fn stop() -> Self {
        Transition::next(NextMove::Stop)
    }

    fn next(next: NextMove) -> Self {
        Transition {
            next,
            dead_letter: None,
            guard: None,
        }
    }

    /// The transition of a task that waits for its next message. A running
    /// task whose cancellation was requested meanwhile must not wait out a
    /// backoff: the commit is guarded by the task as it now stands, so that
    /// the worker that holds it begins the cancellation from there at once
    /// (the wake-up the request enqueued would too, but only once handed
    /// back and delivered again, after the lease is free). A task already
    /// cancelled or compensating waits: its compensation's retry policy
    /// governs.
    pub(crate) fn wait(task: &TaskInstance, next: NextMove) -> Self {
        let running = task.cancelled_at.is_none()
            && matches!(task.status, TaskStatus::Pending | TaskStatus::Running);
        Transition {
            guard: (running && matches!(next, NextMove::After(_))).then(|| Box::new(task.clone())),
            ..Transition::next(next)
        }
    }

    /// The transition for the task's status as it now stands.
    fn continue_or_stop(task: &TaskInstance) -> Self {
        Transition::next(if task.status.is_terminal() {
            NextMove::Stop
        } else {
            NextMove::Now
        })
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// It returned `Ok` (the JSON of its output; `null` for a compensation).
    Succeeded(Value),
    /// It returned an error.
    Failed { error: String, kind: StepErrorKind },
    /// It ran past its timeout and was cancelled; a transient failure.
    /// `dropped`: it did not return within the stop grace and was
    /// dropped, so what it did is not known (a lost outcome).
    TimedOut { after: Duration, dropped: bool },
    /// The task's cancellation stopped it (steps only); `dropped` as for
    /// a timeout.
    Cancelled {
        at: Timestamp,
        error: String,
        dropped: bool,
    },
    /// The circuit breaker refused the call; no attempt was made (steps only).
    CircuitOpen(String),
    /// The same for a breaker declared `when_open = wait`: the task is
    /// parked until the break ends (`retry_after`), no retry spent.
    CircuitWait {
        error: String,
        retry_after: Duration,
    },
    /// A flow-control limit (`#[limit]`) has no slot or token now: no
    /// attempt was made; the task is parked until `retry_after` (or woken
    /// sooner when a slot frees), no retry spent (steps only).
    LimitWait(limit::Waiting),
    /// The attempt's claim was already taken: this attempt number ran (or
    /// began) elsewhere, so it was not run again.
    AlreadyClaimed,
    /// Its worker shut down gracefully and the attempt outlived the grace
    /// period: stopped by the engine, not failed. It is made again at once
    /// and does not count against the retry budget (a redeploy must not
    /// fail a step that allows no retries). `dropped` as for a timeout.
    Interrupted { dropped: bool },
}

/// The attempt just recorded by [`record_attempt`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// 1-based, counting across crashes and requeues.
    pub number: u32,
    /// The attempt's claim, unique within the task: `{method}:{number}`.
    pub claim: String,
}

/// The reason a poisoned message is dead-lettered with.
pub(crate) fn poison_reason(deliveries: u32) -> String {
    format!(
        "delivered {deliveries} times without completing (each delivery's worker stopped \
         before settling it: a crash, an abort, or running out of memory)"
    )
}

/// Decides what the task needs now. `cancel` is the cancellation flag as
/// read with the lease taken.
pub(crate) fn plan(
    task: &mut TaskInstance,
    def: &SagaDefinition,
    cancel: Option<Timestamp>,
    worker: &str,
) -> Plan {
    if task.status.is_terminal() {
        return Plan::Nothing;
    }
    if let Some(at) = cancel {
        if task.cancelled_at.is_none()
            && matches!(task.status, TaskStatus::Pending | TaskStatus::Running)
        {
            begin_cancel(task, def, at);
            return Plan::Commit(Transition::continue_or_stop(task));
        }
    }
    match task.status {
        TaskStatus::Pending | TaskStatus::Running => plan_step(task, def, worker),
        TaskStatus::Compensating => plan_compensation(task, def, worker),
        _ => Plan::Nothing,
    }
}

fn plan_step(task: &mut TaskInstance, def: &SagaDefinition, worker: &str) -> Plan {
    let Some(idx) = task
        .steps
        .iter()
        .position(|s| s.status != StepStatus::Completed)
    else {
        // Every step is recorded complete but the task is not: not a state
        // the worker writes, but finishing is the only sensible reading.
        // Completing ends the running phase, so the commit is guarded like
        // the last step's own.
        let before = Box::new(task.clone());
        task.output = task.steps.last().and_then(|s| s.output.clone());
        task.set_status(TaskStatus::Completed);
        return Plan::Commit(Transition {
            next: NextMove::Stop,
            dead_letter: None,
            guard: Some(before),
        });
    };
    let call = Call {
        phase: Phase::Step,
        idx,
    };
    let rec = &mut task.steps[idx];
    if rec.status == StepStatus::Running {
        abandoned(task, def, call, worker);
    }
    let rec = &task.steps[idx];
    let used = rec.attempt_count - rec.retry_base;
    if used > call.policy(def).max_retries {
        let error = rec.error.clone().unwrap_or_default();
        return Plan::Commit(exhausted(task, def, idx, error, false));
    }
    Plan::Call(call)
}

/// The last attempt began (it was recorded) but never reported back: its
/// worker died, hung past its lease, or lost the lease. It counts as a
/// failed attempt.
fn abandoned(task: &mut TaskInstance, def: &SagaDefinition, call: Call, worker: &str) {
    let method = call.method(def);
    let rec = &mut task.steps[call.idx];
    let attempt = match call.phase {
        Phase::Step => rec.attempt_count,
        Phase::Compensation => rec.compensation_attempts,
    };
    let error =
        format!("attempt {attempt} did not report back (its worker stopped or lost its lease)");
    match call.phase {
        Phase::Step => {
            rec.status = StepStatus::Pending;
            rec.error = Some(error.clone());
            rec.lost_outcomes += 1;
        }
        Phase::Compensation => rec.compensation_error = Some(error.clone()),
    }
    task.audit(
        AuditEntry::new(AuditAction::AttemptAbandoned)
            .step(method)
            .attempt(attempt)
            .error(error)
            .worker(worker),
    );
}

/// The audit entry of an attempt its worker's shutdown interrupted.
fn interrupted(method: &str, attempt: u32, worker: &str) -> AuditEntry {
    AuditEntry::new(AuditAction::AttemptAbandoned)
        .step(method)
        .attempt(attempt)
        .error(format!(
            "attempt {attempt} was interrupted by its worker's shutdown; made again, \
             not counted against the retry budget"
        ))
        .worker(worker)
}

/// Marks the attempt as begun, before the call: the attempt count is
/// persisted first, so a crash during the call does not reset it.
pub(crate) fn record_attempt(task: &mut TaskInstance, def: &SagaDefinition, call: Call) -> Attempt {
    let method = call.method(def);
    let rec = &mut task.steps[call.idx];
    rec.next_attempt_at = None;
    rec.limit_wait = None;
    let number = match call.phase {
        Phase::Step => {
            rec.attempt_count += 1;
            rec.status = StepStatus::Running;
            rec.started_at.get_or_insert_with(Timestamp::now);
            rec.attempt_count
        }
        Phase::Compensation => {
            rec.compensation_attempts += 1;
            rec.status = StepStatus::Compensating;
            rec.compensation_attempts
        }
    };
    if call.phase == Phase::Step && task.status == TaskStatus::Pending {
        task.set_status(TaskStatus::Running);
    }
    Attempt {
        number,
        claim: format!("{method}:{number}"),
    }
}

/// Applies the outcome of an attempt (or of a refused call) to the task.
pub(crate) fn on_outcome(
    task: &mut TaskInstance,
    def: &SagaDefinition,
    call: Call,
    outcome: Outcome,
    worker: &str,
) -> Transition {
    match call.phase {
        Phase::Step => step_outcome(task, def, call, outcome, worker),
        Phase::Compensation => compensation_outcome(task, def, call, outcome, worker),
    }
}

fn step_outcome(
    task: &mut TaskInstance,
    def: &SagaDefinition,
    call: Call,
    outcome: Outcome,
    worker: &str,
) -> Transition {
    let idx = call.idx;
    let name = def.steps[idx].name;
    let attempt = task.steps[idx].attempt_count;
    let (error, kind) = match outcome {
        Outcome::Succeeded(output) => {
            let rec = &mut task.steps[idx];
            rec.status = StepStatus::Completed;
            rec.completed_at = Some(Timestamp::now());
            rec.output = Some(output.clone());
            task.audit(
                AuditEntry::new(AuditAction::StepCompleted)
                    .step(name)
                    .attempt(attempt)
                    .worker(worker),
            );
            if idx + 1 < task.steps.len() {
                task.set_status(TaskStatus::Running);
                return Transition::next(NextMove::Now);
            }
            let before = Box::new(task.clone());
            task.output = Some(output);
            task.set_status(TaskStatus::Completed);
            return Transition {
                next: NextMove::Stop,
                dead_letter: None,
                guard: Some(before),
            };
        }
        Outcome::Cancelled { at, error, dropped } => {
            let error = format!("cancelled: {error}");
            let rec = &mut task.steps[idx];
            rec.lost_outcomes += u32::from(dropped);
            rec.status = StepStatus::Failed;
            rec.error = Some(error.clone());
            task.audit(failed(Phase::Step, name, attempt, &error, None, true).worker(worker));
            begin_cancel(task, def, at);
            return Transition::continue_or_stop(task);
        }
        Outcome::CircuitOpen(error) => {
            task.audit(
                AuditEntry::new(AuditAction::CircuitOpen)
                    .step(name)
                    .error(&error),
            );
            return exhausted(task, def, idx, error, false);
        }
        Outcome::CircuitWait { error, retry_after } => {
            return breaker::parked(task, def, idx, error, retry_after);
        }
        Outcome::LimitWait(waiting) => return limit::parked(task, def, idx, waiting),
        Outcome::AlreadyClaimed => {
            // Someone else began this attempt number (a duplicate delivery,
            // a worker whose lease expired, a store restored from an older
            // copy). Never run one attempt twice: skip to the next number
            // without spending the retry budget (the skipped attempt did
            // not fail here).
            task.audit(
                AuditEntry::new(AuditAction::DuplicateAttempt)
                    .step(name)
                    .attempt(attempt),
            );
            let rec = &mut task.steps[idx];
            rec.retry_base += 1;
            rec.status = StepStatus::Pending;
            return Transition::next(NextMove::Now);
        }
        Outcome::Interrupted { dropped } => {
            task.audit(interrupted(name, attempt, worker));
            let rec = &mut task.steps[idx];
            rec.retry_base += 1;
            rec.lost_outcomes += u32::from(dropped);
            rec.status = StepStatus::Pending;
            return Transition::next(NextMove::Now);
        }
        Outcome::Failed { error, kind } => (error, kind),
        Outcome::TimedOut { after, dropped } => {
            task.steps[idx].lost_outcomes += u32::from(dropped);
            (timed_out(after), StepErrorKind::Transient)
        }
    };
    task.steps[idx].error = Some(error.clone());
    match kind {
        StepErrorKind::InvalidPayload => exhausted(task, def, idx, error, true),
        StepErrorKind::Permanent => {
            task.audit(failed(Phase::Step, name, attempt, &error, None, true).worker(worker));
            exhausted(task, def, idx, error, false)
        }
        StepErrorKind::Transient => {
            let rec = &task.steps[idx];
            let used = rec.attempt_count - rec.retry_base;
            let delay = call
                .policy(def)
                .schedule(used.saturating_sub(1))
                .next_backoff();
            task.audit(failed(Phase::Step, name, attempt, &error, delay, false).worker(worker));
            match delay {
                Some(delay) => {
                    let rec = &mut task.steps[idx];
                    rec.status = StepStatus::Pending;
                    rec.next_attempt_at = Some(after(delay));
                    Transition::wait(task, retry(delay))
                }
                None => exhausted(task, def, idx, error, false),
            }
        }
    }
}

/// A poison message: its deliveries kept killing their workers. The task is
/// parked on the dead-letter queue; an operator requeues it once fixed.
pub(crate) fn poisoned(
    task: &mut TaskInstance,
    def: &SagaDefinition,
    deliveries: u32,
) -> Transition {
    let reason = poison_reason(deliveries);
    // Parking a task that is still running its steps ends the running
    // phase: guarded, so an accepted cancellation is not overtaken.
    let before = matches!(task.status, TaskStatus::Pending | TaskStatus::Running)
        .then(|| Box::new(task.clone()));
    let step = task
        .steps
        .iter()
        .position(|s| matches!(s.status, StepStatus::Running | StepStatus::Compensating));
    let mut entry = AuditEntry::new(AuditAction::DeadLettered).error(&reason);
    if let Some(idx) = step {
        let rec = &mut task.steps[idx];
        if rec.status == StepStatus::Running {
            // Its worker died in it, as every delivery's did.
            rec.lost_outcomes += 1;
            rec.status = StepStatus::Failed;
            rec.error = Some(reason.clone());
        }
        entry = entry.step(def.steps[idx].name);
    }
    task.error = Some(format!("saga `{}`: {reason}", def.name));
    task.audit(entry);
    task.set_status(TaskStatus::DeadLettered);
    Transition {
        next: NextMove::Stop,
        dead_letter: Some(format!("saga `{}` task {}: {reason}", def.name, task.id)),
        guard: before,
    }
}

/// Parks a task whose saga no worker runs: `DeadLettered` with the reason,
/// without the saga's definition (the worker does not have it).
pub(crate) fn park(task: &mut TaskInstance, reason: &str) {
    task.error = Some(reason.to_owned());
    task.audit(AuditEntry::new(AuditAction::DeadLettered).error(reason));
    task.set_status(TaskStatus::DeadLettered);
}

/// Records a cancellation and moves to compensating the completed steps
/// and those whose outcome was lost (or straight to `Cancelled` when there
/// is nothing to undo).
pub(crate) fn begin_cancel(task: &mut TaskInstance, def: &SagaDefinition, at: Timestamp) {
    task.cancelled_at = Some(at);
    for rec in &mut task.steps {
        // An attempt recorded as running when the cancellation is applied
        // (under the lease) is one whose worker is gone: its outcome was
        // lost.
        rec.lost_outcomes += u32::from(rec.status == StepStatus::Running);
        // A step waiting for its retry (or whose attempt never reported
        // back) will not run again.
        if matches!(rec.status, StepStatus::Running)
            || (rec.status == StepStatus::Pending && rec.attempt_count > rec.retry_base)
        {
            rec.status = StepStatus::Failed;
            rec.next_attempt_at = None;
            rec.error
                .get_or_insert_with(|| "cancelled before the step completed".to_owned());
        }
    }
    let trace = task.trace_id.clone();
    task.audit(AuditEntry::new(AuditAction::CancellationRequested).trace(&trace));
    finish_or_compensate(task, def);
}

/// The step used up its retries (or failed permanently): its
/// `on_exhausted` action decides.
fn exhausted(
    task: &mut TaskInstance,
    def: &SagaDefinition,
    idx: usize,
    error: String,
    invalid_payload: bool,
) -> Transition {
    let name = def.steps[idx].name;
    let trace_id = task.trace_id.clone();
    let rec = &mut task.steps[idx];
    rec.status = StepStatus::Failed;
    rec.next_attempt_at = None;
    rec.error = Some(error.clone());
    rec.trace_id = Some(trace_id);
    task.error = Some(format!("step `{name}` failed: {error}"));
    let action = if invalid_payload {
        OnExhausted::DeadLetter
    } else {
        def.steps[idx].retry.on_exhausted
    };
    let before = Some(Box::new(task.clone()));
    let mut dead_letter = None;
    match action {
        OnExhausted::Compensate => finish_or_compensate(task, def),
        OnExhausted::Fail => task.set_status(TaskStatus::Failed),
        OnExhausted::DeadLetter => {
            let reason = format!("saga `{}` step `{name}`: {error}", def.name);
            task.audit(
                AuditEntry::new(AuditAction::DeadLettered)
                    .step(name)
                    .error(&reason),
            );
            task.set_status(TaskStatus::DeadLettered);
            dead_letter = Some(reason);
        }
    }
    Transition {
        dead_letter,
        guard: before,
        ..Transition::continue_or_stop(task)
    }
}

fn timed_out(after: Duration) -> String {
    format!(
        "attempt timed out after {} and was cancelled",
        humantime::format_duration(after)
    )
}

fn retry(delay: Duration) -> NextMove {
    if delay.is_zero() {
        NextMove::Now
    } else {
        NextMove::After(delay)
    }
}

fn after(delay: Duration) -> Timestamp {
    let now = Timestamp::now();
    Timestamp(
        now.0
            .saturating_add(delay.as_millis().min(u64::MAX as u128) as u64),
    )
}

fn failed(
    phase: Phase,
    step: &str,
    attempt: u32,
    error: &str,
    retry_in: Option<Duration>,
    permanent: bool,
) -> AuditEntry {
    let retry_in_ms = retry_in.map(|d| d.as_millis() as u64);
    let action = match phase {
        Phase::Step => AuditAction::AttemptFailed {
            retry_in_ms,
            permanent,
        },
        Phase::Compensation => AuditAction::CompensationAttemptFailed { retry_in_ms },
    };
    AuditEntry::new(action)
        .step(step)
        .attempt(attempt)
        .error(error)
}

mod attempt;
pub(crate) use attempt::{forgive_crash, start_attempt};
mod breaker;
pub(crate) use breaker::on_probe_outcome;
mod compensation;
use compensation::{compensation_outcome, finish_or_compensate, plan_compensation};
mod limit;
pub(crate) use limit::{waiting_since, Waiting};

#[cfg(test)]
#[path = "state_machine/tests.rs"]
mod tests;
