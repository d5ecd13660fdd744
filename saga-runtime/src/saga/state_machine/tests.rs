//! Every transition of the saga protocol, on hand-built definitions.
//!
//! Each test drives the pure functions the way the worker does (plan, record
//! the attempt, apply the outcome; or plan and commit) and asserts the whole
//! resulting state: task and step statuses, attempt counts and budgets, due
//! times, errors, the audit lines added (kind, step, attempt, order) and the
//! transition the commit must carry.

use serde_json::json;

use super::*;
use crate::model::task::StepRecord;
use crate::policy::BackoffKind;
use crate::saga::{CompensationDefinition, StepDefinition};

const W: &str = "w-1";
const W2: &str = "w-2";

const fn step(
    name: &'static str,
    order: u32,
    retry: RetryPolicy,
    compensation: Option<CompensationDefinition>,
) -> StepDefinition {
    StepDefinition {
        name,
        order,
        retry,
        compensation,
        circuit_breaker: None,
        timeout: None,
        input_type: "serde_json::Value",
        limits: &[],
        output_type: "serde_json::Value",
    }
}

const fn undo(name: &'static str, retry: RetryPolicy) -> Option<CompensationDefinition> {
    Some(CompensationDefinition {
        name,
        retry,
        handles_unknown: false,
    })
}

/// The main saga:
/// - 0 `reserve`: exponential 200 ms, 3 retries; compensated by `release`
///   (constant 1000 ms, 2 retries);
/// - 1 `charge`: linear 100 ms, 2 retries; no compensation;
/// - 2 `ship`: constant 0 ms, 1 retry; compensated by `unship` (exponential
///   50 ms, 2 retries);
/// - 3 `notify`: exponential 500 ms, 1 retry; compensated by `retract` (no
///   retry).
static BOOK: SagaDefinition = SagaDefinition {
    name: "book",
    version: 1,
    fingerprint: 0,
    type_name: "Book",
    cancellable: true,
    steps: &[
        step(
            "reserve",
            1,
            RetryPolicy::new(3, BackoffKind::Exponential, 200),
            undo("release", RetryPolicy::new(2, BackoffKind::Constant, 1000)),
        ),
        step(
            "charge",
            2,
            RetryPolicy::new(2, BackoffKind::Linear, 100),
            None,
        ),
        step(
            "ship",
            3,
            RetryPolicy::new(1, BackoffKind::Constant, 0),
            undo("unship", RetryPolicy::new(2, BackoffKind::Exponential, 50)),
        ),
        step(
            "notify",
            4,
            RetryPolicy::new(1, BackoffKind::Exponential, 500),
            undo("retract", RetryPolicy::NO_RETRY),
        ),
    ],
};

/// `first` (compensated, no retry), then `second` with `on_exhausted = fail`
/// (constant 100 ms, 1 retry).
static FAIL2: SagaDefinition = SagaDefinition {
    name: "fail-two",
    version: 1,
    fingerprint: 0,
    type_name: "FailTwo",
    cancellable: true,
    steps: &[
        step(
            "first",
            1,
            RetryPolicy::NO_RETRY,
            undo("undo_first", RetryPolicy::NO_RETRY),
        ),
        step(
            "second",
            2,
            RetryPolicy::new(1, BackoffKind::Constant, 100).with_on_exhausted(OnExhausted::Fail),
            None,
        ),
    ],
};

/// `first` (compensated, no retry), then `second` with `on_exhausted =
/// dead_letter` (constant 100 ms, 2 retries).
static PARK2: SagaDefinition = SagaDefinition {
    name: "park-two",
    version: 1,
    fingerprint: 0,
    type_name: "ParkTwo",
    cancellable: true,
    steps: &[
        step(
            "first",
            1,
            RetryPolicy::NO_RETRY,
            undo("undo_first", RetryPolicy::NO_RETRY),
        ),
        step(
            "second",
            2,
            RetryPolicy::new(2, BackoffKind::Constant, 100)
                .with_on_exhausted(OnExhausted::DeadLetter),
            None,
        ),
    ],
};

/// Two steps, neither compensated: `plain` (no retry), `flaky` (constant
/// 0 ms, 1 retry).
static BARE: SagaDefinition = SagaDefinition {
    name: "bare",
    version: 1,
    fingerprint: 0,
    type_name: "Bare",
    cancellable: true,
    steps: &[
        step("plain", 1, RetryPolicy::NO_RETRY, None),
        step(
            "flaky",
            2,
            RetryPolicy::new(1, BackoffKind::Constant, 0),
            None,
        ),
    ],
};

/// One step, one call, `on_exhausted = compensate`.
static ONCE: SagaDefinition = SagaDefinition {
    name: "once",
    version: 1,
    fingerprint: 0,
    type_name: "Once",
    cancellable: false,
    steps: &[step("only", 1, RetryPolicy::NO_RETRY, None)],
};

/// One step: constant 250 ms, 3 retries.
static STEADY: SagaDefinition = SagaDefinition {
    name: "steady",
    version: 1,
    fingerprint: 0,
    type_name: "Steady",
    cancellable: false,
    steps: &[step(
        "steady",
        1,
        RetryPolicy::new(3, BackoffKind::Constant, 250),
        None,
    )],
};

/// One step: exponential 200 ms capped at 500 ms, 4 retries.
static CAPPED: SagaDefinition = SagaDefinition {
    name: "capped",
    version: 1,
    fingerprint: 0,
    type_name: "Capped",
    cancellable: false,
    steps: &[step(
        "capped",
        1,
        RetryPolicy::new(4, BackoffKind::Exponential, 200).with_max_delay_ms(500),
        None,
    )],
};

/// One step: exponential 200 ms, 5 retries (the documented 200..3200 ms).
static EXP5: SagaDefinition = SagaDefinition {
    name: "exp-five",
    version: 1,
    fingerprint: 0,
    type_name: "ExpFive",
    cancellable: false,
    steps: &[step(
        "expo",
        1,
        RetryPolicy::new(5, BackoffKind::Exponential, 200),
        None,
    )],
};

/// One step: linear 200 ms, 4 retries.
static LIN4: SagaDefinition = SagaDefinition {
    name: "lin-four",
    version: 1,
    fingerprint: 0,
    type_name: "LinFour",
    cancellable: false,
    steps: &[step(
        "linear",
        1,
        RetryPolicy::new(4, BackoffKind::Linear, 200),
        None,
    )],
};

/// One step: constant 1000 ms with jitter, 3 retries.
static JITTER: SagaDefinition = SagaDefinition {
    name: "jitter",
    version: 1,
    fingerprint: 0,
    type_name: "Jitter",
    cancellable: false,
    steps: &[step(
        "jittery",
        1,
        RetryPolicy::new(3, BackoffKind::Constant, 1000).with_jitter(true),
        None,
    )],
};

/// `make` (compensated by `unmake`: constant 0 ms, 1 retry), then `fail`
/// (no retry, no compensation).
static ZERO_UNDO: SagaDefinition = SagaDefinition {
    name: "zero-undo",
    version: 1,
    fingerprint: 0,
    type_name: "ZeroUndo",
    cancellable: true,
    steps: &[
        step(
            "make",
            1,
            RetryPolicy::NO_RETRY,
            undo("unmake", RetryPolicy::new(1, BackoffKind::Constant, 0)),
        ),
        step("fail", 2, RetryPolicy::NO_RETRY, None),
    ],
};

// ---------------------------------------------------------------- helpers

fn fresh(def: &SagaDefinition) -> TaskInstance {
    TaskInstance::new(
        def.name,
        json!({"input": def.name}),
        def.steps.iter().map(|s| (s.name.to_owned(), s.order)),
    )
}

fn out(i: usize) -> Value {
    json!(format!("out-{i}"))
}

fn step_call(idx: usize) -> Call {
    Call {
        phase: Phase::Step,
        idx,
    }
}

fn comp_call(idx: usize) -> Call {
    Call {
        phase: Phase::Compensation,
        idx,
    }
}

fn expect_call(plan: Plan) -> Call {
    match plan {
        Plan::Call(call) => call,
        other => panic!("expected a call, got {other:?}"),
    }
}

fn expect_commit(plan: Plan) -> Transition {
    match plan {
        Plan::Commit(transition) => transition,
        other => panic!("expected a commit, got {other:?}"),
    }
}

fn succeeded(i: usize) -> Outcome {
    Outcome::Succeeded(out(i))
}

fn undone() -> Outcome {
    Outcome::Succeeded(Value::Null)
}

fn failed_with(error: &str, kind: StepErrorKind) -> Outcome {
    Outcome::Failed {
        error: error.to_owned(),
        kind,
    }
}

fn transient(error: &str) -> Outcome {
    failed_with(error, StepErrorKind::Transient)
}

fn permanent(error: &str) -> Outcome {
    failed_with(error, StepErrorKind::Permanent)
}

fn invalid(error: &str) -> Outcome {
    failed_with(error, StepErrorKind::InvalidPayload)
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

fn after_ms(n: u64) -> NextMove {
    NextMove::After(ms(n))
}

/// One attempt, as the worker makes it: plan (no cancellation), record,
/// apply the outcome. `t0..=t1` brackets the outcome's clock.
struct Ran {
    call: Call,
    attempt: Attempt,
    transition: Transition,
    t0: u64,
    t1: u64,
}

fn run(task: &mut TaskInstance, def: &SagaDefinition, outcome: Outcome) -> Ran {
    let call = expect_call(plan(task, def, None, W));
    let attempt = record_attempt(task, def, call);
    let t0 = Timestamp::now().0;
    let transition = on_outcome(task, def, call, outcome, W);
    let t1 = Timestamp::now().0;
    Ran {
        call,
        attempt,
        transition,
        t0,
        t1,
    }
}

/// Plans and records an attempt whose worker then dies.
fn crash(task: &mut TaskInstance, def: &SagaDefinition) -> (Call, Attempt) {
    let call = expect_call(plan(task, def, None, W));
    let attempt = record_attempt(task, def, call);
    (call, attempt)
}

/// A task of `def` whose first `n` steps completed with outputs `out-i`.
fn completed(def: &SagaDefinition, n: usize) -> TaskInstance {
    let mut t = fresh(def);
    for i in 0..n {
        let ran = run(&mut t, def, succeeded(i));
        assert_eq!(ran.call, step_call(i));
    }
    t
}

/// BOOK with reserve, charge and ship completed and notify failed
/// permanently: compensating, `unship` next.
fn book_compensating() -> TaskInstance {
    let mut t = completed(&BOOK, 3);
    let ran = run(&mut t, &BOOK, permanent("webhook gone"));
    assert_eq!(ran.call, step_call(3));
    assert_eq!(t.status, TaskStatus::Compensating);
    t
}

#[track_caller]
fn assert_effects(e: &Transition, next: NextMove, dead_letter: Option<&str>, guard: bool) {
    assert_eq!(e.next, next, "next move");
    assert_eq!(e.dead_letter.as_deref(), dead_letter, "dead letter");
    assert_eq!(e.guard.is_some(), guard, "guard presence");
}

/// The task's due time is `delay` after the outcome.
fn assert_due(rec: &StepRecord, ran: &Ran, delay: u64) {
    let due = rec.next_attempt_at.expect("a retry is due").0;
    assert!(
        (ran.t0 + delay..=ran.t1 + delay).contains(&due),
        "due at {due}, expected {delay} ms after [{}, {}]",
        ran.t0,
        ran.t1
    );
}

type Line = (AuditAction, Option<String>, Option<u32>);

/// The audit lines from `from` on: (action, step, attempt).
fn lines(task: &TaskInstance, from: usize) -> Vec<Line> {
    task.audit_log[from..]
        .iter()
        .map(|e| (e.action.clone(), e.step.clone(), e.attempt))
        .collect()
}

fn sc(from: TaskStatus, to: TaskStatus) -> Line {
    (AuditAction::StatusChanged { from, to }, None, None)
}

fn bare(action: AuditAction) -> Line {
    (action, None, None)
}

fn on(action: AuditAction, step: &str, attempt: Option<u32>) -> Line {
    (action, Some(step.to_owned()), attempt)
}

fn af(step: &str, attempt: u32, retry_in_ms: Option<u64>, permanent: bool) -> Line {
    on(
        AuditAction::AttemptFailed {
            retry_in_ms,
            permanent,
        },
        step,
        Some(attempt),
    )
}

fn caf(method: &str, attempt: u32, retry_in_ms: Option<u64>) -> Line {
    on(
        AuditAction::CompensationAttemptFailed { retry_in_ms },
        method,
        Some(attempt),
    )
}

fn last(task: &TaskInstance) -> &AuditEntry {
    task.audit_log.last().expect("an audit entry")
}

fn find(task: &TaskInstance, action: &AuditAction) -> Vec<AuditEntry> {
    task.audit_log
        .iter()
        .filter(|e| &e.action == action)
        .cloned()
        .collect()
}

fn statuses(task: &TaskInstance) -> Vec<StepStatus> {
    task.steps.iter().map(|s| s.status).collect()
}

fn abandoned_error(attempt: u32) -> String {
    format!("attempt {attempt} did not report back (its worker stopped or lost its lease)")
}

use StepStatus as S;
use TaskStatus as T;

// ------------------------------------------------------- plan and record

#[test]
fn plan_on_a_fresh_task_calls_step_one_and_changes_nothing() {
    let mut t = fresh(&BOOK);
    let before = t.clone();
    let call = expect_call(plan(&mut t, &BOOK, None, W));
    assert_eq!(call, step_call(0));
    assert_eq!(t, before, "planning a call mutates nothing");
    assert_eq!(call.method(&BOOK), "reserve");
    assert_eq!(call.policy(&BOOK), BOOK.steps[0].retry);
    assert_eq!(call.input(&BOOK, &t), json!({"input": "book"}));
}

#[test]
fn record_attempt_counts_claims_and_starts_the_task() {
    let mut t = fresh(&BOOK);
    let call = expect_call(plan(&mut t, &BOOK, None, W));
    let t0 = Timestamp::now();
    let attempt = record_attempt(&mut t, &BOOK, call);
    let t1 = Timestamp::now();
    assert_eq!(
        attempt,
        Attempt {
            number: 1,
            claim: "reserve:1".into()
        }
    );
    assert_eq!(t.status, T::Running);
    assert_eq!(
        statuses(&t),
        [S::Running, S::Pending, S::Pending, S::Pending]
    );
    let rec = &t.steps[0];
    assert_eq!((rec.attempt_count, rec.retry_base), (1, 0));
    assert_eq!(rec.compensation_attempts, 0);
    let started = rec.started_at.expect("stamped");
    assert!(started >= t0 && started <= t1);
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(rec.completed_at, None);
    assert_eq!(rec.error, None);
    assert_eq!(t.finished_at, None);
    assert_eq!(t.error, None);
    assert_eq!(lines(&t, 0), [sc(T::Pending, T::Running)]);
}

#[test]
fn a_later_step_attempt_changes_no_task_status() {
    let mut t = completed(&BOOK, 1);
    let n = t.audit_log.len();
    let call = expect_call(plan(&mut t, &BOOK, None, W));
    assert_eq!(call, step_call(1));
    assert_eq!(call.method(&BOOK), "charge");
    assert_eq!(call.input(&BOOK, &t), out(0), "step 2 gets step 1's output");
    let attempt = record_attempt(&mut t, &BOOK, call);
    assert_eq!(attempt.claim, "charge:1");
    assert_eq!(t.status, T::Running);
    assert_eq!(
        statuses(&t),
        [S::Completed, S::Running, S::Pending, S::Pending]
    );
    assert!(lines(&t, n).is_empty());
}

#[test]
fn calls_name_their_method_policy_and_input_for_steps_and_compensations() {
    let t = completed(&BOOK, 3);
    assert_eq!(step_call(2).method(&BOOK), "ship");
    assert_eq!(comp_call(2).method(&BOOK), "unship");
    assert_eq!(comp_call(0).method(&BOOK), "release");
    assert_eq!(
        step_call(2).policy(&BOOK),
        RetryPolicy::new(1, BackoffKind::Constant, 0)
    );
    assert_eq!(
        comp_call(2).policy(&BOOK),
        RetryPolicy::new(2, BackoffKind::Exponential, 50)
    );
    assert_eq!(step_call(0).input(&BOOK, &t), json!({"input": "book"}));
    assert_eq!(step_call(2).input(&BOOK, &t), out(1));
    assert_eq!(step_call(3).input(&BOOK, &t), out(2));
    assert_eq!(
        comp_call(2).input(&BOOK, &t),
        out(2),
        "a compensation gets its step's output"
    );
    assert_eq!(comp_call(0).input(&BOOK, &t), out(0));
    assert_eq!(
        comp_call(3).input(&BOOK, &t),
        Value::Null,
        "no output yet: null"
    );
}

// -------------------------------------------------------------- success

#[test]
fn a_middle_step_succeeding_records_its_output_and_moves_on_now() {
    let mut t = fresh(&BOOK);
    let ran = run(&mut t, &BOOK, succeeded(0));
    assert_effects(&ran.transition, NextMove::Now, None, false);
    assert_eq!(t.status, T::Running);
    assert_eq!(
        statuses(&t),
        [S::Completed, S::Pending, S::Pending, S::Pending]
    );
    let rec = &t.steps[0];
    assert_eq!(rec.output, Some(out(0)));
    let done = rec.completed_at.expect("stamped").0;
    assert!((ran.t0..=ran.t1).contains(&done));
    assert_eq!((rec.attempt_count, rec.retry_base), (1, 0));
    assert_eq!(rec.error, None);
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(t.output, None);
    assert_eq!(t.finished_at, None);
    assert_eq!(
        lines(&t, 0),
        [
            sc(T::Pending, T::Running),
            on(AuditAction::StepCompleted, "reserve", Some(1)),
        ]
    );
    assert_eq!(last(&t).worker.as_deref(), Some(W));
    let next = expect_call(plan(&mut t, &BOOK, None, W));
    assert_eq!(next, step_call(1));
    assert_eq!(next.input(&BOOK, &t), out(0));
}

#[test]
fn the_last_step_succeeding_completes_the_task_behind_a_guard() {
    let mut t = completed(&BOOK, 3);
    let n = t.audit_log.len();
    let ran = run(&mut t, &BOOK, succeeded(3));
    assert_effects(&ran.transition, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Completed);
    assert_eq!(t.output, Some(out(3)));
    assert!(t.finished_at.is_some());
    assert_eq!(t.error, None);
    assert_eq!(statuses(&t), [S::Completed; 4]);
    assert_eq!(t.steps[3].output, Some(out(3)));
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::StepCompleted, "notify", Some(1)),
            sc(T::Running, T::Completed),
        ]
    );
    let guard = ran.transition.guard.unwrap();
    assert_eq!(
        guard.status,
        T::Running,
        "the guard is the task before completing"
    );
    assert_eq!(
        statuses(&guard),
        [S::Completed; 4],
        "with its step completed"
    );
    assert_eq!(guard.steps[3].output, Some(out(3)));
    assert_eq!(guard.output, None);
    assert_eq!(guard.finished_at, None);
    assert_eq!(guard.audit_log[..], t.audit_log[..t.audit_log.len() - 1]);
    assert!(matches!(plan(&mut t, &BOOK, None, W), Plan::Nothing));
}

