//! Undoing a task: which step's compensation runs next (in reverse order:
//! the steps that completed, and, for a compensation that takes
//! `Outcome`, those whose attempt began and whose outcome was lost), what
//! its outcome does, and the terminal `CompensationFailed` when it still
//! fails after its retries.
//!
//! Compensations run at least once, not exactly once: one whose worker
//! dies before its outcome is written runs again, like a step.

use serde_json::json;

use super::{
    abandoned, after, failed, interrupted, retry, timed_out, Call, NextMove, Outcome, Phase, Plan,
    Transition,
};
use crate::error::StepErrorKind;
use crate::model::task::{
    AuditAction, AuditEntry, StepStatus, TaskInstance, TaskStatus, Timestamp,
};
use crate::policy::Backoff;
use crate::saga::SagaDefinition;

/// The next compensation to call (an attempt found begun and never
/// reported back counts as failed, and the compensation runs again), or
/// the end of compensating (the task's final status) when none is left.
pub(super) fn plan_compensation(
    task: &mut TaskInstance,
    def: &SagaDefinition,
    worker: &str,
) -> Plan {
    let Some(idx) = next_compensable(task, def) else {
        finish_or_compensate(task, def);
        return Plan::Commit(Transition::continue_or_stop(task));
    };
    let call = Call {
        phase: Phase::Compensation,
        idx,
    };
    let rec = &task.steps[idx];
    if rec.status == StepStatus::Compensating
        && rec.compensation_attempts > 0
        && rec.next_attempt_at.is_none()
    {
        abandoned(task, def, call, worker);
    }
    let rec = &task.steps[idx];
    if rec.compensation_attempts - rec.compensation_retry_base > call.policy(def).max_retries {
        let error = rec.compensation_error.clone().unwrap_or_default();
        compensation_failed(task, def, idx, error);
        return Plan::Commit(Transition::next(NextMove::Stop));
    }
    Plan::Call(call)
}

/// Applies the outcome of a compensation attempt: the step compensated
/// (and the next one planned, or the end), or a retry after its backoff,
/// or `CompensationFailed`.
pub(super) fn compensation_outcome(
    task: &mut TaskInstance,
    def: &SagaDefinition,
    call: Call,
    outcome: Outcome,
    worker: &str,
) -> Transition {
    let idx = call.idx;
    let method = call.method(def);
    let attempt = task.steps[idx].compensation_attempts;
    let (error, retryable) = match outcome {
        Outcome::Succeeded(_) => {
            let rec = &mut task.steps[idx];
            rec.status = StepStatus::Compensated;
            let mut entry = AuditEntry::new(AuditAction::StepCompensated)
                .step(def.steps[idx].name)
                .attempt(attempt)
                .worker(worker);
            if rec.output.is_none() {
                entry = entry.details(
                    "the step's outcome was unknown (an attempt's was lost): compensated \
                     from its input, by its key",
                );
            }
            task.audit(entry);
            if next_compensable(task, def).is_none() {
                finish_or_compensate(task, def);
            }
            return Transition::continue_or_stop(task);
        }
        Outcome::Interrupted { .. } => {
            task.audit(interrupted(method, attempt, worker));
            let rec = &mut task.steps[idx];
            rec.compensation_retry_base += 1;
            // Due now: a compensation with no next attempt due is one that
            // never reported back.
            rec.next_attempt_at = Some(Timestamp::now());
            return Transition::next(NextMove::Now);
        }
        Outcome::Failed { error, kind } => (error, kind == StepErrorKind::Transient),
        Outcome::TimedOut { after, .. } => (timed_out(after), true),
        Outcome::AlreadyClaimed => (
            format!(
                "attempt {attempt} of `{method}` was already claimed; counted as failed \
                 instead of running twice"
            ),
            true,
        ),
        // Compensation never sees the task's cancellation and has no
        // breaker; treat these defensively as failures.
        Outcome::Cancelled { error, .. }
        | Outcome::CircuitOpen(error)
        | Outcome::CircuitWait { error, .. } => (error, true),
        Outcome::LimitWait(waiting) => (waiting.to_string(), true),
    };
    task.steps[idx].compensation_error = Some(error.clone());
    let used = attempt - task.steps[idx].compensation_retry_base;
    let delay = if retryable {
        call.policy(def)
            .schedule(used.saturating_sub(1))
            .next_backoff()
    } else {
        None
    };
    task.audit(
        failed(
            Phase::Compensation,
            method,
            attempt,
            &error,
            delay,
            !retryable,
        )
        .worker(worker),
    );
    match delay {
        Some(delay) => {
            task.steps[idx].next_attempt_at = Some(after(delay));
            Transition::next(retry(delay))
        }
        None => {
            compensation_failed(task, def, idx, error);
            Transition::next(NextMove::Stop)
        }
    }
}

/// Moves to `Compensating` if a step has a compensation to run (see
/// [`next_compensable`]), else straight to the final status.
pub(super) fn finish_or_compensate(task: &mut TaskInstance, def: &SagaDefinition) {
    if next_compensable(task, def).is_some() {
        task.set_status(TaskStatus::Compensating);
    } else if task.cancelled_at.is_some() {
        task.set_status(TaskStatus::Cancelled);
    } else {
        task.set_status(TaskStatus::Compensated);
    }
}

/// The last step whose compensation is to run: one that completed, or
/// whose compensation is under way, or (for a compensation that takes
/// `Outcome`) one that did not complete after an attempt's outcome was
/// lost. A step known to have failed (every attempt's outcome recorded)
/// did nothing to undo.
pub(super) fn next_compensable(task: &TaskInstance, def: &SagaDefinition) -> Option<usize> {
    task.steps.iter().enumerate().rev().find_map(|(i, rec)| {
        let compensation = def.steps.get(i)?.compensation.as_ref()?;
        let due = matches!(rec.status, StepStatus::Completed | StepStatus::Compensating)
            || (compensation.handles_unknown && rec.undone_unknown());
        due.then_some(i)
    })
}

/// A compensation failed for good: the terminal `CompensationFailed`, with
/// everything an operator needs in the step record and the audit log.
pub(super) fn compensation_failed(
    task: &mut TaskInstance,
    def: &SagaDefinition,
    idx: usize,
    error: String,
) {
    let step_name = def.steps[idx].name;
    let trace_id = task.trace_id.clone();
    let rec = &mut task.steps[idx];
    rec.status = StepStatus::CompensationFailed;
    rec.next_attempt_at = None;
    rec.compensation_error = Some(error.clone());
    rec.trace_id = Some(trace_id.clone());
    let details = json!({
        "step": step_name,
        "error": error,
        "trace_id": trace_id,
        "attempt_count": rec.attempt_count,
        "compensation_attempts": rec.compensation_attempts,
    });
    let attempts = rec.compensation_attempts;
    tracing::error!(
        task_id = %task.id, saga = def.name, step = step_name, %trace_id, %error,
        "compensation FAILED; manual intervention required"
    );
    task.error = Some(format!(
        "compensation of step `{step_name}` failed: {error}"
    ));
    task.audit(
        AuditEntry::new(AuditAction::CompensationFailed)
            .step(step_name)
            .attempt(attempts)
            .error(&error)
            .trace(&trace_id)
            .details(details.to_string()),
    );
    task.set_status(TaskStatus::CompensationFailed);
}
