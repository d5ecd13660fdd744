//! Every transition of the saga protocol, on hand-built definitions.

use serde_json::json;

use super::*;
use crate::policy::BackoffKind;
use crate::saga::{CompensationDefinition, StepDefinition};

const W: &str = "w-1";

/// a (compensated by undo_a; exponential 200 ms, 3 retries), b (no
/// compensation; linear 100 ms, 2 retries), c (compensated by undo_c, whose
/// own policy is constant 50 ms with 2 retries; c itself: one retry, no
/// delay).
static THREE: SagaDefinition = SagaDefinition {
    name: "three",
    type_name: "Three",
    cancellable: true,
    steps: &[
        StepDefinition {
            name: "a",
            order: 1,
            retry: RetryPolicy::new(3, BackoffKind::Exponential, 200),
            compensation: Some(CompensationDefinition {
                name: "undo_a",
                retry: RetryPolicy::new(1, BackoffKind::Constant, 10),
            }),
            circuit_breaker: None,
            timeout: None,
            input_type: "u32",
            output_type: "u32",
        },
        StepDefinition {
            name: "b",
            order: 2,
            retry: RetryPolicy::new(2, BackoffKind::Linear, 100),
            compensation: None,
            circuit_breaker: None,
            timeout: None,
            input_type: "u32",
            output_type: "u32",
        },
        StepDefinition {
            name: "c",
            order: 3,
            retry: RetryPolicy::new(1, BackoffKind::Constant, 0),
            compensation: Some(CompensationDefinition {
                name: "undo_c",
                retry: RetryPolicy::new(2, BackoffKind::Constant, 50),
            }),
            circuit_breaker: None,
            timeout: None,
            input_type: "u32",
            output_type: "u32",
        },
    ],
};

const fn single(on_exhausted: OnExhausted, max_retries: u32) -> StepDefinition {
    StepDefinition {
        name: "only",
        order: 1,
        retry: RetryPolicy::new(max_retries, BackoffKind::Constant, 100)
            .with_on_exhausted(on_exhausted),
        compensation: None,
        circuit_breaker: None,
        timeout: None,
        input_type: "u32",
        output_type: "u32",
    }
}

static FAIL: SagaDefinition = SagaDefinition {
    name: "fail",
    type_name: "Fail",
    cancellable: false,
    steps: &[single(OnExhausted::Fail, 1)],
};

static PARK: SagaDefinition = SagaDefinition {
    name: "park",
    type_name: "Park",
    cancellable: false,
    steps: &[single(OnExhausted::DeadLetter, 0)],
};

static ONCE: SagaDefinition = SagaDefinition {
    name: "once",
    type_name: "Once",
    cancellable: false,
    steps: &[single(OnExhausted::Compensate, 0)],
};

fn fresh(def: &SagaDefinition) -> TaskInstance {
    TaskInstance::new(
        def.name,
        json!(1),
        def.steps.iter().map(|s| (s.name.to_owned(), s.order)),
    )
}

fn expect_call(plan: Plan) -> Call {
    match plan {
        Plan::Call(call) => call,
        other => panic!("expected a call, got {other:?}"),
    }
}

fn expect_commit(plan: Plan) -> Effects {
    match plan {
        Plan::Commit(effects) => effects,
        other => panic!("expected a commit, got {other:?}"),
    }
}

/// Plans, records and applies one attempt with `outcome`.
fn attempt(task: &mut TaskInstance, def: &SagaDefinition, outcome: Outcome) -> (Call, Effects) {
    let call = expect_call(plan(task, def, None, W));
    record_attempt(task, def, call);
    let effects = on_outcome(task, def, call, outcome, W);
    (call, effects)
}

fn ok(n: u32) -> Outcome {
    Outcome::Succeeded(json!(n))
}

fn transient(e: &str) -> Outcome {
    Outcome::Failed {
        error: e.into(),
        kind: StepErrorKind::Transient,
    }
}