// ------------------------------------------------- transient and backoff

#[test]
fn exponential_backoff_retries_after_200_400_800_then_exhausts() {
    let mut t = fresh(&BOOK);
    for (n, delay) in [(1, 200), (2, 400), (3, 800)] {
        let error = format!("503 #{n}");
        let ran = run(&mut t, &BOOK, transient(&error));
        assert_eq!(ran.call, step_call(0));
        assert_eq!(
            ran.attempt,
            Attempt {
                number: n,
                claim: format!("reserve:{n}")
            }
        );
        assert_effects(&ran.transition, after_ms(delay as u64), None, true);
        let rec = &t.steps[0];
        assert_eq!(rec.status, S::Pending);
        assert_eq!((rec.attempt_count, rec.retry_base), (n, 0));
        assert_eq!(rec.error.as_deref(), Some(error.as_str()));
        assert_due(rec, &ran, delay as u64);
        assert_eq!(rec.trace_id, None);
        assert_eq!(t.status, T::Running);
        assert_eq!(t.error, None);
        let entry = last(&t);
        assert_eq!(entry.error.as_deref(), Some(error.as_str()));
        assert_eq!(entry.worker.as_deref(), Some(W));
    }
    let ran = run(&mut t, &BOOK, transient("503 #4"));
    assert_eq!(ran.attempt.number, 4, "max_retries = 3: four calls");
    assert_effects(&ran.transition, NextMove::Stop, None, true);
    assert_eq!(
        t.status,
        T::Compensated,
        "nothing completed: nothing to undo"
    );
    assert!(t.finished_at.is_some());
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::Failed);
    assert_eq!(rec.attempt_count, 4);
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(rec.error.as_deref(), Some("503 #4"));
    assert_eq!(rec.trace_id.as_deref(), Some(t.trace_id.as_str()));
    assert_eq!(t.error.as_deref(), Some("step `reserve` failed: 503 #4"));
    assert_eq!(
        lines(&t, 0),
        [
            sc(T::Pending, T::Running),
            af("reserve", 1, Some(200), false),
            af("reserve", 2, Some(400), false),
            af("reserve", 3, Some(800), false),
            af("reserve", 4, None, false),
            sc(T::Running, T::Compensated),
        ]
    );
    let guard = ran.transition.guard.unwrap();
    assert_eq!(guard.status, T::Running);
    assert_eq!(guard.steps[0].status, S::Failed);
    assert_eq!(guard.error, t.error);
    assert!(matches!(plan(&mut t, &BOOK, None, W), Plan::Nothing));
}

#[test]
fn linear_backoff_retries_after_100_200_then_compensates() {
    let mut t = completed(&BOOK, 1);
    let n = t.audit_log.len();
    for (k, delay) in [(1, 100), (2, 200)] {
        let ran = run(&mut t, &BOOK, transient("busy"));
        assert_eq!(ran.attempt.claim, format!("charge:{k}"));
        assert_effects(&ran.transition, after_ms(delay), None, true);
        assert_eq!(t.steps[1].status, S::Pending);
        assert_due(&t.steps[1], &ran, delay);
    }
    let ran = run(&mut t, &BOOK, transient("busy"));
    assert_effects(&ran.transition, NextMove::Now, None, true);
    assert_eq!(t.status, T::Compensating);
    assert_eq!(t.finished_at, None);
    assert_eq!(
        statuses(&t),
        [S::Completed, S::Failed, S::Pending, S::Pending]
    );
    assert_eq!(t.steps[1].attempt_count, 3);
    assert_eq!(
        lines(&t, n),
        [
            af("charge", 1, Some(100), false),
            af("charge", 2, Some(200), false),
            af("charge", 3, None, false),
            sc(T::Running, T::Compensating),
        ]
    );
    assert_eq!(ran.transition.guard.unwrap().status, T::Running);
}

#[test]
fn constant_backoff_repeats_its_delay() {
    let mut t = fresh(&STEADY);
    for k in 1..=3 {
        let ran = run(&mut t, &STEADY, transient("x"));
        assert_eq!(ran.attempt.number, k);
        assert_effects(&ran.transition, after_ms(250), None, true);
        assert_due(&t.steps[0], &ran, 250);
    }
    let ran = run(&mut t, &STEADY, transient("x"));
    assert_effects(&ran.transition, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Compensated);
    assert_eq!(
        lines(&t, 0),
        [
            sc(T::Pending, T::Running),
            af("steady", 1, Some(250), false),
            af("steady", 2, Some(250), false),
            af("steady", 3, Some(250), false),
            af("steady", 4, None, false),
            sc(T::Running, T::Compensated),
        ]
    );
}

#[test]
fn max_delay_caps_the_exponential_backoff() {
    let mut t = fresh(&CAPPED);
    let mut nexts = Vec::new();
    for _ in 0..5 {
        nexts.push(run(&mut t, &CAPPED, transient("x")).transition.next);
    }
    assert_eq!(
        nexts,
        [
            after_ms(200),
            after_ms(400),
            after_ms(500),
            after_ms(500),
            NextMove::Stop
        ]
    );
    assert_eq!(t.status, T::Compensated);
    assert_eq!(t.steps[0].attempt_count, 5);
}

#[test]
fn exponential_backoff_follows_the_documented_schedule_up_to_3200_ms() {
    let mut t = fresh(&EXP5);
    let mut want = vec![sc(T::Pending, T::Running)];
    for (n, delay) in [(1, 200), (2, 400), (3, 800), (4, 1600), (5, 3200)] {
        let ran = run(&mut t, &EXP5, transient("x"));
        assert_eq!(
            ran.attempt,
            Attempt {
                number: n,
                claim: format!("expo:{n}")
            }
        );
        assert_effects(&ran.transition, after_ms(delay), None, true);
        let rec = &t.steps[0];
        assert_eq!(rec.status, S::Pending);
        assert_eq!((rec.attempt_count, rec.retry_base), (n, 0));
        assert_due(rec, &ran, delay);
        assert_eq!(t.status, T::Running);
        want.push(af("expo", n, Some(delay), false));
    }
    let ran = run(&mut t, &EXP5, transient("x"));
    assert_eq!(ran.attempt.number, 6, "max_retries = 5: six calls");
    assert_effects(&ran.transition, NextMove::Stop, None, true);
    want.push(af("expo", 6, None, false));
    want.push(sc(T::Running, T::Compensated));
    assert_eq!(lines(&t, 0), want);
    assert_eq!(t.status, T::Compensated);
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::Failed);
    assert_eq!(rec.attempt_count, 6);
    assert_eq!(rec.next_attempt_at, None);
}

#[test]
fn linear_backoff_grows_by_its_base_each_retry() {
    let mut t = fresh(&LIN4);
    let mut want = vec![sc(T::Pending, T::Running)];
    for (n, delay) in [(1, 200), (2, 400), (3, 600), (4, 800)] {
        let ran = run(&mut t, &LIN4, transient("x"));
        assert_eq!(ran.attempt.claim, format!("linear:{n}"));
        assert_effects(&ran.transition, after_ms(delay), None, true);
        assert_eq!(t.steps[0].status, S::Pending);
        assert_eq!(t.steps[0].attempt_count, n);
        assert_due(&t.steps[0], &ran, delay);
        want.push(af("linear", n, Some(delay), false));
    }
    let ran = run(&mut t, &LIN4, transient("x"));
    assert_eq!(ran.attempt.number, 5, "max_retries = 4: five calls");
    assert_effects(&ran.transition, NextMove::Stop, None, true);
    want.push(af("linear", 5, None, false));
    want.push(sc(T::Running, T::Compensated));
    assert_eq!(lines(&t, 0), want);
    assert_eq!(t.steps[0].status, S::Failed);
}

#[test]
fn jittered_delays_stay_between_half_and_full_and_agree_with_audit_and_due_time() {
    let mut t = fresh(&JITTER);
    for n in 1..=3 {
        let ran = run(&mut t, &JITTER, transient("x"));
        let NextMove::After(d) = ran.transition.next else {
            panic!("expected a delayed retry, got {:?}", ran.transition.next)
        };
        assert!(d >= ms(500) && d <= ms(1000), "jittered delay {d:?}");
        assert!(ran.transition.guard.is_some());
        assert_eq!(ran.transition.dead_letter, None);
        let d_ms = d.as_millis() as u64;
        assert_eq!(
            lines(&t, t.audit_log.len() - 1),
            [af("jittery", n, Some(d_ms), false)]
        );
        assert_eq!(t.steps[0].status, S::Pending);
        assert_due(&t.steps[0], &ran, d_ms);
    }
    let ran = run(&mut t, &JITTER, transient("x"));
    assert_effects(&ran.transition, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Compensated);
    assert_eq!(t.steps[0].attempt_count, 4);
}

#[test]
fn a_zero_delay_retry_is_due_now() {
    let mut t = completed(&BOOK, 2);
    let n = t.audit_log.len();
    let ran = run(&mut t, &BOOK, transient("flap"));
    assert_effects(&ran.transition, NextMove::Now, None, false);
    let rec = &t.steps[2];
    assert_eq!(rec.status, S::Pending);
    assert_due(rec, &ran, 0);
    assert_eq!(lines(&t, n), [af("ship", 1, Some(0), false)]);
    // The one retry fails too: ship is not undone (it never completed), so
    // compensation starts with reserve, skipping charge.
    let ran = run(&mut t, &BOOK, transient("flap"));
    assert_effects(&ran.transition, NextMove::Now, None, true);
    assert_eq!(t.status, T::Compensating);
    assert_eq!(
        statuses(&t),
        [S::Completed, S::Completed, S::Failed, S::Pending]
    );
    assert_eq!(expect_call(plan(&mut t, &BOOK, None, W)), comp_call(0));
}

