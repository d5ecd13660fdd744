//! An attempt's start, and how it is taken back: what a worker records
//! before every call, what it puts back when going on with the task is
//! refused for a cancellation, and what a crash beside other messages is
//! forgiven.
//!
//! The start and its undo are decided here together, so that what the
//! undo restores is exactly what the start changed; the tests below hold
//! the two to each other for every kind of attempt.

use super::{record_attempt, Attempt, Call, Phase};
use crate::model::task::{
    AuditAction, AuditEntry, StepRecord, StepStatus, TaskInstance, TaskStatus, Timestamp,
};
use crate::saga::SagaDefinition;

/// Starts an attempt ([`record_attempt`]) and marks it as made `alone`
/// (a delivery recovered from a worker that stopped answering: a crash
/// from here on is the task's own, see [`forgive_crash`]). `undoable`
/// keeps what it takes to put the task back ([`Undo`]): a worker that goes
/// on with a running task asks for it, because that write is refused once
/// cancellation is requested.
pub(crate) fn start_attempt(
    task: &mut TaskInstance,
    def: &SagaDefinition,
    call: Call,
    alone: bool,
    undoable: bool,
) -> (Attempt, Option<Undo>) {
    let undo = undoable.then(|| Undo::take(task, call.idx));
    let attempt = record_attempt(task, def, call);
    if alone {
        let rec = &mut task.steps[call.idx];
        match call.phase {
            Phase::Step => rec.alone_attempt = Some(attempt.number),
            Phase::Compensation => rec.alone_compensation = Some(attempt.number),
        }
    }
    (attempt, undo)
}

/// What an attempt's start changes in the task (the step's record, the
/// task's status and end, its audit log), kept to put the task back. A
/// copy of the whole task (its audit log, every step and their stored
/// copies) for every attempt that goes on cost more than the rest of the
/// attempt's bookkeeping; debug builds also keep the whole copy and check
/// that the task is put back exactly.
#[derive(Debug)]
pub(crate) struct Undo {
    idx: usize,
    step: StepRecord,
    status: TaskStatus,
    finished_at: Option<Timestamp>,
    audit_len: usize,
    #[cfg(debug_assertions)]
    whole: Box<TaskInstance>,
}

impl Undo {
    fn take(task: &TaskInstance, idx: usize) -> Self {
        Undo {
            idx,
            step: task.steps[idx].clone(),
            status: task.status,
            finished_at: task.finished_at,
            audit_len: task.audit_log.len(),
            #[cfg(debug_assertions)]
            whole: Box::new(task.clone()),
        }
    }

    /// Puts the task back as it was before the attempt's start.
    pub(crate) fn apply(self, task: &mut TaskInstance) {
        task.steps[self.idx] = self.step;
        task.status = self.status;
        task.finished_at = self.finished_at;
        task.audit_log.truncate(self.audit_len);
        #[cfg(debug_assertions)]
        assert!(
            *task == *self.whole,
            "an attempt's start changed more of the task than `Undo` puts back"
        );
    }
}