fn permanent(e: &str) -> Outcome {
    Outcome::Failed {
        error: e.into(),
        kind: StepErrorKind::Permanent,
    }
}

fn actions(task: &TaskInstance) -> Vec<AuditAction> {
    task.audit_log.iter().map(|e| e.action.clone()).collect()
}

fn changed(from: TaskStatus, to: TaskStatus) -> AuditAction {
    AuditAction::StatusChanged { from, to }
}

fn step_statuses(task: &TaskInstance) -> Vec<StepStatus> {
    task.steps.iter().map(|s| s.status).collect()
}

/// Runs steps a and b to completion.
fn two_done() -> TaskInstance {
    let mut t = fresh(&THREE);
    attempt(&mut t, &THREE, ok(2));
    attempt(&mut t, &THREE, ok(3));
    t
}

#[test]
fn a_fresh_task_calls_step_one_and_the_attempt_is_recorded_before_the_call() {
    let mut t = fresh(&THREE);
    let call = expect_call(plan(&mut t, &THREE, None, W));
    assert_eq!(
        call,
        Call {
            phase: Phase::Step,
            idx: 0
        }
    );
    assert_eq!(call.input(&t), json!(1), "step 1 gets the saga's input");
    assert!(t.audit_log.is_empty(), "planning alone changes nothing");
    let a = record_attempt(&mut t, &THREE, call);
    assert_eq!(
        a,
        Attempt {
            number: 1,
            claim: "a:1".into()
        }
    );
    assert_eq!(t.status, TaskStatus::Running);
    assert_eq!(t.steps[0].status, StepStatus::Running);
    assert_eq!(t.steps[0].attempt_count, 1);
    assert!(t.steps[0].started_at.is_some());
    assert_eq!(
        actions(&t),
        [changed(TaskStatus::Pending, TaskStatus::Running)]
    );
}

#[test]
fn a_middle_step_succeeding_moves_on_at_once_and_feeds_the_next_step() {
    let mut t = fresh(&THREE);
    let (_, e) = attempt(&mut t, &THREE, ok(2));
    assert_eq!(e.next, NextMove::Now);
    assert!(e.guard.is_none() && e.dead_letter.is_none());
    assert_eq!(t.status, TaskStatus::Running);
    assert_eq!(t.steps[0].status, StepStatus::Completed);
    assert_eq!(t.steps[0].output, Some(json!(2)));
    assert!(t.steps[0].completed_at.is_some());
    assert_eq!(actions(&t).last(), Some(&AuditAction::StepCompleted));
    let next = expect_call(plan(&mut t, &THREE, None, W));
    assert_eq!(next.idx, 1);
    assert_eq!(next.input(&t), json!(2), "step 2 gets step 1's output");
}

#[test]
fn the_last_step_succeeding_completes_the_task_behind_a_guard() {
    let mut t = two_done();
    let (_, e) = attempt(&mut t, &THREE, ok(4));
    assert_eq!(e.next, NextMove::Stop);
    assert_eq!(t.status, TaskStatus::Completed);
    assert_eq!(t.output, Some(json!(4)));
    assert!(t.finished_at.is_some());
    let guard = e.guard.expect("completing a task is guarded");
    assert_eq!(guard.status, TaskStatus::Running);
    assert_eq!(guard.steps[2].status, StepStatus::Completed);
    assert_eq!(guard.output, None);
}