#[test]
fn a_retry_records_the_next_attempt_number_and_clears_the_due_time() {
    let mut t = fresh(&BOOK);
    run(&mut t, &BOOK, transient("x"));
    let started = t.steps[0].started_at;
    assert!(t.steps[0].next_attempt_at.is_some());
    let before = t.clone();
    let call = expect_call(plan(&mut t, &BOOK, None, W));
    assert_eq!(call, step_call(0));
    assert_eq!(t, before, "a step waiting for its retry is not abandoned");
    let n = t.audit_log.len();
    let attempt = record_attempt(&mut t, &BOOK, call);
    assert_eq!(
        attempt,
        Attempt {
            number: 2,
            claim: "reserve:2".into()
        }
    );
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::Running);
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(rec.started_at, started, "started_at is the first attempt's");
    assert!(lines(&t, n).is_empty(), "already running: no status change");
    let e = on_outcome(&mut t, &BOOK, call, succeeded(0), W);
    assert_effects(&e, NextMove::Now, None, false);
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::Completed);
    assert_eq!(rec.attempt_count, 2);
    // The last failure's error is kept for the record.
    assert_eq!(rec.error.as_deref(), Some("x"));
    assert_eq!(
        lines(&t, n),
        [on(AuditAction::StepCompleted, "reserve", Some(2))]
    );
}

// ------------------------------------------------------------ exhaustion

#[test]
fn exhausted_compensate_moves_to_compensating_when_a_completed_step_has_a_compensation() {
    let mut t = completed(&BOOK, 3);
    let n = t.audit_log.len();
    let ran = run(&mut t, &BOOK, transient("timeout"));
    assert_effects(&ran.transition, after_ms(500), None, true);
    let ran = run(&mut t, &BOOK, transient("timeout again"));
    assert_effects(&ran.transition, NextMove::Now, None, true);
    assert_eq!(t.status, T::Compensating);
    assert_eq!(
        statuses(&t),
        [S::Completed, S::Completed, S::Completed, S::Failed]
    );
    assert_eq!(
        t.error.as_deref(),
        Some("step `notify` failed: timeout again")
    );
    assert_eq!(t.steps[3].trace_id.as_deref(), Some(t.trace_id.as_str()));
    assert_eq!(
        lines(&t, n),
        [
            af("notify", 1, Some(500), false),
            af("notify", 2, None, false),
            sc(T::Running, T::Compensating),
        ]
    );
    let guard = ran.transition.guard.unwrap();
    assert_eq!(guard.status, T::Running);
    assert_eq!(guard.steps[3].status, S::Failed);
    assert_eq!(guard.cancelled_at, None);
    // The failed step has nothing to undo: ship's compensation is next.
    assert_eq!(expect_call(plan(&mut t, &BOOK, None, W)), comp_call(2));
}

#[test]
fn exhausted_compensate_with_nothing_compensable_ends_compensated_at_once() {
    let mut t = completed(&BARE, 1);
    let n = t.audit_log.len();
    let ran = run(&mut t, &BARE, transient("x"));
    assert_effects(&ran.transition, NextMove::Now, None, false);
    let ran = run(&mut t, &BARE, transient("y"));
    assert_effects(&ran.transition, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Compensated);
    assert!(t.finished_at.is_some());
    assert_eq!(statuses(&t), [S::Completed, S::Failed]);
    assert_eq!(t.error.as_deref(), Some("step `flaky` failed: y"));
    assert_eq!(
        lines(&t, n),
        [
            af("flaky", 1, Some(0), false),
            af("flaky", 2, None, false),
            sc(T::Running, T::Compensated),
        ]
    );
    assert!(matches!(plan(&mut t, &BARE, None, W), Plan::Nothing));
}

#[test]
fn exhausted_fail_ends_failed_without_compensating() {
    let mut t = completed(&FAIL2, 1);
    let n = t.audit_log.len();
    let ran = run(&mut t, &FAIL2, transient("x"));
    assert_effects(&ran.transition, after_ms(100), None, true);
    assert_due(&t.steps[1], &ran, 100);
    let ran = run(&mut t, &FAIL2, transient("y"));
    assert_effects(&ran.transition, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Failed);
    assert!(t.finished_at.is_some());
    assert_eq!(
        statuses(&t),
        [S::Completed, S::Failed],
        "the completed step is not compensated"
    );
    assert_eq!(t.steps[1].attempt_count, 2, "max_retries = 1: two calls");
    assert_eq!(t.steps[1].next_attempt_at, None);
    assert_eq!(t.steps[1].trace_id.as_deref(), Some(t.trace_id.as_str()));
    assert_eq!(t.error.as_deref(), Some("step `second` failed: y"));
    assert_eq!(
        lines(&t, n),
        [
            af("second", 1, Some(100), false),
            af("second", 2, None, false),
            sc(T::Running, T::Failed),
        ]
    );
    let guard = ran.transition.guard.unwrap();
    assert_eq!(guard.status, T::Running);
    assert_eq!(guard.steps[1].status, S::Failed);
    assert!(matches!(plan(&mut t, &FAIL2, None, W), Plan::Nothing));
}

#[test]
fn exhausted_dead_letter_parks_the_task_with_its_reason() {
    let mut t = completed(&PARK2, 1);
    let n = t.audit_log.len();
    for _ in 0..2 {
        let ran = run(&mut t, &PARK2, transient("down"));
        assert_effects(&ran.transition, after_ms(100), None, true);
    }
    let ran = run(&mut t, &PARK2, transient("down"));
    let reason = "saga `park-two` step `second`: down";
    assert_effects(&ran.transition, NextMove::Stop, Some(reason), true);
    assert_eq!(t.status, T::DeadLettered);
    assert!(t.finished_at.is_some());
    assert_eq!(statuses(&t), [S::Completed, S::Failed]);
    assert_eq!(t.steps[1].attempt_count, 3);
    assert_eq!(t.error.as_deref(), Some("step `second` failed: down"));
    assert_eq!(
        lines(&t, n),
        [
            af("second", 1, Some(100), false),
            af("second", 2, Some(100), false),
            af("second", 3, None, false),
            on(AuditAction::DeadLettered, "second", None),
            sc(T::Running, T::DeadLettered),
        ]
    );
    let parked = &t.audit_log[t.audit_log.len() - 2];
    assert_eq!(parked.error.as_deref(), Some(reason));
    let guard = ran.transition.guard.unwrap();
    assert_eq!(guard.status, T::Running);
    assert!(
        guard
            .audit_log
            .iter()
            .all(|e| e.action != AuditAction::DeadLettered),
        "the guard is the task before the dead-lettering"
    );
    assert!(matches!(plan(&mut t, &PARK2, None, W), Plan::Nothing));
}

// ------------------------------------------------- permanent and invalid

#[test]
fn a_permanent_error_skips_the_remaining_retries() {
    let mut t = completed(&BOOK, 1);
    let n = t.audit_log.len();
    let ran = run(&mut t, &BOOK, permanent("card declined"));
    assert_effects(&ran.transition, NextMove::Now, None, true);
    assert_eq!(t.status, T::Compensating);
    let rec = &t.steps[1];
    assert_eq!(rec.status, S::Failed);
    assert_eq!(rec.attempt_count, 1, "two retries left, none used");
    assert_eq!(rec.error.as_deref(), Some("card declined"));
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(
        t.error.as_deref(),
        Some("step `charge` failed: card declined")
    );
    assert_eq!(
        lines(&t, n),
        [af("charge", 1, None, true), sc(T::Running, T::Compensating),]
    );

    // The same under `on_exhausted = fail`.
    let mut t = completed(&FAIL2, 1);
    let n = t.audit_log.len();
    let ran = run(&mut t, &FAIL2, permanent("no"));
    assert_effects(&ran.transition, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Failed);
    assert_eq!(t.steps[1].attempt_count, 1);
    assert_eq!(
        lines(&t, n),
        [af("second", 1, None, true), sc(T::Running, T::Failed)]
    );
}

#[test]
fn an_invalid_payload_dead_letters_whatever_on_exhausted_says() {
    // on_exhausted = compensate, with retries left.
    let mut t = completed(&BOOK, 1);
    let n = t.audit_log.len();
    let ran = run(&mut t, &BOOK, invalid("bad json"));
    let reason = "saga `book` step `charge`: bad json";
    assert_effects(&ran.transition, NextMove::Stop, Some(reason), true);
    assert_eq!(t.status, T::DeadLettered);
    assert_eq!(
        statuses(&t)[..2],
        [S::Completed, S::Failed],
        "nothing undone"
    );
    assert_eq!(t.steps[1].attempt_count, 1);
    assert_eq!(t.steps[1].error.as_deref(), Some("bad json"));
    assert_eq!(t.error.as_deref(), Some("step `charge` failed: bad json"));
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::DeadLettered, "charge", None),
            sc(T::Running, T::DeadLettered),
        ]
    );
    assert_eq!(ran.transition.guard.unwrap().status, T::Running);

    // on_exhausted = fail.
    let mut t = completed(&FAIL2, 1);
    let ran = run(&mut t, &FAIL2, invalid("bad"));
    assert_effects(
        &ran.transition,
        NextMove::Stop,
        Some("saga `fail-two` step `second`: bad"),
        true,
    );
    assert_eq!(t.status, T::DeadLettered);

    // On the first step of a fresh task.
    let mut t = fresh(&BOOK);
    let ran = run(&mut t, &BOOK, invalid("bad input"));
    assert_effects(
        &ran.transition,
        NextMove::Stop,
        Some("saga `book` step `reserve`: bad input"),
        true,
    );
    assert_eq!(t.status, T::DeadLettered);
    assert_eq!(
        lines(&t, 0),
        [
            sc(T::Pending, T::Running),
            on(AuditAction::DeadLettered, "reserve", None),
            sc(T::Running, T::DeadLettered),
        ]
    );
}

#[test]
fn a_permanent_error_under_dead_letter_parks_the_task() {
    let mut t = completed(&PARK2, 1);
    let n = t.audit_log.len();
    let ran = run(&mut t, &PARK2, permanent("gone"));
    let reason = "saga `park-two` step `second`: gone";
    assert_effects(&ran.transition, NextMove::Stop, Some(reason), true);
    assert_eq!(t.status, T::DeadLettered);
    assert!(t.finished_at.is_some());
    assert_eq!(statuses(&t), [S::Completed, S::Failed]);
    let rec = &t.steps[1];
    assert_eq!(rec.attempt_count, 1, "two retries left, none used");
    assert_eq!(rec.error.as_deref(), Some("gone"));
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(rec.trace_id.as_deref(), Some(t.trace_id.as_str()));
    assert_eq!(t.error.as_deref(), Some("step `second` failed: gone"));
    assert_eq!(
        lines(&t, n),
        [
            af("second", 1, None, true),
            on(AuditAction::DeadLettered, "second", None),
            sc(T::Running, T::DeadLettered),
        ]
    );
    assert_eq!(t.audit_log[n + 1].error.as_deref(), Some(reason));
    let guard = ran.transition.guard.unwrap();
    assert_eq!(guard.status, T::Running);
    assert_eq!(guard.steps[1].status, S::Failed);
}

// --------------------------------------------------------------- timeout

#[test]
fn a_timeout_is_a_transient_failure_that_names_the_timeout() {
    let mut t = fresh(&BOOK);
    let ran = run(
        &mut t,
        &BOOK,
        Outcome::TimedOut {
            after: Duration::from_secs(30),
            dropped: false,
        },
    );
    let error = "attempt timed out after 30s and was cancelled";
    assert_effects(&ran.transition, after_ms(200), None, true);
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::Pending);
    assert_eq!(rec.error.as_deref(), Some(error));
    assert_due(rec, &ran, 200);
    assert_eq!(
        lines(&t, 0),
        [
            sc(T::Pending, T::Running),
            af("reserve", 1, Some(200), false)
        ]
    );
    assert_eq!(last(&t).error.as_deref(), Some(error));

    let ran = run(
        &mut t,
        &BOOK,
        Outcome::TimedOut {
            after: ms(1500),
            dropped: false,
        },
    );
    assert_effects(&ran.transition, after_ms(400), None, true);
    assert_eq!(
        t.steps[0].error.as_deref(),
        Some("attempt timed out after 1s 500ms and was cancelled")
    );
}

#[test]
fn a_timeout_on_the_last_allowed_attempt_exhausts() {
    let mut t = fresh(&ONCE);
    let ran = run(
        &mut t,
        &ONCE,
        Outcome::TimedOut {
            after: ms(5000),
            dropped: false,
        },
    );
    assert_effects(&ran.transition, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Compensated);
    assert_eq!(t.steps[0].status, S::Failed);
    assert_eq!(
        t.error.as_deref(),
        Some("step `only` failed: attempt timed out after 5s and was cancelled")
    );
    assert_eq!(
        lines(&t, 0),
        [
            sc(T::Pending, T::Running),
            af("only", 1, None, false),
            sc(T::Running, T::Compensated),
        ]
    );
}

// ---------------------------------------------------------- circuit open

#[test]
fn an_open_circuit_exhausts_the_step_without_an_attempt() {
    let mut t = completed(&BOOK, 1);
    let n = t.audit_log.len();
    let call = expect_call(plan(&mut t, &BOOK, None, W));
    assert_eq!(call, step_call(1));
    let msg = "circuit breaker of `book/charge` is open";
    let e = on_outcome(&mut t, &BOOK, call, Outcome::CircuitOpen(msg.into()), W);
    assert_effects(&e, NextMove::Now, None, true);
    assert_eq!(t.status, T::Compensating);
    let rec = &t.steps[1];
    assert_eq!(rec.status, S::Failed);
    assert_eq!(rec.attempt_count, 0, "no attempt was recorded");
    assert_eq!(rec.started_at, None);
    assert_eq!(rec.error.as_deref(), Some(msg));
    assert_eq!(rec.trace_id.as_deref(), Some(t.trace_id.as_str()));
    assert_eq!(t.error, Some(format!("step `charge` failed: {msg}")));
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::CircuitOpen, "charge", None),
            sc(T::Running, T::Compensating),
        ]
    );
    assert_eq!(t.audit_log[n].error.as_deref(), Some(msg));
    assert_eq!(e.guard.unwrap().status, T::Running);
}

#[test]
fn an_open_circuit_on_a_pending_task_ends_it_at_once() {
    let mut t = fresh(&BOOK);
    let call = expect_call(plan(&mut t, &BOOK, None, W));
    let e = on_outcome(&mut t, &BOOK, call, Outcome::CircuitOpen("open".into()), W);
    assert_effects(&e, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Compensated);
    assert_eq!(t.steps[0].attempt_count, 0);
    assert_eq!(
        lines(&t, 0),
        [
            on(AuditAction::CircuitOpen, "reserve", None),
            sc(T::Pending, T::Compensated),
        ]
    );
    assert_eq!(e.guard.unwrap().status, T::Pending);
}