/// An attempt cut short (its worker stopped) that was made beside other
/// messages is not counted against the retry budget: the crash that cut it
/// short may have been another message's, and an innocent task must not
/// pay for its neighbour. The message now runs alone (see
/// `worker::isolation`), so a crash from here on is the task's own: it is
/// counted, and the delivery cap still ends a message that crashes its
/// worker every time.
pub(crate) fn forgive_crash(task: &mut TaskInstance, worker: &str) {
    let mut forgiven = Vec::new();
    for rec in &mut task.steps {
        let attempt = match rec.status {
            StepStatus::Running if rec.alone_attempt != Some(rec.attempt_count) => {
                rec.retry_base += 1;
                rec.attempt_count
            }
            StepStatus::Compensating
                if rec.compensation_attempts > 0
                    && rec.next_attempt_at.is_none()
                    && rec.alone_compensation != Some(rec.compensation_attempts) =>
            {
                rec.compensation_retry_base += 1;
                rec.compensation_attempts
            }
            _ => continue,
        };
        forgiven.push((rec.name.clone(), attempt));
    }
    for (step, attempt) in forgiven {
        task.audit(
            AuditEntry::new(AuditAction::AttemptAbandoned)
                .step(&step)
                .attempt(attempt)
                .error(format!(
                    "attempt {attempt} was cut short when its worker stopped with other \
                     messages in flight beside it; made again alone, not counted against \
                     the retry budget"
                ))
                .worker(worker),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::RetryPolicy;
    use crate::saga::{CompensationDefinition, StepDefinition};

    const fn step(name: &'static str, order: u32) -> StepDefinition {
        StepDefinition {
            name,
            order,
            retry: RetryPolicy::NO_RETRY,
            compensation: Some(CompensationDefinition {
                name: "undo",
                retry: RetryPolicy::NO_RETRY,
                handles_unknown: false,
            }),
            circuit_breaker: None,
            timeout: None,
            input_type: "serde_json::Value",
            limits: &[],
            output_type: "serde_json::Value",
        }
    }

    static TWO: SagaDefinition = SagaDefinition {
        name: "two",
        version: 1,
        fingerprint: 0,
        type_name: "Two",
        cancellable: true,
        steps: &[step("first", 1), step("second", 2)],
    };

    fn task(status: TaskStatus, idx: usize, step_status: StepStatus) -> TaskInstance {
        let steps = [("first".to_owned(), 1), ("second".to_owned(), 2)];
        let mut task = TaskInstance::new("two", serde_json::json!({"a": 1}), steps);
        task.status = status;
        task.steps[idx].status = step_status;
        task.steps[idx].error = Some("earlier".into());
        task.steps[idx].next_attempt_at = Some(Timestamp(5));
        task.audit(AuditEntry::new(AuditAction::StepCompleted));
        task
    }

    #[test]
    fn an_attempts_start_is_put_back_exactly_alone_or_not() {
        let cases = [
            (TaskStatus::Pending, StepStatus::Pending, Phase::Step, 0),
            (TaskStatus::Running, StepStatus::Pending, Phase::Step, 1),
            (TaskStatus::Running, StepStatus::Failed, Phase::Step, 1),
            (
                TaskStatus::Compensating,
                StepStatus::Completed,
                Phase::Compensation,
                0,
            ),
        ];
        for (status, step_status, phase, idx) in cases {
            for alone in [false, true] {
                let mut task = task(status, idx, step_status);
                let before = task.clone();
                let call = Call { phase, idx };
                let (attempt, undo) = start_attempt(&mut task, &TWO, call, alone, true);
                assert_eq!(attempt.number, 1);
                assert_ne!(task, before);
                let marked = match phase {
                    Phase::Step => task.steps[idx].alone_attempt,
                    Phase::Compensation => task.steps[idx].alone_compensation,
                };
                assert_eq!(marked, alone.then_some(1), "{status:?} {phase:?} {idx}");
                undo.expect("asked for").apply(&mut task);
                assert_eq!(task, before, "{status:?} {phase:?} {idx} alone {alone}");
            }
        }
    }

    #[test]
    fn an_attempt_not_asked_to_be_undoable_keeps_no_copy() {
        let mut task = task(TaskStatus::Running, 0, StepStatus::Pending);
        let call = Call {
            phase: Phase::Step,
            idx: 0,
        };
        assert!(start_attempt(&mut task, &TWO, call, false, false)
            .1
            .is_none());
    }

    #[test]
    fn a_crash_beside_other_messages_is_forgiven_once_and_one_made_alone_is_not() {
        let mut task = task(TaskStatus::Running, 0, StepStatus::Pending);
        let call = Call {
            phase: Phase::Step,
            idx: 0,
        };
        start_attempt(&mut task, &TWO, call, false, false);
        forgive_crash(&mut task, "w-2");
        assert_eq!(task.steps[0].retry_base, 1);
        let last = task.audit_log.last().unwrap();
        assert_eq!(last.action, AuditAction::AttemptAbandoned);
        assert_eq!(last.attempt, Some(1));
        // Made again alone, and cut short again: its own crash, counted.
        start_attempt(&mut task, &TWO, call, true, false);
        let logged = task.audit_log.len();
        forgive_crash(&mut task, "w-3");
        assert_eq!(task.steps[0].retry_base, 1);
        assert_eq!(task.audit_log.len(), logged);
    }
}