#[test]
fn transient_failures_retry_on_the_exact_schedule_of_each_backoff_kind() {
    // a: exponential 200 ms, 3 retries.
    let mut t = fresh(&THREE);
    let mut delays = Vec::new();
    for n in 1..=3 {
        let (_, e) = attempt(&mut t, &THREE, transient("503"));
        delays.push(e.next);
        let rec = &t.steps[0];
        assert_eq!(rec.attempt_count, n);
        assert_eq!(rec.status, StepStatus::Pending);
        assert!(rec.next_attempt_at.is_some());
        assert_eq!(rec.error.as_deref(), Some("503"));
    }
    assert_eq!(
        delays,
        [200, 400, 800].map(|ms| NextMove::After(Duration::from_millis(ms)))
    );
    let retry_in: Vec<Option<u64>> = t
        .audit_log
        .iter()
        .filter_map(|e| match e.action {
            AuditAction::AttemptFailed { retry_in_ms, .. } => Some(retry_in_ms),
            _ => None,
        })
        .collect();
    assert_eq!(retry_in, [Some(200), Some(400), Some(800)]);
    // The retry records attempt 4 and clears the due time.
    let call = expect_call(plan(&mut t, &THREE, None, W));
    assert_eq!(record_attempt(&mut t, &THREE, call).number, 4);
    assert!(t.steps[0].next_attempt_at.is_none());

    // b: linear 100 ms.
    let mut t = fresh(&THREE);
    attempt(&mut t, &THREE, ok(2));
    let (_, e1) = attempt(&mut t, &THREE, transient("x"));
    let (_, e2) = attempt(&mut t, &THREE, transient("x"));
    assert_eq!(
        [e1.next, e2.next],
        [100, 200].map(|ms| NextMove::After(Duration::from_millis(ms)))
    );

    // c: constant 0 ms: retried at once, not scheduled.
    let mut t = two_done();
    let (_, e) = attempt(&mut t, &THREE, transient("x"));
    assert_eq!(e.next, NextMove::Now);
}

#[test]
fn exhaustion_compensates_completed_steps_in_reverse() {
    let mut t = two_done();
    attempt(&mut t, &THREE, transient("x"));
    let (_, e) = attempt(&mut t, &THREE, transient("still down"));
    assert_eq!(t.status, TaskStatus::Compensating);
    assert_eq!(e.next, NextMove::Now);
    let guard = e.guard.expect("leaving the running phase is guarded");
    assert_eq!(guard.status, TaskStatus::Running);
    let rec = &t.steps[2];
    assert_eq!(rec.status, StepStatus::Failed);
    assert_eq!(rec.error.as_deref(), Some("still down"));
    assert_eq!(rec.trace_id.as_deref(), Some(t.trace_id.as_str()));
    assert_eq!(t.error.as_deref(), Some("step `c` failed: still down"));
    // c failed (nothing to undo), b has no compensation: a is next.
    let call = expect_call(plan(&mut t, &THREE, None, W));
    assert_eq!(
        call,
        Call {
            phase: Phase::Compensation,
            idx: 0
        }
    );
    assert_eq!(call.method(&THREE), "undo_a");
    assert_eq!(
        call.input(&t),
        json!(2),
        "a compensation gets its step's output"
    );
    assert_eq!(record_attempt(&mut t, &THREE, call).claim, "undo_a:1");
    let e = on_outcome(&mut t, &THREE, call, Outcome::Succeeded(Value::Null), W);
    assert_eq!(e.next, NextMove::Stop);
    assert_eq!(t.status, TaskStatus::Compensated);
    assert_eq!(
        step_statuses(&t),
        [
            StepStatus::Compensated,
            StepStatus::Completed,
            StepStatus::Failed
        ]
    );
}

#[test]
fn exhaustion_with_nothing_to_compensate_ends_compensated() {
    let mut t = fresh(&ONCE);
    let (_, e) = attempt(&mut t, &ONCE, transient("x"));
    assert_eq!(t.status, TaskStatus::Compensated);
    assert_eq!(e.next, NextMove::Stop);
    assert!(e.guard.is_some());
}

#[test]
fn exhaustion_with_fail_ends_failed_without_compensating() {
    let mut t = fresh(&FAIL);
    let (_, e) = attempt(&mut t, &FAIL, transient("x"));
    assert_eq!(e.next, NextMove::After(Duration::from_millis(100)));
    let (_, e) = attempt(&mut t, &FAIL, transient("y"));
    assert_eq!(t.status, TaskStatus::Failed);
    assert_eq!(e.next, NextMove::Stop);
    assert!(e.guard.is_some() && e.dead_letter.is_none());
    assert_eq!(t.steps[0].attempt_count, 2, "max_retries = 1: two calls");
}