#[test]
fn an_open_circuit_applies_on_exhausted_fail_and_dead_letter() {
    // on_exhausted = fail.
    let mut t = completed(&FAIL2, 1);
    let n = t.audit_log.len();
    let call = expect_call(plan(&mut t, &FAIL2, None, W));
    assert_eq!(call, step_call(1));
    let e = on_outcome(&mut t, &FAIL2, call, Outcome::CircuitOpen("open".into()), W);
    assert_effects(&e, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Failed);
    assert!(t.finished_at.is_some());
    assert_eq!(statuses(&t), [S::Completed, S::Failed]);
    let rec = &t.steps[1];
    assert_eq!((rec.attempt_count, rec.retry_base), (0, 0));
    assert_eq!(rec.error.as_deref(), Some("open"));
    assert_eq!(t.error.as_deref(), Some("step `second` failed: open"));
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::CircuitOpen, "second", None),
            sc(T::Running, T::Failed),
        ]
    );
    assert_eq!(e.guard.unwrap().status, T::Running);

    // on_exhausted = dead_letter.
    let mut t = completed(&PARK2, 1);
    let n = t.audit_log.len();
    let call = expect_call(plan(&mut t, &PARK2, None, W));
    let e = on_outcome(&mut t, &PARK2, call, Outcome::CircuitOpen("open".into()), W);
    let reason = "saga `park-two` step `second`: open";
    assert_effects(&e, NextMove::Stop, Some(reason), true);
    assert_eq!(t.status, T::DeadLettered);
    assert_eq!(statuses(&t), [S::Completed, S::Failed]);
    assert_eq!(t.steps[1].attempt_count, 0);
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::CircuitOpen, "second", None),
            on(AuditAction::DeadLettered, "second", None),
            sc(T::Running, T::DeadLettered),
        ]
    );
    assert_eq!(t.audit_log[n + 1].error.as_deref(), Some(reason));
}

#[test]
fn an_open_circuit_while_a_retry_waits_fails_the_step_and_clears_its_due_time() {
    let mut t = fresh(&BOOK);
    run(&mut t, &BOOK, transient("503"));
    assert!(t.steps[0].next_attempt_at.is_some());
    let n = t.audit_log.len();
    let call = expect_call(plan(&mut t, &BOOK, None, W));
    assert_eq!(call, step_call(0));
    let e = on_outcome(&mut t, &BOOK, call, Outcome::CircuitOpen("open".into()), W);
    assert_effects(&e, NextMove::Stop, None, true);
    assert_eq!(
        t.status,
        T::Compensated,
        "nothing completed: nothing to undo"
    );
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::Failed);
    assert_eq!(rec.attempt_count, 1, "the refused call was not recorded");
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(rec.error.as_deref(), Some("open"));
    assert_eq!(rec.trace_id.as_deref(), Some(t.trace_id.as_str()));
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::CircuitOpen, "reserve", None),
            sc(T::Running, T::Compensated),
        ]
    );
    let guard = e.guard.unwrap();
    assert_eq!(guard.status, T::Running);
    assert_eq!(guard.steps[0].status, S::Failed);
    assert_eq!(guard.steps[0].next_attempt_at, None);
}

// ------------------------------------------------------- already claimed

#[test]
fn an_already_claimed_step_attempt_skips_to_the_next_number_without_spending_the_budget() {
    let mut t = fresh(&ONCE); // max_retries = 0: one real call
    let ran = run(&mut t, &ONCE, Outcome::AlreadyClaimed);
    assert_eq!(ran.attempt.claim, "only:1");
    assert_effects(&ran.transition, NextMove::Now, None, false);
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::Pending);
    assert_eq!((rec.attempt_count, rec.retry_base), (1, 1));
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(rec.error, None);
    assert_eq!(t.status, T::Running);
    assert_eq!(
        lines(&t, 0),
        [
            sc(T::Pending, T::Running),
            on(AuditAction::DuplicateAttempt, "only", Some(1)),
        ]
    );

    // The budget is intact: attempt 2 is a real call that may succeed...
    let mut ok = t.clone();
    let ran = run(&mut ok, &ONCE, succeeded(0));
    assert_eq!(ran.attempt.claim, "only:2");
    assert_effects(&ran.transition, NextMove::Stop, None, true);
    assert_eq!(ok.status, T::Completed);

    // ...or fail, and only then is the budget spent.
    let n = t.audit_log.len();
    let ran = run(&mut t, &ONCE, transient("x"));
    assert_eq!(ran.attempt.claim, "only:2");
    assert_effects(&ran.transition, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Compensated);
    assert_eq!((t.steps[0].attempt_count, t.steps[0].retry_base), (2, 1));
    assert_eq!(
        lines(&t, n),
        [af("only", 2, None, false), sc(T::Running, T::Compensated)]
    );
}

#[test]
fn an_already_claimed_attempt_keeps_the_backoff_schedule() {
    let mut t = fresh(&BOOK);
    run(&mut t, &BOOK, Outcome::AlreadyClaimed);
    let mut got = Vec::new();
    for _ in 0..4 {
        let ran = run(&mut t, &BOOK, transient("x"));
        got.push((ran.attempt.number, ran.transition.next));
    }
    assert_eq!(
        got,
        [
            (2, after_ms(200)),
            (3, after_ms(400)),
            (4, after_ms(800)),
            (5, NextMove::Stop),
        ],
        "four real calls after the skipped number"
    );
    assert_eq!(t.status, T::Compensated);
    assert_eq!(
        lines(&t, 0),
        [
            sc(T::Pending, T::Running),
            on(AuditAction::DuplicateAttempt, "reserve", Some(1)),
            af("reserve", 2, Some(200), false),
            af("reserve", 3, Some(400), false),
            af("reserve", 4, Some(800), false),
            af("reserve", 5, None, false),
            sc(T::Running, T::Compensated),
        ]
    );
}

#[test]
fn an_already_claimed_compensation_attempt_counts_as_a_failed_attempt() {
    let mut t = book_compensating();
    let n = t.audit_log.len();
    let ran = run(&mut t, &BOOK, Outcome::AlreadyClaimed);
    assert_eq!(ran.call, comp_call(2));
    assert_eq!(ran.attempt.claim, "unship:1");
    assert_effects(&ran.transition, after_ms(50), None, false);
    let error =
        "attempt 1 of `unship` was already claimed; counted as failed instead of running twice";
    let rec = &t.steps[2];
    assert_eq!(rec.status, S::Compensating);
    assert_eq!(
        (rec.compensation_attempts, rec.compensation_retry_base),
        (1, 0)
    );
    assert_eq!(rec.compensation_error.as_deref(), Some(error));
    assert_due(rec, &ran, 50);
    assert_eq!(t.status, T::Compensating);
    assert_eq!(lines(&t, n), [caf("unship", 1, Some(50))]);
    assert_eq!(last(&t).error.as_deref(), Some(error));
    // It spent the budget: the next failure waits the second delay.
    let ran = run(&mut t, &BOOK, transient("x"));
    assert_eq!(ran.attempt.claim, "unship:2");
    assert_effects(&ran.transition, after_ms(100), None, false);
}

#[test]
fn an_already_claimed_compensation_without_retries_fails_it() {
    let mut t = completed(&FAIL2, 1);
    begin_cancel(&mut t, &FAIL2, Timestamp(10));
    let n = t.audit_log.len();
    let ran = run(&mut t, &FAIL2, Outcome::AlreadyClaimed);
    assert_eq!(ran.call, comp_call(0));
    assert_effects(&ran.transition, NextMove::Stop, None, false);
    assert_eq!(t.status, T::CompensationFailed);
    assert_eq!(t.steps[0].status, S::CompensationFailed);
    assert_eq!(
        lines(&t, n),
        [
            caf("undo_first", 1, None),
            on(AuditAction::CompensationFailed, "first", Some(1)),
            sc(T::Compensating, T::CompensationFailed),
        ]
    );
}

// ---------------------------------------------------------- cancellation

#[test]
fn a_cancel_flag_on_a_pending_task_ends_it_cancelled_at_once() {
    let mut t = fresh(&BOOK);
    let at = Timestamp(1_000);
    let e = expect_commit(plan(&mut t, &BOOK, Some(at), W));
    assert_effects(&e, NextMove::Stop, None, false);
    assert_eq!(t.status, T::Cancelled);
    assert_eq!(t.cancelled_at, Some(at));
    assert!(t.finished_at.is_some());
    assert_eq!(t.error, None);
    assert_eq!(
        statuses(&t),
        [S::Pending; 4],
        "steps never run stay pending"
    );
    assert_eq!(
        lines(&t, 0),
        [
            bare(AuditAction::CancellationRequested),
            sc(T::Pending, T::Cancelled),
        ]
    );
    assert_eq!(
        t.audit_log[0].trace_id.as_deref(),
        Some(t.trace_id.as_str())
    );
    assert!(matches!(plan(&mut t, &BOOK, Some(at), W), Plan::Nothing));
}

#[test]
fn a_cancel_flag_between_steps_compensates_the_completed_steps_then_ends_cancelled() {
    let mut t = completed(&BOOK, 3);
    let n = t.audit_log.len();
    let at = Timestamp(2_000);
    let e = expect_commit(plan(&mut t, &BOOK, Some(at), W));
    assert_effects(&e, NextMove::Now, None, false);
    assert_eq!(t.status, T::Compensating);
    assert_eq!(t.cancelled_at, Some(at));
    assert_eq!(t.finished_at, None);
    assert_eq!(
        statuses(&t),
        [S::Completed, S::Completed, S::Completed, S::Pending]
    );
    assert_eq!(
        lines(&t, n),
        [
            bare(AuditAction::CancellationRequested),
            sc(T::Running, T::Compensating),
        ]
    );
    // The flag stays set while compensating; it is not applied again.
    let n = t.audit_log.len();
    let call = expect_call(plan(&mut t, &BOOK, Some(at), W));
    assert_eq!(call, comp_call(2));
    let a = record_attempt(&mut t, &BOOK, call);
    assert_eq!(a.claim, "unship:1");
    let e = on_outcome(&mut t, &BOOK, call, undone(), W);
    assert_effects(&e, NextMove::Now, None, false);
    let call = expect_call(plan(&mut t, &BOOK, Some(at), W));
    assert_eq!(call, comp_call(0), "charge has no compensation: skipped");
    assert_eq!(record_attempt(&mut t, &BOOK, call).claim, "release:1");
    let e = on_outcome(&mut t, &BOOK, call, undone(), W);
    assert_effects(&e, NextMove::Stop, None, false);
    assert_eq!(t.status, T::Cancelled);
    assert_eq!(t.cancelled_at, Some(at));
    assert!(t.finished_at.is_some());
    assert_eq!(
        statuses(&t),
        [S::Compensated, S::Completed, S::Compensated, S::Pending]
    );
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::StepCompensated, "ship", Some(1)),
            on(AuditAction::StepCompensated, "reserve", Some(1)),
            sc(T::Compensating, T::Cancelled),
        ]
    );
    assert_eq!(find(&t, &AuditAction::CancellationRequested).len(), 1);
}

#[test]
fn a_cancel_flag_while_a_step_waits_for_its_retry_fails_that_step() {
    let mut t = completed(&BOOK, 1);
    run(&mut t, &BOOK, transient("503"));
    assert!(t.steps[1].next_attempt_at.is_some());
    let n = t.audit_log.len();
    let e = expect_commit(plan(&mut t, &BOOK, Some(Timestamp(3)), W));
    assert_effects(&e, NextMove::Now, None, false);
    assert_eq!(t.status, T::Compensating);
    assert_eq!(t.cancelled_at, Some(Timestamp(3)));
    let rec = &t.steps[1];
    assert_eq!(rec.status, S::Failed);
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(rec.attempt_count, 1);
    assert_eq!(rec.error.as_deref(), Some("503"), "the real error is kept");
    assert_eq!(
        statuses(&t),
        [S::Completed, S::Failed, S::Pending, S::Pending]
    );
    assert_eq!(
        lines(&t, n),
        [
            bare(AuditAction::CancellationRequested),
            sc(T::Running, T::Compensating),
        ]
    );
    assert_eq!(expect_call(plan(&mut t, &BOOK, None, W)), comp_call(0));

    // With nothing completed before it, the task ends cancelled.
    let mut t = fresh(&BOOK);
    run(&mut t, &BOOK, transient("503"));
    let e = expect_commit(plan(&mut t, &BOOK, Some(Timestamp(3)), W));
    assert_effects(&e, NextMove::Stop, None, false);
    assert_eq!(t.status, T::Cancelled);
    assert_eq!(t.steps[0].status, S::Failed);
    assert_eq!(t.steps[0].next_attempt_at, None);
}

#[test]
fn a_cancel_flag_while_a_step_is_running_abandons_it() {
    let mut t = completed(&BOOK, 1);
    crash(&mut t, &BOOK); // charge attempt 1 is running (or its worker died)
    let n = t.audit_log.len();
    let e = expect_commit(plan(&mut t, &BOOK, Some(Timestamp(4)), W));
    assert_effects(&e, NextMove::Now, None, false);
    assert_eq!(t.status, T::Compensating);
    let rec = &t.steps[1];
    assert_eq!(rec.status, S::Failed);
    assert_eq!(rec.attempt_count, 1);
    assert_eq!(
        rec.error.as_deref(),
        Some("cancelled before the step completed")
    );
    assert_eq!(
        lines(&t, n),
        [
            bare(AuditAction::CancellationRequested),
            sc(T::Running, T::Compensating),
        ]
    );

    // On the first step: nothing to undo.
    let mut t = fresh(&BOOK);
    crash(&mut t, &BOOK);
    let e = expect_commit(plan(&mut t, &BOOK, Some(Timestamp(4)), W));
    assert_effects(&e, NextMove::Stop, None, false);
    assert_eq!(t.status, T::Cancelled);
    assert_eq!(
        statuses(&t),
        [S::Failed, S::Pending, S::Pending, S::Pending]
    );
    assert_eq!(
        lines(&t, 0),
        [
            sc(T::Pending, T::Running),
            bare(AuditAction::CancellationRequested),
            sc(T::Running, T::Cancelled),
        ]
    );
}

#[test]
fn a_step_skipped_by_a_claimed_attempt_has_not_failed_when_cancelled() {
    let mut t = completed(&BOOK, 1);
    run(&mut t, &BOOK, Outcome::AlreadyClaimed);
    assert_eq!(t.steps[1].status, S::Pending);
    expect_commit(plan(&mut t, &BOOK, Some(Timestamp(5)), W));
    assert_eq!(t.status, T::Compensating);
    assert_eq!(t.steps[1].status, S::Pending, "it never ran here");
    assert_eq!(t.steps[1].error, None);
}