#[test]
fn exhaustion_with_dead_letter_parks_the_task_with_a_reason() {
    let mut t = fresh(&PARK);
    let (_, e) = attempt(&mut t, &PARK, transient("x"));
    assert_eq!(t.status, TaskStatus::DeadLettered);
    assert_eq!(e.next, NextMove::Stop);
    assert!(e.guard.is_some());
    assert_eq!(e.dead_letter.as_deref(), Some("saga `park` step `only`: x"));
    assert!(actions(&t).contains(&AuditAction::DeadLettered));
}

#[test]
fn a_permanent_error_skips_the_remaining_retries() {
    let mut t = fresh(&THREE);
    let (_, e) = attempt(&mut t, &THREE, permanent("declined"));
    assert_eq!(t.steps[0].attempt_count, 1);
    assert_eq!(t.status, TaskStatus::Compensated, "nothing completed yet");
    assert_eq!(e.next, NextMove::Stop);
    assert!(actions(&t).contains(&AuditAction::AttemptFailed {
        retry_in_ms: None,
        permanent: true
    }));
}

#[test]
fn an_invalid_payload_dead_letters_whatever_on_exhausted_says() {
    let mut t = fresh(&THREE);
    let outcome = Outcome::Failed {
        error: "does not deserialize".into(),
        kind: StepErrorKind::InvalidPayload,
    };
    let (_, e) = attempt(&mut t, &THREE, outcome);
    assert_eq!(t.status, TaskStatus::DeadLettered);
    assert!(e.dead_letter.unwrap().contains("does not deserialize"));
}

#[test]
fn a_timed_out_attempt_is_a_transient_failure() {
    let mut t = fresh(&THREE);
    let (_, e) = attempt(
        &mut t,
        &THREE,
        Outcome::TimedOut {
            after: Duration::from_secs(30),
        },
    );
    assert_eq!(e.next, NextMove::After(Duration::from_millis(200)));
    assert_eq!(
        t.steps[0].error.as_deref(),
        Some("attempt timed out after 30s and was cancelled")
    );
}

#[test]
fn an_open_circuit_exhausts_the_step_without_recording_an_attempt() {
    let mut t = two_done();
    let call = expect_call(plan(&mut t, &THREE, None, W));
    let e = on_outcome(
        &mut t,
        &THREE,
        call,
        Outcome::CircuitOpen("circuit breaker is open".into()),
        W,
    );
    assert_eq!(t.steps[2].attempt_count, 0);
    assert_eq!(t.steps[2].status, StepStatus::Failed);
    assert_eq!(t.status, TaskStatus::Compensating);
    assert!(e.guard.is_some());
    assert!(actions(&t).contains(&AuditAction::CircuitOpen));
}

#[test]
fn an_already_claimed_step_attempt_is_skipped_without_spending_the_budget() {
    let mut t = fresh(&ONCE); // max_retries = 0: a single real attempt
    let (_, e) = attempt(&mut t, &ONCE, Outcome::AlreadyClaimed);
    assert_eq!(e.next, NextMove::Now);
    let rec = &t.steps[0];
    assert_eq!((rec.attempt_count, rec.retry_base), (1, 1));
    assert_eq!(rec.status, StepStatus::Pending);
    assert_eq!(actions(&t).last(), Some(&AuditAction::DuplicateAttempt));
    // The budget is intact: attempt 2 is a real call.
    let call = expect_call(plan(&mut t, &ONCE, None, W));
    assert_eq!(record_attempt(&mut t, &ONCE, call).claim, "only:2");
    on_outcome(&mut t, &ONCE, call, ok(1), W);
    assert_eq!(t.status, TaskStatus::Completed);
}