#[test]
fn a_step_that_failed_then_skipped_a_claimed_number_has_failed_when_cancelled() {
    let mut t = completed(&BOOK, 1);
    run(&mut t, &BOOK, transient("503"));
    let ran = run(&mut t, &BOOK, Outcome::AlreadyClaimed);
    assert_eq!(ran.attempt.claim, "charge:2");
    let rec = &t.steps[1];
    assert_eq!(rec.status, S::Pending);
    assert_eq!((rec.attempt_count, rec.retry_base), (2, 1));
    assert_eq!(rec.next_attempt_at, None);
    let n = t.audit_log.len();
    let e = expect_commit(plan(&mut t, &BOOK, Some(Timestamp(6)), W));
    assert_effects(&e, NextMove::Now, None, false);
    assert_eq!(t.status, T::Compensating);
    assert_eq!(t.cancelled_at, Some(Timestamp(6)));
    let rec = &t.steps[1];
    assert_eq!(rec.status, S::Failed, "attempt 1 ran and failed");
    assert_eq!(rec.error.as_deref(), Some("503"));
    assert_eq!((rec.attempt_count, rec.retry_base), (2, 1));
    assert_eq!(
        lines(&t, n),
        [
            bare(AuditAction::CancellationRequested),
            sc(T::Running, T::Compensating),
        ]
    );
}

#[test]
fn a_cancel_flag_on_a_running_task_whose_steps_all_completed_undoes_them_all() {
    let mut t = completed(&BOOK, 4);
    // As if the last commit had not changed the status.
    t.status = T::Running;
    t.output = None;
    t.finished_at = None;
    let n = t.audit_log.len();
    let at = Timestamp(5);
    let e = expect_commit(plan(&mut t, &BOOK, Some(at), W));
    assert_effects(&e, NextMove::Now, None, false);
    assert_eq!(t.status, T::Compensating);
    assert_eq!(t.cancelled_at, Some(at));
    assert_eq!(t.output, None);
    assert_eq!(t.finished_at, None);
    assert_eq!(statuses(&t), [S::Completed; 4]);
    assert_eq!(
        lines(&t, n),
        [
            bare(AuditAction::CancellationRequested),
            sc(T::Running, T::Compensating),
        ]
    );
    let call = expect_call(plan(&mut t, &BOOK, Some(at), W));
    assert_eq!(call, comp_call(3));
    assert_eq!(call.method(&BOOK), "retract");
    assert_eq!(call.input(&BOOK, &t), out(3));
}

#[test]
fn a_cancelled_outcome_fails_the_step_and_begins_cancellation() {
    let mut t = completed(&BOOK, 1);
    let n = t.audit_log.len();
    let at = Timestamp(77);
    let ran = run(
        &mut t,
        &BOOK,
        Outcome::Cancelled {
            at,
            error: "render aborted".into(),
            dropped: false,
        },
    );
    assert_eq!(ran.call, step_call(1));
    assert_effects(&ran.transition, NextMove::Now, None, false);
    assert_eq!(t.status, T::Compensating);
    assert_eq!(t.cancelled_at, Some(at));
    let rec = &t.steps[1];
    assert_eq!(rec.status, S::Failed);
    assert_eq!(rec.attempt_count, 1);
    assert_eq!(rec.error.as_deref(), Some("cancelled: render aborted"));
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(t.error, None, "a cancellation is not a failure");
    assert_eq!(
        lines(&t, n),
        [
            af("charge", 1, None, true),
            bare(AuditAction::CancellationRequested),
            sc(T::Running, T::Compensating),
        ]
    );
    assert_eq!(
        t.audit_log[n].error.as_deref(),
        Some("cancelled: render aborted")
    );
    // Compensation then ends the task Cancelled.
    let ran = run(&mut t, &BOOK, undone());
    assert_eq!(ran.call, comp_call(0));
    assert_effects(&ran.transition, NextMove::Stop, None, false);
    assert_eq!(t.status, T::Cancelled);
}

#[test]
fn a_cancelled_outcome_on_the_first_step_ends_cancelled() {
    let mut t = fresh(&BOOK);
    let ran = run(
        &mut t,
        &BOOK,
        Outcome::Cancelled {
            at: Timestamp(9),
            error: "stopped".into(),
            dropped: false,
        },
    );
    assert_effects(&ran.transition, NextMove::Stop, None, false);
    assert_eq!(t.status, T::Cancelled);
    assert_eq!(t.cancelled_at, Some(Timestamp(9)));
    assert_eq!(
        lines(&t, 0),
        [
            sc(T::Pending, T::Running),
            af("reserve", 1, None, true),
            bare(AuditAction::CancellationRequested),
            sc(T::Running, T::Cancelled),
        ]
    );
}

#[test]
fn plan_does_not_begin_cancellation_once_cancelled_at_is_set() {
    let mut t = completed(&BOOK, 1);
    expect_commit(plan(&mut t, &BOOK, Some(Timestamp(1)), W));
    let before = t.clone();
    let call = expect_call(plan(&mut t, &BOOK, Some(Timestamp(2)), W));
    assert_eq!(call, comp_call(0));
    assert_eq!(
        t, before,
        "no second CancellationRequested, same cancelled_at"
    );
    assert_eq!(t.cancelled_at, Some(Timestamp(1)));
}

#[test]
fn plan_does_not_cancel_a_task_compensating_after_a_failure() {
    let mut t = book_compensating();
    let before = t.clone();
    let call = expect_call(plan(&mut t, &BOOK, Some(Timestamp(9)), W));
    assert_eq!(call, comp_call(2));
    assert_eq!(t, before);
    assert_eq!(t.cancelled_at, None);
    // It ends Compensated, not Cancelled.
    run(&mut t, &BOOK, undone());
    let call = expect_call(plan(&mut t, &BOOK, Some(Timestamp(9)), W));
    record_attempt(&mut t, &BOOK, call);
    on_outcome(&mut t, &BOOK, call, undone(), W);
    assert_eq!(t.status, T::Compensated);
    assert!(find(&t, &AuditAction::CancellationRequested).is_empty());
}

// -------------------------------------------------------- crash recovery

#[test]
fn a_step_found_running_is_abandoned_and_counts_against_its_budget() {
    let mut t = fresh(&BOOK);
    crash(&mut t, &BOOK);
    let n = t.audit_log.len();
    let call = expect_call(plan(&mut t, &BOOK, None, W2));
    assert_eq!(call, step_call(0));
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::Pending);
    assert_eq!((rec.attempt_count, rec.retry_base), (1, 0));
    assert_eq!(rec.error, Some(abandoned_error(1)));
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(t.status, T::Running);
    assert_eq!(
        lines(&t, n),
        [on(AuditAction::AttemptAbandoned, "reserve", Some(1))]
    );
    let entry = last(&t);
    assert_eq!(entry.error, Some(abandoned_error(1)));
    assert_eq!(
        entry.worker.as_deref(),
        Some(W2),
        "the worker that found it"
    );
    assert_eq!(record_attempt(&mut t, &BOOK, call).claim, "reserve:2");
    // The abandoned attempt used the first retry: this failure waits the
    // second delay.
    let e = on_outcome(&mut t, &BOOK, call, transient("x"), W);
    assert_effects(&e, after_ms(400), None, true);
}

#[test]
fn an_abandoned_last_allowed_attempt_exhausts_the_step() {
    let mut t = fresh(&ONCE);
    crash(&mut t, &ONCE);
    let e = expect_commit(plan(&mut t, &ONCE, None, W2));
    assert_effects(&e, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Compensated);
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::Failed);
    assert_eq!(rec.attempt_count, 1);
    assert_eq!(rec.error, Some(abandoned_error(1)));
    assert_eq!(rec.trace_id.as_deref(), Some(t.trace_id.as_str()));
    assert_eq!(
        t.error,
        Some(format!("step `only` failed: {}", abandoned_error(1)))
    );
    assert_eq!(
        lines(&t, 0),
        [
            sc(T::Pending, T::Running),
            on(AuditAction::AttemptAbandoned, "only", Some(1)),
            sc(T::Running, T::Compensated),
        ]
    );
    let guard = e.guard.unwrap();
    assert_eq!(guard.status, T::Running);
    assert_eq!(guard.steps[0].status, S::Failed);

    // Under `on_exhausted = fail`, after its two calls both died.
    let mut t = completed(&FAIL2, 1);
    crash(&mut t, &FAIL2);
    crash(&mut t, &FAIL2);
    let n = t.audit_log.len();
    let e = expect_commit(plan(&mut t, &FAIL2, None, W));
    assert_effects(&e, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Failed);
    assert_eq!(statuses(&t), [S::Completed, S::Failed]);
    assert_eq!(t.steps[1].error, Some(abandoned_error(2)));
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::AttemptAbandoned, "second", Some(2)),
            sc(T::Running, T::Failed),
        ]
    );
    assert_eq!(find(&t, &AuditAction::AttemptAbandoned).len(), 2);

    // Under `on_exhausted = dead_letter`.
    let mut t = completed(&PARK2, 1);
    for _ in 0..3 {
        crash(&mut t, &PARK2);
    }
    let e = expect_commit(plan(&mut t, &PARK2, None, W));
    let reason = format!("saga `park-two` step `second`: {}", abandoned_error(3));
    assert_effects(&e, NextMove::Stop, Some(&reason), true);
    assert_eq!(t.status, T::DeadLettered);
}

#[test]
fn an_abandoned_attempt_after_a_skipped_number_exhausts_a_single_call_budget() {
    let mut t = fresh(&ONCE);
    run(&mut t, &ONCE, Outcome::AlreadyClaimed); // only:1 ran elsewhere
    let (call, a) = crash(&mut t, &ONCE); // only:2, the one real call, dies
    assert_eq!((call, a.claim.as_str()), (step_call(0), "only:2"));
    let n = t.audit_log.len();
    let e = expect_commit(plan(&mut t, &ONCE, None, W2));
    assert_effects(&e, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Compensated);
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::Failed);
    assert_eq!((rec.attempt_count, rec.retry_base), (2, 1));
    assert_eq!(rec.error, Some(abandoned_error(2)));
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(
        t.error,
        Some(format!("step `only` failed: {}", abandoned_error(2)))
    );
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::AttemptAbandoned, "only", Some(2)),
            sc(T::Running, T::Compensated),
        ]
    );
    assert_eq!(t.audit_log[n].worker.as_deref(), Some(W2));
    let guard = e.guard.unwrap();
    assert_eq!(guard.status, T::Running);
    assert_eq!(guard.steps[0].status, S::Failed);
}

#[test]
fn a_compensation_found_compensating_is_abandoned_and_retried() {
    let mut t = book_compensating();
    crash(&mut t, &BOOK);
    assert_eq!(t.steps[2].status, S::Compensating);
    let n = t.audit_log.len();
    let call = expect_call(plan(&mut t, &BOOK, None, W2));
    assert_eq!(call, comp_call(2));
    let rec = &t.steps[2];
    assert_eq!(rec.status, S::Compensating);
    assert_eq!(
        (rec.compensation_attempts, rec.compensation_retry_base),
        (1, 0)
    );
    assert_eq!(rec.compensation_error, Some(abandoned_error(1)));
    assert_eq!(rec.error, None, "the step's own error is untouched");
    assert_eq!(t.status, T::Compensating);
    assert_eq!(
        lines(&t, n),
        [on(AuditAction::AttemptAbandoned, "unship", Some(1))]
    );
    assert_eq!(last(&t).worker.as_deref(), Some(W2));
    assert_eq!(record_attempt(&mut t, &BOOK, call).claim, "unship:2");
    let e = on_outcome(&mut t, &BOOK, call, transient("x"), W);
    assert_effects(&e, after_ms(100), None, false);
}

#[test]
fn an_abandoned_last_compensation_attempt_fails_the_compensation() {
    let mut t = completed(&FAIL2, 1);
    begin_cancel(&mut t, &FAIL2, Timestamp(1));
    crash(&mut t, &FAIL2); // undo_first attempt 1, its only one
    let n = t.audit_log.len();
    let e = expect_commit(plan(&mut t, &FAIL2, None, W2));
    assert_effects(&e, NextMove::Stop, None, false);
    assert_eq!(t.status, T::CompensationFailed);
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::CompensationFailed);
    assert_eq!(rec.compensation_error, Some(abandoned_error(1)));
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(
        t.error,
        Some(format!(
            "compensation of step `first` failed: {}",
            abandoned_error(1)
        ))
    );
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::AttemptAbandoned, "undo_first", Some(1)),
            on(AuditAction::CompensationFailed, "first", Some(1)),
            sc(T::Compensating, T::CompensationFailed),
        ]
    );

    // BOOK's unship allows three calls.
    let mut t = book_compensating();
    for k in 1..=3 {
        let (call, a) = crash(&mut t, &BOOK);
        assert_eq!((call, a.number), (comp_call(2), k));
    }
    let e = expect_commit(plan(&mut t, &BOOK, None, W));
    assert_effects(&e, NextMove::Stop, None, false);
    assert_eq!(t.status, T::CompensationFailed);
    assert_eq!(t.steps[2].compensation_error, Some(abandoned_error(3)));
    assert_eq!(find(&t, &AuditAction::AttemptAbandoned).len(), 3);
    assert_eq!(t.steps[0].status, S::Completed, "reserve is left as it is");
}

#[test]
fn a_compensation_waiting_for_its_retry_is_not_abandoned() {
    let mut t = book_compensating();
    run(&mut t, &BOOK, transient("x"));
    let before = t.clone();
    assert_eq!(expect_call(plan(&mut t, &BOOK, None, W)), comp_call(2));
    assert_eq!(t, before);
}

// ---------------------------------------------------------- compensation