#[test]
fn an_already_claimed_compensation_attempt_counts_as_failed() {
    let mut t = two_done();
    attempt(&mut t, &THREE, permanent("x"));
    let (call, e) = attempt(&mut t, &THREE, Outcome::AlreadyClaimed);
    assert_eq!(call.phase, Phase::Compensation);
    assert_eq!(e.next, NextMove::After(Duration::from_millis(10)));
    assert!(t.steps[0]
        .compensation_error
        .as_deref()
        .unwrap()
        .contains("already claimed"));
}

#[test]
fn cancelling_a_waiting_task_fails_its_pending_retry_and_compensates() {
    let mut t = fresh(&THREE);
    attempt(&mut t, &THREE, ok(2));
    attempt(&mut t, &THREE, transient("x")); // b waits for its retry
    let at = Timestamp(1_000);
    let e = expect_commit(plan(&mut t, &THREE, Some(at), W));
    assert_eq!(e.next, NextMove::Now);
    assert!(e.guard.is_none());
    assert_eq!(t.cancelled_at, Some(at));
    assert_eq!(t.status, TaskStatus::Compensating);
    assert_eq!(t.steps[1].status, StepStatus::Failed);
    assert!(t.steps[1].next_attempt_at.is_none());
    assert!(actions(&t).contains(&AuditAction::CancellationRequested));
    // Once recorded, the flag does not begin cancellation again.
    let call = expect_call(plan(&mut t, &THREE, Some(at), W));
    assert_eq!(call.phase, Phase::Compensation);
    record_attempt(&mut t, &THREE, call);
    on_outcome(&mut t, &THREE, call, Outcome::Succeeded(Value::Null), W);
    assert_eq!(t.status, TaskStatus::Cancelled);
}

#[test]
fn cancelling_before_any_step_completed_ends_cancelled_at_once() {
    let mut t = fresh(&THREE);
    let e = expect_commit(plan(&mut t, &THREE, Some(Timestamp(5)), W));
    assert_eq!(e.next, NextMove::Stop);
    assert_eq!(t.status, TaskStatus::Cancelled);
}

#[test]
fn cancelling_a_task_whose_attempt_never_reported_back_fails_that_step() {
    let mut t = fresh(&THREE);
    let call = expect_call(plan(&mut t, &THREE, None, W));
    record_attempt(&mut t, &THREE, call); // and the worker died
    expect_commit(plan(&mut t, &THREE, Some(Timestamp(5)), W));
    assert_eq!(t.steps[0].status, StepStatus::Failed);
    assert_eq!(t.status, TaskStatus::Cancelled);
}

#[test]
fn a_cancelled_attempt_fails_its_step_and_begins_cancellation() {
    let mut t = fresh(&THREE);
    attempt(&mut t, &THREE, ok(2));
    let at = Timestamp(77);
    let (_, e) = attempt(
        &mut t,
        &THREE,
        Outcome::Cancelled {
            at,
            error: "render aborted".into(),
        },
    );
    assert_eq!(t.steps[1].status, StepStatus::Failed);
    assert_eq!(
        t.steps[1].error.as_deref(),
        Some("cancelled: render aborted")
    );
    assert_eq!(t.cancelled_at, Some(at));
    assert_eq!(t.status, TaskStatus::Compensating);
    assert_eq!(e.next, NextMove::Now);
}

#[test]
fn a_compensating_task_after_a_failure_is_not_cancelled_again() {
    let mut t = two_done();
    attempt(&mut t, &THREE, permanent("x"));
    assert_eq!(t.status, TaskStatus::Compensating);
    let call = expect_call(plan(&mut t, &THREE, Some(Timestamp(9)), W));
    assert_eq!(call.phase, Phase::Compensation);
    assert_eq!(t.cancelled_at, None);
}