#[test]
fn compensation_runs_in_reverse_over_completed_steps_that_have_one() {
    let mut t = book_compensating();
    assert_eq!(
        t.error.as_deref(),
        Some("step `notify` failed: webhook gone")
    );
    let n = t.audit_log.len();
    let call = expect_call(plan(&mut t, &BOOK, None, W));
    assert_eq!(call, comp_call(2), "notify failed: ship is undone first");
    assert_eq!(call.input(&BOOK, &t), out(2));
    let a = record_attempt(&mut t, &BOOK, call);
    assert_eq!(
        a,
        Attempt {
            number: 1,
            claim: "unship:1".into()
        }
    );
    let rec = &t.steps[2];
    assert_eq!(rec.status, S::Compensating);
    assert_eq!((rec.attempt_count, rec.compensation_attempts), (1, 1));
    assert!(lines(&t, n).is_empty(), "no status change");
    let e = on_outcome(&mut t, &BOOK, call, undone(), W);
    assert_effects(&e, NextMove::Now, None, false);
    assert_eq!(t.status, T::Compensating);
    assert_eq!(
        statuses(&t),
        [S::Completed, S::Completed, S::Compensated, S::Failed]
    );
    assert_eq!(
        t.steps[2].output,
        Some(out(2)),
        "the output stays on record"
    );
    let call = expect_call(plan(&mut t, &BOOK, None, W));
    assert_eq!(call, comp_call(0), "charge has no compensation: skipped");
    assert_eq!(call.input(&BOOK, &t), out(0));
    assert_eq!(record_attempt(&mut t, &BOOK, call).claim, "release:1");
    let e = on_outcome(&mut t, &BOOK, call, undone(), W);
    assert_effects(&e, NextMove::Stop, None, false);
    assert_eq!(t.status, T::Compensated);
    assert!(t.finished_at.is_some());
    assert_eq!(
        statuses(&t),
        [S::Compensated, S::Completed, S::Compensated, S::Failed]
    );
    assert_eq!(
        t.error.as_deref(),
        Some("step `notify` failed: webhook gone"),
        "the failure that caused the compensation stays on record"
    );
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::StepCompensated, "ship", Some(1)),
            on(AuditAction::StepCompensated, "reserve", Some(1)),
            sc(T::Compensating, T::Compensated),
        ]
    );
    assert!(t.audit_log[n..]
        .iter()
        .take(2)
        .all(|e| e.worker.as_deref() == Some(W)));
    assert!(matches!(plan(&mut t, &BOOK, None, W), Plan::Nothing));
}

#[test]
fn compensations_retry_on_their_own_policy() {
    let mut t = book_compensating();
    let n = t.audit_log.len();
    // unship: exponential 50 ms (ship itself: constant 0 ms).
    for (k, delay) in [(1, 50), (2, 100)] {
        let ran = run(&mut t, &BOOK, transient(&format!("locked #{k}")));
        assert_eq!(ran.attempt.claim, format!("unship:{k}"));
        assert_effects(&ran.transition, after_ms(delay), None, false);
        let rec = &t.steps[2];
        assert_eq!(rec.status, S::Compensating);
        assert_eq!(rec.compensation_attempts, k);
        assert_eq!(rec.compensation_error, Some(format!("locked #{k}")));
        assert_due(rec, &ran, delay);
        assert_eq!(t.status, T::Compensating);
    }
    let ran = run(&mut t, &BOOK, undone());
    assert_eq!(ran.attempt.claim, "unship:3");
    assert_effects(&ran.transition, NextMove::Now, None, false);
    assert_eq!(t.steps[2].status, S::Compensated);
    // release: constant 1000 ms.
    for k in 1..=2 {
        let ran = run(&mut t, &BOOK, transient("x"));
        assert_eq!(ran.attempt.claim, format!("release:{k}"));
        assert_effects(&ran.transition, after_ms(1000), None, false);
        assert_due(&t.steps[0], &ran, 1000);
    }
    let ran = run(&mut t, &BOOK, undone());
    assert_effects(&ran.transition, NextMove::Stop, None, false);
    assert_eq!(t.status, T::Compensated);
    assert_eq!(
        lines(&t, n),
        [
            caf("unship", 1, Some(50)),
            caf("unship", 2, Some(100)),
            on(AuditAction::StepCompensated, "ship", Some(3)),
            caf("release", 1, Some(1000)),
            caf("release", 2, Some(1000)),
            on(AuditAction::StepCompensated, "reserve", Some(3)),
            sc(T::Compensating, T::Compensated),
        ]
    );
}

#[test]
fn an_exhausted_compensation_fails_the_task_with_everything_recorded() {
    let mut t = book_compensating();
    let n = t.audit_log.len();
    let mut nexts = Vec::new();
    for k in 1..=3 {
        let ran = run(&mut t, &BOOK, transient(&format!("bucket locked #{k}")));
        nexts.push(ran.transition.next);
        if k == 3 {
            assert_effects(&ran.transition, NextMove::Stop, None, false);
        }
    }
    assert_eq!(nexts, [after_ms(50), after_ms(100), NextMove::Stop]);
    assert_eq!(t.status, T::CompensationFailed);
    assert!(t.finished_at.is_some());
    let rec = &t.steps[2];
    assert_eq!(rec.status, S::CompensationFailed);
    assert_eq!(rec.compensation_error.as_deref(), Some("bucket locked #3"));
    assert_eq!(rec.compensation_attempts, 3);
    assert_eq!(rec.attempt_count, 1);
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(rec.trace_id.as_deref(), Some(t.trace_id.as_str()));
    assert_eq!(
        statuses(&t),
        [S::Completed, S::Completed, S::CompensationFailed, S::Failed],
        "nothing after the failed compensation is undone"
    );
    assert_eq!(
        t.error.as_deref(),
        Some("compensation of step `ship` failed: bucket locked #3")
    );
    assert_eq!(
        lines(&t, n),
        [
            caf("unship", 1, Some(50)),
            caf("unship", 2, Some(100)),
            caf("unship", 3, None),
            on(AuditAction::CompensationFailed, "ship", Some(3)),
            sc(T::Compensating, T::CompensationFailed),
        ]
    );
    let entry = &t.audit_log[t.audit_log.len() - 2];
    assert_eq!(entry.error.as_deref(), Some("bucket locked #3"));
    assert_eq!(entry.trace_id.as_deref(), Some(t.trace_id.as_str()));
    let details: Value = serde_json::from_str(entry.details.as_deref().unwrap()).unwrap();
    assert_eq!(
        details,
        json!({
            "step": "ship",
            "error": "bucket locked #3",
            "trace_id": t.trace_id,
            "attempt_count": 1,
            "compensation_attempts": 3,
        })
    );
    assert!(matches!(plan(&mut t, &BOOK, None, W), Plan::Nothing));
}

#[test]
fn a_permanent_or_invalid_compensation_error_fails_at_once() {
    for (outcome, error) in [
        (permanent("gone"), "gone"),
        (invalid("bad output"), "bad output"),
    ] {
        let mut t = book_compensating();
        let n = t.audit_log.len();
        let ran = run(&mut t, &BOOK, outcome);
        assert_effects(&ran.transition, NextMove::Stop, None, false);
        assert_eq!(t.status, T::CompensationFailed);
        let rec = &t.steps[2];
        assert_eq!(rec.status, S::CompensationFailed);
        assert_eq!(rec.compensation_attempts, 1, "two retries left, none used");
        assert_eq!(rec.compensation_error.as_deref(), Some(error));
        assert_eq!(
            lines(&t, n),
            [
                caf("unship", 1, None),
                on(AuditAction::CompensationFailed, "ship", Some(1)),
                sc(T::Compensating, T::CompensationFailed),
            ]
        );
    }
}

#[test]
fn a_compensation_timing_out_on_its_last_attempt_fails_it() {
    let mut t = completed(&FAIL2, 1);
    begin_cancel(&mut t, &FAIL2, Timestamp(2));
    assert_eq!(t.status, T::Compensating);
    let n = t.audit_log.len();
    let ran = run(
        &mut t,
        &FAIL2,
        Outcome::TimedOut {
            after: ms(250),
            dropped: false,
        },
    );
    assert_eq!(ran.call, comp_call(0));
    assert_eq!(ran.attempt.claim, "undo_first:1");
    let error = "attempt timed out after 250ms and was cancelled";
    assert_effects(&ran.transition, NextMove::Stop, None, false);
    assert_eq!(t.status, T::CompensationFailed);
    assert!(t.finished_at.is_some());
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::CompensationFailed);
    assert_eq!(rec.compensation_error.as_deref(), Some(error));
    assert_eq!(rec.compensation_attempts, 1);
    assert_eq!(rec.next_attempt_at, None);
    assert_eq!(rec.trace_id.as_deref(), Some(t.trace_id.as_str()));
    assert_eq!(
        t.error,
        Some(format!("compensation of step `first` failed: {error}"))
    );
    assert_eq!(
        lines(&t, n),
        [
            caf("undo_first", 1, None),
            on(AuditAction::CompensationFailed, "first", Some(1)),
            sc(T::Compensating, T::CompensationFailed),
        ]
    );
    let entry = &t.audit_log[n + 1];
    let details: Value = serde_json::from_str(entry.details.as_deref().unwrap()).unwrap();
    assert_eq!(
        details,
        json!({
            "step": "first",
            "error": error,
            "trace_id": t.trace_id,
            "attempt_count": 1,
            "compensation_attempts": 1,
        })
    );
}

#[test]
fn a_zero_delay_compensation_retry_is_due_now_and_not_taken_for_abandoned() {
    let mut t = completed(&ZERO_UNDO, 1);
    let ran = run(&mut t, &ZERO_UNDO, permanent("no"));
    assert_effects(&ran.transition, NextMove::Now, None, true);
    assert_eq!(t.status, T::Compensating);
    let n = t.audit_log.len();
    let ran = run(&mut t, &ZERO_UNDO, transient("busy"));
    assert_eq!(ran.call, comp_call(0));
    assert_eq!(ran.attempt.claim, "unmake:1");
    assert_effects(&ran.transition, NextMove::Now, None, false);
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::Compensating);
    assert_eq!(rec.compensation_attempts, 1);
    assert_eq!(rec.compensation_error.as_deref(), Some("busy"));
    assert_due(rec, &ran, 0);
    let before = t.clone();
    let call = expect_call(plan(&mut t, &ZERO_UNDO, None, W2));
    assert_eq!(call, comp_call(0));
    assert_eq!(t, before, "a due retry is not an abandoned attempt");
    assert_eq!(record_attempt(&mut t, &ZERO_UNDO, call).claim, "unmake:2");
    assert_eq!(t.steps[0].next_attempt_at, None);
    let e = on_outcome(&mut t, &ZERO_UNDO, call, transient("busy"), W);
    assert_effects(&e, NextMove::Stop, None, false);
    assert_eq!(t.status, T::CompensationFailed);
    assert_eq!(statuses(&t), [S::CompensationFailed, S::Failed]);
    assert_eq!(
        lines(&t, n),
        [
            caf("unmake", 1, Some(0)),
            caf("unmake", 2, None),
            on(AuditAction::CompensationFailed, "make", Some(2)),
            sc(T::Compensating, T::CompensationFailed),
        ]
    );
}

#[test]
fn a_timed_out_compensation_is_retried() {
    let mut t = book_compensating();
    let n = t.audit_log.len();
    let ran = run(
        &mut t,
        &BOOK,
        Outcome::TimedOut {
            after: ms(2000),
            dropped: false,
        },
    );
    assert_effects(&ran.transition, after_ms(50), None, false);
    let error = "attempt timed out after 2s and was cancelled";
    assert_eq!(t.steps[2].compensation_error.as_deref(), Some(error));
    assert_eq!(lines(&t, n), [caf("unship", 1, Some(50))]);
    assert_eq!(last(&t).error.as_deref(), Some(error));
}

#[test]
fn cancelled_and_circuit_open_compensation_outcomes_count_as_transient_failures() {
    let mut t = book_compensating();
    let n = t.audit_log.len();
    let ran = run(
        &mut t,
        &BOOK,
        Outcome::Cancelled {
            at: Timestamp(1),
            error: "stopped".into(),
            dropped: false,
        },
    );
    assert_effects(&ran.transition, after_ms(50), None, false);
    assert_eq!(t.steps[2].compensation_error.as_deref(), Some("stopped"));
    assert_eq!(
        t.cancelled_at, None,
        "a compensation does not begin a cancellation"
    );
    let ran = run(&mut t, &BOOK, Outcome::CircuitOpen("open".into()));
    assert_effects(&ran.transition, after_ms(100), None, false);
    assert_eq!(t.steps[2].compensation_error.as_deref(), Some("open"));
    assert_eq!(
        lines(&t, n),
        [caf("unship", 1, Some(50)), caf("unship", 2, Some(100))]
    );
}

#[test]
fn a_compensation_retry_base_gives_a_fresh_budget() {
    let mut t = book_compensating();
    run(&mut t, &BOOK, transient("x")); // unship:1, waits 50 ms
    crash(&mut t, &BOOK); // unship:2 keeps killing its worker
    poisoned(&mut t, &BOOK, 5);
    assert_eq!(t.status, T::DeadLettered);
    // What an operator's requeue does.
    t.steps[2].compensation_retry_base = t.steps[2].compensation_attempts;
    t.error = None;
    t.set_status(T::Compensating);
    let n = t.audit_log.len();
    let call = expect_call(plan(&mut t, &BOOK, None, W));
    assert_eq!(call, comp_call(2));
    assert_eq!(
        lines(&t, n),
        [on(AuditAction::AttemptAbandoned, "unship", Some(2))],
        "the poisoned attempt never reported back; it does not use the new budget"
    );
    record_attempt(&mut t, &BOOK, call);
    let e = on_outcome(&mut t, &BOOK, call, transient("x"), W);
    assert_effects(&e, after_ms(50), None, false);
    let mut got = Vec::new();
    for _ in 0..2 {
        let ran = run(&mut t, &BOOK, transient("x"));
        got.push((ran.attempt.claim, ran.transition.next));
    }
    assert_eq!(
        got,
        [
            ("unship:4".to_owned(), after_ms(100)),
            ("unship:5".to_owned(), NextMove::Stop),
        ]
    );
    assert_eq!(t.status, T::CompensationFailed);
    assert_eq!(
        (
            t.steps[2].compensation_attempts,
            t.steps[2].compensation_retry_base
        ),
        (5, 2)
    );
}

#[test]
fn a_step_retry_base_gives_a_fresh_budget() {
    let mut t = completed(&PARK2, 1);
    for _ in 0..3 {
        run(&mut t, &PARK2, transient("down"));
    }
    assert_eq!(t.status, T::DeadLettered);
    // What an operator's requeue does.
    t.steps[1].status = S::Pending;
    t.steps[1].retry_base = t.steps[1].attempt_count;
    t.error = None;
    t.set_status(T::Running);
    let mut got = Vec::new();
    for _ in 0..3 {
        let ran = run(&mut t, &PARK2, transient("down"));
        got.push((ran.attempt.claim, ran.transition.next));
    }
    assert_eq!(
        got,
        [
            ("second:4".to_owned(), after_ms(100)),
            ("second:5".to_owned(), after_ms(100)),
            ("second:6".to_owned(), NextMove::Stop),
        ]
    );
    assert_eq!(t.status, T::DeadLettered);
    assert_eq!((t.steps[1].attempt_count, t.steps[1].retry_base), (6, 3));
}

#[test]
fn compensating_with_nothing_left_to_undo_finishes() {
    let mut t = completed(&BARE, 1);
    t.set_status(T::Compensating);
    let n = t.audit_log.len();
    let e = expect_commit(plan(&mut t, &BARE, None, W));
    assert_effects(&e, NextMove::Stop, None, false);
    assert_eq!(t.status, T::Compensated);
    assert_eq!(lines(&t, n), [sc(T::Compensating, T::Compensated)]);

    let mut t = completed(&BARE, 1);
    t.set_status(T::Compensating);
    t.cancelled_at = Some(Timestamp(1));
    let e = expect_commit(plan(&mut t, &BARE, None, W));
    assert_effects(&e, NextMove::Stop, None, false);
    assert_eq!(t.status, T::Cancelled);
}

// -------------------------------------------------------------- poisoned

#[test]
fn a_poisoned_running_step_fails_and_the_task_is_dead_lettered() {
    let mut t = completed(&BOOK, 1);
    crash(&mut t, &BOOK);
    let before = t.clone();
    let n = t.audit_log.len();
    let e = poisoned(&mut t, &BOOK, 5);
    let reason = poison_reason(5);
    assert!(reason.starts_with("delivered 5 times without completing"));
    let letter = format!("saga `book` task {}: {reason}", t.id);
    assert_effects(&e, NextMove::Stop, Some(&letter), true);
    assert_eq!(*e.guard.unwrap(), before, "the guard is the task as it was");
    assert_eq!(t.status, T::DeadLettered);
    assert!(t.finished_at.is_some());
    assert_eq!(
        statuses(&t),
        [S::Completed, S::Failed, S::Pending, S::Pending]
    );
    assert_eq!(t.steps[1].error.as_deref(), Some(reason.as_str()));
    assert_eq!(t.steps[1].attempt_count, 1);
    assert_eq!(t.error, Some(format!("saga `book`: {reason}")));
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::DeadLettered, "charge", None),
            sc(T::Running, T::DeadLettered),
        ]
    );
    assert_eq!(t.audit_log[n].error.as_deref(), Some(reason.as_str()));
    assert!(matches!(plan(&mut t, &BOOK, None, W), Plan::Nothing));
}

#[test]
fn a_poisoned_compensation_keeps_its_step_compensating() {
    let mut t = book_compensating();
    crash(&mut t, &BOOK);
    let n = t.audit_log.len();
    let e = poisoned(&mut t, &BOOK, 3);
    let letter = format!("saga `book` task {}: {}", t.id, poison_reason(3));
    assert_effects(&e, NextMove::Stop, Some(&letter), false);
    assert_eq!(t.status, T::DeadLettered);
    let rec = &t.steps[2];
    assert_eq!(rec.status, S::Compensating, "a requeue resumes it");
    assert_eq!(rec.compensation_attempts, 1);
    assert_eq!(rec.compensation_error, None);
    assert_eq!(rec.error, None);
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::DeadLettered, "ship", None),
            sc(T::Compensating, T::DeadLettered),
        ]
    );
}

#[test]
fn a_poisoned_compensation_waiting_for_its_retry_resumes_after_a_requeue_without_abandoning() {
    let mut t = book_compensating();
    run(&mut t, &BOOK, transient("locked")); // unship:1, waits 50 ms
    let due = t.steps[2].next_attempt_at;
    assert!(due.is_some());
    let n = t.audit_log.len();
    let e = poisoned(&mut t, &BOOK, 4);
    let letter = format!("saga `book` task {}: {}", t.id, poison_reason(4));
    assert_effects(&e, NextMove::Stop, Some(&letter), false);
    assert_eq!(t.status, T::DeadLettered);
    let rec = &t.steps[2];
    assert_eq!(rec.status, S::Compensating);
    assert_eq!(rec.compensation_attempts, 1);
    assert_eq!(rec.compensation_error.as_deref(), Some("locked"));
    assert_eq!(rec.next_attempt_at, due);
    assert_eq!(
        lines(&t, n),
        [
            on(AuditAction::DeadLettered, "ship", None),
            sc(T::Compensating, T::DeadLettered),
        ]
    );
    // What an operator's requeue does.
    t.steps[2].compensation_retry_base = t.steps[2].compensation_attempts;
    t.error = None;
    t.set_status(T::Compensating);
    let n = t.audit_log.len();
    let call = expect_call(plan(&mut t, &BOOK, None, W));
    assert_eq!(call, comp_call(2));
    assert!(
        lines(&t, n).is_empty(),
        "the waiting retry had not begun: nothing abandoned"
    );
    assert_eq!(record_attempt(&mut t, &BOOK, call).claim, "unship:2");
    let e = on_outcome(&mut t, &BOOK, call, transient("locked"), W);
    assert_effects(&e, after_ms(50), None, false);
    assert_eq!(lines(&t, n), [caf("unship", 2, Some(50))]);
}

#[test]
fn a_poisoned_task_waiting_for_a_step_retry_keeps_that_step_pending() {
    // The crash came before the retry's attempt was recorded.
    let mut t = completed(&BOOK, 1);
    run(&mut t, &BOOK, transient("503"));
    let due = t.steps[1].next_attempt_at;
    let before = t.clone();
    let n = t.audit_log.len();
    let e = poisoned(&mut t, &BOOK, 6);
    let reason = poison_reason(6);
    let letter = format!("saga `book` task {}: {reason}", t.id);
    assert_effects(&e, NextMove::Stop, Some(&letter), true);
    assert_eq!(*e.guard.unwrap(), before);
    assert_eq!(t.status, T::DeadLettered);
    assert_eq!(t.error, Some(format!("saga `book`: {reason}")));
    assert_eq!(
        statuses(&t),
        [S::Completed, S::Pending, S::Pending, S::Pending]
    );
    let rec = &t.steps[1];
    assert_eq!((rec.attempt_count, rec.retry_base), (1, 0));
    assert_eq!(rec.error.as_deref(), Some("503"));
    assert_eq!(rec.next_attempt_at, due, "left as it was");
    assert_eq!(
        lines(&t, n),
        [
            bare(AuditAction::DeadLettered),
            sc(T::Running, T::DeadLettered),
        ]
    );
}

#[test]
fn a_poisoned_task_with_no_attempt_under_way_names_no_step() {
    let mut t = fresh(&BOOK);
    let before = t.clone();
    let e = poisoned(&mut t, &BOOK, 2);
    assert!(e
        .dead_letter
        .as_deref()
        .unwrap()
        .contains("delivered 2 times"));
    assert_eq!(e.next, NextMove::Stop);
    assert_eq!(*e.guard.unwrap(), before);
    assert_eq!(t.status, T::DeadLettered);
    assert_eq!(statuses(&t), [S::Pending; 4]);
    assert_eq!(
        lines(&t, 0),
        [
            bare(AuditAction::DeadLettered),
            sc(T::Pending, T::DeadLettered),
        ]
    );
}

#[test]
fn park_dead_letters_a_task_without_its_definition() {
    let mut t = completed(&BOOK, 1);
    run(&mut t, &BOOK, transient("503"));
    let steps = t.steps.clone();
    let n = t.audit_log.len();
    park(&mut t, "unknown saga `book`");
    assert_eq!(t.status, T::DeadLettered);
    assert!(t.finished_at.is_some());
    assert_eq!(t.error.as_deref(), Some("unknown saga `book`"));
    assert_eq!(t.steps, steps, "no step record is touched");
    assert_eq!(
        lines(&t, n),
        [
            bare(AuditAction::DeadLettered),
            sc(T::Running, T::DeadLettered),
        ]
    );
    assert_eq!(t.audit_log[n].error.as_deref(), Some("unknown saga `book`"));
    assert!(matches!(plan(&mut t, &BOOK, None, W), Plan::Nothing));
}

#[test]
fn the_poison_reason_says_how_many_deliveries() {
    assert_eq!(
        poison_reason(7),
        "delivered 7 times without completing (each delivery's worker stopped before \
         settling it: a crash, an abort, or running out of memory)"
    );
}

// ------------------------------------------------------ terminal and end

#[test]
fn plan_on_a_terminal_task_is_nothing() {
    for status in [
        T::Completed,
        T::Compensated,
        T::Failed,
        T::Cancelled,
        T::CompensationFailed,
        T::DeadLettered,
    ] {
        let mut t = completed(&BOOK, 1);
        t.set_status(status);
        let before = t.clone();
        assert!(
            matches!(plan(&mut t, &BOOK, None, W), Plan::Nothing),
            "{status}"
        );
        assert!(
            matches!(plan(&mut t, &BOOK, Some(Timestamp(1)), W), Plan::Nothing),
            "{status} with a cancel flag"
        );
        assert_eq!(t, before, "{status}");
    }
}

#[test]
fn plan_when_every_step_is_completed_but_running_completes_the_task() {
    let mut t = completed(&BOOK, 4);
    // As if the last commit had not changed the status.
    t.status = T::Running;
    t.output = None;
    t.finished_at = None;
    let before = t.clone();
    let n = t.audit_log.len();
    let e = expect_commit(plan(&mut t, &BOOK, None, W));
    assert_effects(&e, NextMove::Stop, None, true);
    assert_eq!(*e.guard.unwrap(), before, "completing is guarded");
    assert_eq!(t.status, T::Completed);
    assert_eq!(t.output, Some(out(3)));
    assert!(t.finished_at.is_some());
    assert_eq!(lines(&t, n), [sc(T::Running, T::Completed)]);
}

// ------------------------------------------------ refused guarded commits

#[test]
fn a_refused_completion_cancelled_on_its_guard_compensates_every_step_including_the_last() {
    let mut t = completed(&BOOK, 3);
    let ran = run(&mut t, &BOOK, succeeded(3));
    let mut g = *ran.transition.guard.unwrap();
    let n = g.audit_log.len();
    let at = Timestamp(3);
    begin_cancel(&mut g, &BOOK, at);
    assert_eq!(g.status, T::Compensating);
    assert_eq!(g.cancelled_at, Some(at));
    assert_eq!(g.output, None);
    assert_eq!(statuses(&g), [S::Completed; 4]);
    assert_eq!(
        lines(&g, n),
        [
            bare(AuditAction::CancellationRequested),
            sc(T::Running, T::Compensating),
        ]
    );
    let mut calls = Vec::new();
    loop {
        match plan(&mut g, &BOOK, Some(at), W) {
            Plan::Call(call) => {
                let a = record_attempt(&mut g, &BOOK, call);
                calls.push(a.claim);
                on_outcome(&mut g, &BOOK, call, undone(), W);
            }
            Plan::Nothing => break,
            Plan::Commit(e) => panic!("unexpected commit {e:?}"),
        }
    }
    assert_eq!(calls, ["retract:1", "unship:1", "release:1"]);
    assert_eq!(g.status, T::Cancelled);
    assert_eq!(
        statuses(&g),
        [S::Compensated, S::Completed, S::Compensated, S::Compensated]
    );
}

#[test]
fn a_refused_failure_cancelled_on_its_guard_compensates_instead() {
    // on_exhausted = fail would leave `first` as it is; the cancellation
    // that refused the commit undoes it.
    let mut t = completed(&FAIL2, 1);
    let ran = run(&mut t, &FAIL2, permanent("no"));
    assert_eq!(t.status, T::Failed);
    let mut g = *ran.transition.guard.unwrap();
    let n = g.audit_log.len();
    begin_cancel(&mut g, &FAIL2, Timestamp(8));
    assert_eq!(g.status, T::Compensating);
    assert_eq!(statuses(&g), [S::Completed, S::Failed]);
    assert_eq!(
        lines(&g, n),
        [
            bare(AuditAction::CancellationRequested),
            sc(T::Running, T::Compensating),
        ]
    );
    let ran = run(&mut g, &FAIL2, undone());
    assert_eq!(ran.call, comp_call(0));
    assert_effects(&ran.transition, NextMove::Stop, None, false);
    assert_eq!(g.status, T::Cancelled);

    // A dead-lettering, likewise.
    let mut t = completed(&PARK2, 1);
    let ran = run(&mut t, &PARK2, invalid("bad"));
    let mut g = *ran.transition.guard.unwrap();
    begin_cancel(&mut g, &PARK2, Timestamp(8));
    assert_eq!(g.status, T::Compensating);
    assert!(find(&g, &AuditAction::DeadLettered).is_empty());
}

#[test]
fn a_refused_poisoning_cancelled_on_its_guard_fails_the_running_step_and_compensates() {
    let mut t = completed(&BOOK, 1);
    crash(&mut t, &BOOK);
    let e = poisoned(&mut t, &BOOK, 4);
    let mut g = *e.guard.unwrap();
    begin_cancel(&mut g, &BOOK, Timestamp(6));
    assert_eq!(g.status, T::Compensating);
    assert_eq!(
        statuses(&g),
        [S::Completed, S::Failed, S::Pending, S::Pending]
    );
    assert_eq!(
        g.steps[1].error.as_deref(),
        Some("cancelled before the step completed")
    );
    assert_eq!(expect_call(plan(&mut g, &BOOK, None, W)), comp_call(0));
}

#[test]
fn a_refused_compensation_decision_cancelled_on_its_guard_ends_cancelled() {
    let mut t = completed(&BOOK, 3);
    let ran = run(&mut t, &BOOK, permanent("webhook gone"));
    assert_eq!(t.status, T::Compensating);
    let mut g = *ran.transition.guard.unwrap();
    assert_eq!(g.status, T::Running);
    assert_eq!(g.cancelled_at, None);
    let n = g.audit_log.len();
    let at = Timestamp(11);
    begin_cancel(&mut g, &BOOK, at);
    assert_eq!(g.status, T::Compensating);
    assert_eq!(g.cancelled_at, Some(at));
    assert_eq!(
        statuses(&g),
        [S::Completed, S::Completed, S::Completed, S::Failed]
    );
    assert_eq!(g.steps[3].error.as_deref(), Some("webhook gone"));
    assert_eq!(
        lines(&g, n),
        [
            bare(AuditAction::CancellationRequested),
            sc(T::Running, T::Compensating),
        ]
    );
    let n = g.audit_log.len();
    let mut claims = Vec::new();
    for _ in 0..2 {
        claims.push(run(&mut g, &BOOK, undone()).attempt.claim);
    }
    assert_eq!(claims, ["unship:1", "release:1"]);
    assert_eq!(g.status, T::Cancelled, "cancelled, not compensated");
    assert_eq!(
        lines(&g, n),
        [
            on(AuditAction::StepCompensated, "ship", Some(1)),
            on(AuditAction::StepCompensated, "reserve", Some(1)),
            sc(T::Compensating, T::Cancelled),
        ]
    );

    // The guard of an open circuit on a pending task: nothing to undo.
    let mut t = fresh(&BOOK);
    let call = expect_call(plan(&mut t, &BOOK, None, W));
    let e = on_outcome(&mut t, &BOOK, call, Outcome::CircuitOpen("open".into()), W);
    let mut g = *e.guard.unwrap();
    assert_eq!(g.status, T::Pending);
    begin_cancel(&mut g, &BOOK, Timestamp(12));
    assert_eq!(g.status, T::Cancelled);
    assert!(g.finished_at.is_some());
    assert_eq!(
        statuses(&g),
        [S::Failed, S::Pending, S::Pending, S::Pending]
    );
    assert_eq!(
        lines(&g, 0),
        [
            on(AuditAction::CircuitOpen, "reserve", None),
            bare(AuditAction::CancellationRequested),
            sc(T::Pending, T::Cancelled),
        ]
    );
}