#[test]
fn an_attempt_that_never_reported_back_counts_against_the_budget() {
    let mut t = fresh(&FAIL); // two calls allowed
    let call = expect_call(plan(&mut t, &FAIL, None, W));
    record_attempt(&mut t, &FAIL, call); // attempt 1: the worker died
    let call = expect_call(plan(&mut t, &FAIL, None, "w-2"));
    let abandoned = t
        .audit_log
        .iter()
        .find(|e| e.action == AuditAction::AttemptAbandoned)
        .expect("audited");
    assert_eq!(abandoned.attempt, Some(1));
    assert_eq!(abandoned.worker.as_deref(), Some("w-2"));
    assert_eq!(record_attempt(&mut t, &FAIL, call).number, 2);
    // Attempt 2 dies too: the budget is spent.
    let e = expect_commit(plan(&mut t, &FAIL, None, W));
    assert_eq!(t.status, TaskStatus::Failed);
    assert!(e.guard.is_some());
    assert!(t.steps[0]
        .error
        .as_deref()
        .unwrap()
        .contains("attempt 2 did not report back"));
}

#[test]
fn a_compensation_that_never_reported_back_counts_too() {
    let mut t = two_done();
    attempt(&mut t, &THREE, permanent("x"));
    let call = expect_call(plan(&mut t, &THREE, None, W));
    record_attempt(&mut t, &THREE, call); // undo_a attempt 1 dies
    let call = expect_call(plan(&mut t, &THREE, None, W));
    assert!(actions(&t).contains(&AuditAction::AttemptAbandoned));
    record_attempt(&mut t, &THREE, call); // attempt 2 dies: 1 retry allowed
    let e = expect_commit(plan(&mut t, &THREE, None, W));
    assert_eq!(e.next, NextMove::Stop);
    assert_eq!(t.status, TaskStatus::CompensationFailed);
}

#[test]
fn compensations_retry_on_their_own_policy_then_fail_for_good_with_everything_recorded() {
    // Complete all three steps, then cancel: undo_c runs first.
    let mut t = two_done();
    attempt(&mut t, &THREE, ok(4));
    let mut t = {
        let mut guard = t.clone();
        guard.status = TaskStatus::Running;
        guard.output = None;
        guard
    };
    begin_cancel(&mut t, &THREE, Timestamp(1));
    let mut delays = Vec::new();
    for _ in 0..2 {
        let (call, e) = attempt(&mut t, &THREE, transient("bucket locked"));
        assert_eq!(call.method(&THREE), "undo_c");
        assert!(t.steps[2].next_attempt_at.is_some());
        delays.push(e.next);
    }
    assert_eq!(delays, [NextMove::After(Duration::from_millis(50)); 2]);
    let (_, e) = attempt(&mut t, &THREE, transient("bucket locked"));
    assert_eq!(e.next, NextMove::Stop);
    assert_eq!(t.status, TaskStatus::CompensationFailed);
    let rec = &t.steps[2];
    assert_eq!(rec.status, StepStatus::CompensationFailed);
    assert_eq!(rec.compensation_error.as_deref(), Some("bucket locked"));
    assert_eq!(rec.compensation_attempts, 3);
    assert_eq!(rec.trace_id.as_deref(), Some(t.trace_id.as_str()));
    assert_eq!(
        t.error.as_deref(),
        Some("compensation of step `c` failed: bucket locked")
    );
    let entry = t
        .audit_log
        .iter()
        .find(|e| e.action == AuditAction::CompensationFailed)
        .unwrap();
    let details: Value = serde_json::from_str(entry.details.as_deref().unwrap()).unwrap();
    assert_eq!(
        details,
        json!({
            "step": "c",
            "error": "bucket locked",
            "trace_id": t.trace_id,
            "attempt_count": 1,
            "compensation_attempts": 3,
        })
    );
    assert_eq!(entry.trace_id.as_deref(), Some(t.trace_id.as_str()));
}