// ---- attempts interrupted by a graceful shutdown ----

#[test]
fn an_interrupted_step_attempt_is_made_again_now_without_spending_the_budget() {
    let mut t = fresh(&ONCE); // max_retries = 0: one real call
    let ran = run(&mut t, &ONCE, Outcome::Interrupted { dropped: false });
    assert_eq!(ran.attempt.claim, "only:1");
    assert_effects(&ran.transition, NextMove::Now, None, false);
    let rec = &t.steps[0];
    assert_eq!(rec.status, S::Pending);
    assert_eq!((rec.attempt_count, rec.retry_base), (1, 1));
    assert_eq!(rec.error, None);
    assert_eq!(t.status, T::Running);
    assert_eq!(
        lines(&t, 0),
        [
            sc(T::Pending, T::Running),
            on(AuditAction::AttemptAbandoned, "only", Some(1)),
        ]
    );
    assert!(last(&t)
        .error
        .as_deref()
        .is_some_and(|e| e.contains("interrupted by its worker's shutdown")));
    // The next delivery does not take it for an attempt that never
    // reported back: attempt 2 is the one real call, and may succeed.
    let ran = run(&mut t, &ONCE, succeeded(0));
    assert_eq!(ran.attempt.claim, "only:2");
    assert_eq!(t.status, T::Completed);
    assert_eq!(find(&t, &AuditAction::AttemptAbandoned).len(), 1);
}

#[test]
fn an_interrupted_compensation_is_made_again_now_without_spending_the_budget() {
    let mut t = completed(&FAIL2, 1);
    begin_cancel(&mut t, &FAIL2, Timestamp(10)); // compensation: no retries
    let ran = run(&mut t, &FAIL2, Outcome::Interrupted { dropped: false });
    assert_eq!(ran.call, comp_call(0));
    assert_effects(&ran.transition, NextMove::Now, None, false);
    let rec = &t.steps[0];
    assert_eq!(
        (rec.compensation_attempts, rec.compensation_retry_base),
        (1, 1)
    );
    assert!(rec.next_attempt_at.is_some(), "due, not abandoned");
    assert_eq!(t.status, T::Compensating);
    let n = t.audit_log.len();
    let ran = run(&mut t, &FAIL2, succeeded(0));
    assert!(ran.attempt.claim.ends_with(":2"), "{}", ran.attempt.claim);
    assert!(
        !lines(&t, n).contains(&on(AuditAction::AttemptAbandoned, "undo", Some(1))),
        "not taken for an abandoned attempt"
    );
    assert!(t.status.is_terminal(), "{:?}", t.status);
    assert_eq!(find(&t, &AuditAction::AttemptAbandoned).len(), 1);
}

// ---- `when_open = wait`: parked, not failed ----

/// One step behind a breaker that parks tasks: 10 s breaks.
static WAITS: SagaDefinition = SagaDefinition {
    name: "waits",
    version: 1,
    fingerprint: 0,
    type_name: "Waits",
    cancellable: false,
    steps: &[StepDefinition {
        circuit_breaker: Some(
            crate::circuit::CircuitBreakerConfig::new(3, 10)
                .with_when_open(crate::circuit::WhenOpen::Wait),
        ),
        ..step(
            "notify",
            1,
            RetryPolicy::new(2, BackoffKind::Constant, 100),
            None,
        )
    }],
};

#[test]
fn a_task_meeting_a_breaker_that_waits_is_parked_until_the_break_ends() {
    let mut t = fresh(&WAITS);
    let call = expect_call(plan(&mut t, &WAITS, None, W));
    let retry_after = Duration::from_millis(4_000);
    let outcome = Outcome::CircuitWait {
        error: "circuit breaker is open".into(),
        retry_after,
    };
    let e = on_outcome(&mut t, &WAITS, call, outcome, W);
    // Back after the break plus a share of half the break (5 s), fixed by
    // the task's id: tasks parked together come back spread out.
    let spread = Duration::from_secs(5) * (t.id.0.as_u128() % 1000) as u32 / 1000;
    assert_effects(&e, NextMove::After(retry_after + spread), None, true);
    assert!(!t.status.is_terminal(), "{:?}", t.status);
    assert_eq!(t.steps[0].status, StepStatus::Pending);
    assert_eq!(t.steps[0].attempt_count, 0, "no retry is spent");
    let parked = t.audit_log.last().unwrap();
    assert_eq!(parked.action, AuditAction::CircuitOpen);
    assert!(
        parked
            .details
            .as_deref()
            .unwrap_or_default()
            .starts_with("parked until the break ends"),
        "{parked:?}"
    );
    // And when it comes back, the step is called as if for the first time.
    let again = expect_call(plan(&mut t, &WAITS, None, W));
    assert_eq!(again.idx, 0);
}

/// One attempt that was its breaker's half-open probe, as the worker makes
/// it.
fn probe(task: &mut TaskInstance, def: &SagaDefinition, outcome: Outcome) -> Ran {
    let call = expect_call(plan(task, def, None, W));
    let attempt = record_attempt(task, def, call);
    let t0 = Timestamp::now().0;
    let transition = on_probe_outcome(task, def, call, outcome, W);
    let t1 = Timestamp::now().0;
    Ran {
        call,
        attempt,
        transition,
        t0,
        t1,
    }
}

#[test]
fn failed_probes_of_a_breaker_that_waits_spend_no_retry_however_many() {
    let mut t = fresh(&WAITS);
    // One failure through the closed breaker counts (2 retries allowed).
    run(&mut t, &WAITS, transient("refused"));
    assert_eq!(t.steps[0].attempt_count - t.steps[0].retry_base, 1);
    // A 10 s break takes 20 breaks' probes, each failing: none counts.
    let spread = Duration::from_secs(5) * (t.id.0.as_u128() % 1000) as u32 / 1000;
    let delay = Duration::from_secs(15) + spread;
    for n in 2..22 {
        let before = t.audit_log.len();
        let ran = probe(&mut t, &WAITS, transient("still refused"));
        assert_eq!(ran.attempt.claim, format!("notify:{n}"), "numbers go on");
        // Past the new break and the whole release window after it: every
        // task parked in that break comes back first, and probes next.
        assert_effects(&ran.transition, NextMove::After(delay), None, true);
        let rec = &t.steps[0];
        assert_due(rec, &ran, delay.as_millis() as u64);
        assert_eq!((rec.attempt_count, rec.retry_base), (n, n - 1));
        assert_eq!(rec.status, S::Pending);
        assert_eq!(rec.error.as_deref(), Some("still refused"));
        assert_eq!(t.status, T::Running);
        assert_eq!(
            lines(&t, before),
            [af("notify", n, Some(delay.as_millis() as u64), false)]
        );
        assert!(last(&t)
            .details
            .as_deref()
            .unwrap_or_default()
            .starts_with("half-open probe failed: not counted"));
    }
    // A timed-out probe is a failed probe too.
    probe(
        &mut t,
        &WAITS,
        Outcome::TimedOut {
            after: ms(500),
            dropped: false,
        },
    );
    assert_eq!(t.steps[0].attempt_count - t.steps[0].retry_base, 1);
    // The dependency is back: the next probe completes the task.
    let ran = probe(&mut t, &WAITS, succeeded(0));
    assert_effects(&ran.transition, NextMove::Stop, None, true);
    assert_eq!(t.status, T::Completed);
}

#[test]
fn calls_through_a_closed_breaker_that_waits_still_exhaust_the_step() {
    let mut t = fresh(&WAITS);
    run(&mut t, &WAITS, transient("bad input for this one"));
    // A free probe in between changes nothing in the count.
    probe(&mut t, &WAITS, transient("bad input for this one"));
    run(&mut t, &WAITS, transient("bad input for this one"));
    let ran = run(&mut t, &WAITS, transient("bad input for this one"));
    assert_eq!(ran.attempt.claim, "notify:4");
    assert_eq!(t.status, T::Compensated, "2 retries spent");
    assert_eq!(t.steps[0].status, S::Failed);
}

#[test]
fn a_probe_that_answers_for_good_or_of_a_breaker_that_fails_is_an_ordinary_outcome() {
    // A permanent error proves the dependency answered.
    let mut t = fresh(&WAITS);
    let ran = probe(&mut t, &WAITS, permanent("no such hook"));
    assert!(ran.transition.guard.is_some(), "the running phase ends");
    assert_eq!(t.status, T::Compensated);
    // `when_open = fail`: a failed probe counts like any failure.
    static FAILS: SagaDefinition = SagaDefinition {
        name: "fails",
        steps: &[StepDefinition {
            circuit_breaker: Some(crate::circuit::CircuitBreakerConfig::new(3, 10)),
            ..step(
                "notify",
                1,
                RetryPolicy::new(2, BackoffKind::Constant, 100),
                None,
            )
        }],
        ..WAITS
    };
    let mut t = fresh(&FAILS);
    let ran = probe(&mut t, &FAILS, transient("refused"));
    assert_effects(&ran.transition, after_ms(100), None, true);
    assert_eq!((t.steps[0].attempt_count, t.steps[0].retry_base), (1, 0));
}

// ---- flow-control limits -------------------------------------------------

fn limit_wait(limit: &str, retry_ms: u64, ahead: u64) -> Outcome {
    Outcome::LimitWait(Waiting {
        limit: limit.to_owned(),
        key: Some("42".to_owned()),
        retry_after: ms(retry_ms),
        ahead,
        rate: false,
    })
}

#[test]
fn a_limit_wait_parks_the_step_without_an_attempt_and_records_the_wait_once() {
    let mut task = fresh(&BOOK);
    let call = expect_call(plan(&mut task, &BOOK, None, W));
    assert_eq!(call, step_call(0));
    // Refused before the attempt is recorded: nothing counted.
    let transition = on_outcome(&mut task, &BOOK, call, limit_wait("psp", 700, 3), W);
    assert_effects(&transition, after_ms(700), None, true);
    let rec = &task.steps[0];
    assert_eq!(rec.status, StepStatus::Pending);
    assert_eq!((rec.attempt_count, rec.retry_base), (0, 0));
    assert!(rec.next_attempt_at.is_some());
    assert_eq!(task.audit_log.len(), 1);
    let entry = &task.audit_log[0];
    assert_eq!(
        entry.action,
        AuditAction::LimitWait {
            limit: "psp".into(),
            key: Some("42".into())
        }
    );
    assert_eq!(entry.step.as_deref(), Some("reserve"));
    let details = entry.details.as_deref().unwrap_or_default();
    assert!(
        details.contains("waiting for limit `psp` (key 42)") && details.contains("3 ahead"),
        "{details}"
    );
    let since = waiting_since(&task, 0, "psp").expect("waiting");
    assert_eq!(since, entry.at);
    assert_eq!(waiting_since(&task, 0, "other"), None);
    // A worker may load the task without its audit log: the wait is on
    // the step.
    task.audit_log.clear();
    task.audit_saved();

    // Back, and still waiting: the same wait, not recorded again.
    let call = expect_call(plan(&mut task, &BOOK, None, W));
    let transition = on_outcome(&mut task, &BOOK, call, limit_wait("psp", 0, 0), W);
    assert_effects(&transition, after_ms(1), None, true);
    assert!(
        task.audit_log.is_empty(),
        "not recorded again: {:#?}",
        task.audit_log
    );

    // Granted at last: the attempt is the step's first, and ends the wait.
    let call = expect_call(plan(&mut task, &BOOK, None, W));
    let attempt = record_attempt(&mut task, &BOOK, call);
    assert_eq!(attempt.number, 1);
    assert_eq!(task.status, TaskStatus::Running);
    assert_eq!(task.steps[0].limit_wait, None);
}

#[test]
fn a_wait_for_another_limit_is_a_new_wait() {
    let mut task = fresh(&BOOK);
    let call = expect_call(plan(&mut task, &BOOK, None, W));
    on_outcome(&mut task, &BOOK, call, limit_wait("psp", 10, 0), W);
    on_outcome(&mut task, &BOOK, call, limit_wait("mail", 10, 0), W);
    on_outcome(&mut task, &BOOK, call, limit_wait("mail", 10, 0), W);
    let limits: Vec<_> = task
        .audit_log
        .iter()
        .map(|e| match &e.action {
            AuditAction::LimitWait { limit, .. } => limit.as_str(),
            _ => "other",
        })
        .collect();
    assert_eq!(limits, ["psp", "mail"]);
}

#[path = "tests_unknown.rs"]
mod unknown;

/// A running task that waits for a retry is guarded by the task as the
/// outcome left it (the failure recorded, the retry due): a cancellation
/// requested meanwhile begins from there, at once, and keeps the failure.
/// The store decides nothing about it.
#[test]
fn a_running_task_that_waits_is_guarded_by_itself_as_the_outcome_left_it() {
    let mut t = fresh(&BOOK);
    let ran = run(&mut t, &BOOK, transient("busy"));
    let guard = ran
        .transition
        .guard
        .expect("a waiting running task is guarded");
    assert_eq!(*guard, t, "the guard is the task as the outcome left it");
    let mut cancelled = *guard;
    begin_cancel(&mut cancelled, &BOOK, Timestamp(9));
    assert_eq!(cancelled.status, TaskStatus::Cancelled, "nothing to undo");
    assert_eq!(cancelled.steps[0].status, StepStatus::Failed);
    assert_eq!(cancelled.steps[0].error.as_deref(), Some("busy"));
    assert_eq!(cancelled.steps[0].next_attempt_at, None, "the retry is off");
}