#[test]
fn a_permanent_compensation_error_fails_at_once() {
    let mut t = two_done();
    attempt(&mut t, &THREE, permanent("x"));
    let (_, e) = attempt(&mut t, &THREE, permanent("gone"));
    assert_eq!(e.next, NextMove::Stop);
    assert_eq!(t.status, TaskStatus::CompensationFailed);
    assert_eq!(t.steps[0].compensation_attempts, 1);
}

#[test]
fn a_fresh_compensation_budget_starts_at_its_retry_base() {
    let mut t = two_done();
    attempt(&mut t, &THREE, permanent("x"));
    attempt(&mut t, &THREE, transient("a"));
    attempt(&mut t, &THREE, transient("b"));
    assert_eq!(t.status, TaskStatus::CompensationFailed);
    // As a requeue does: a new budget, attempt numbers keep counting.
    t.steps[0].status = StepStatus::Compensating;
    t.steps[0].compensation_retry_base = t.steps[0].compensation_attempts;
    t.set_status(TaskStatus::Compensating);
    let call = expect_call(plan(&mut t, &THREE, None, W));
    assert_eq!(record_attempt(&mut t, &THREE, call).claim, "undo_a:3");
    on_outcome(&mut t, &THREE, call, Outcome::Succeeded(Value::Null), W);
    assert_eq!(t.status, TaskStatus::Compensated);
}

#[test]
fn a_poison_message_parks_the_task() {
    let mut t = fresh(&THREE);
    let call = expect_call(plan(&mut t, &THREE, None, W));
    record_attempt(&mut t, &THREE, call);
    let e = poisoned(&mut t, &THREE, 10);
    assert_eq!(t.status, TaskStatus::DeadLettered);
    assert_eq!(e.next, NextMove::Stop);
    assert!(e.guard.is_none());
    let reason = e.dead_letter.unwrap();
    assert!(
        reason.contains("delivered 10 times without completing"),
        "{reason}"
    );
    assert_eq!(t.steps[0].status, StepStatus::Failed);
    assert!(t.error.as_deref().unwrap().contains("delivered 10 times"));

    // During compensation, the compensating step keeps its status (a
    // requeue resumes it).
    let mut t = two_done();
    attempt(&mut t, &THREE, permanent("x"));
    let call = expect_call(plan(&mut t, &THREE, None, W));
    record_attempt(&mut t, &THREE, call);
    poisoned(&mut t, &THREE, 3);
    assert_eq!(t.status, TaskStatus::DeadLettered);
    assert_eq!(t.steps[0].status, StepStatus::Compensating);
}

#[test]
fn a_terminal_task_needs_nothing_and_a_fully_recorded_one_completes() {
    let mut t = fresh(&ONCE);
    t.set_status(TaskStatus::Failed);
    assert!(matches!(plan(&mut t, &ONCE, None, W), Plan::Nothing));

    let mut t = fresh(&THREE);
    t.set_status(TaskStatus::Running);
    for (i, rec) in t.steps.iter_mut().enumerate() {
        rec.status = StepStatus::Completed;
        rec.output = Some(json!(i));
    }
    let e = expect_commit(plan(&mut t, &THREE, None, W));
    assert_eq!(e.next, NextMove::Stop);
    assert_eq!(t.status, TaskStatus::Completed);
    assert_eq!(t.output, Some(json!(2)));
}

#[test]
fn a_refused_completion_becomes_a_cancellation_that_compensates_every_step() {
    // The worker's path when the guarded commit of the last step is
    // refused: begin_cancel on the guard.
    let mut t = two_done();
    let (_, e) = attempt(&mut t, &THREE, ok(4));
    let mut guard = *e.guard.unwrap();
    begin_cancel(&mut guard, &THREE, Timestamp(3));
    assert_eq!(guard.status, TaskStatus::Compensating);
    let first = expect_call(plan(&mut guard, &THREE, None, W));
    assert_eq!(
        first,
        Call {
            phase: Phase::Compensation,
            idx: 2
        },
        "the last step, completed just now, is undone first"
    );
}
