//! Lost outcomes: an attempt that began and never reported back (or was
//! dropped half-way) is counted on its step, and a step that ends without
//! completing after one is compensated, as `Outcome::Unknown` from its
//! input, by a compensation that takes `Outcome`; in reverse order with
//! the others. A step known to have failed is not.

use super::*;

const fn refund(handles_unknown: bool) -> Option<CompensationDefinition> {
    Some(CompensationDefinition {
        name: "refund",
        retry: RetryPolicy::NO_RETRY,
        handles_unknown,
    })
}

/// `reserve` (compensated by `release`, which takes the output), `charge`
/// (constant 0 ms, 1 retry; compensated by `refund`, which takes
/// `Outcome`), `ship` (no retry, no compensation).
static PAY: SagaDefinition = SagaDefinition {
    name: "pay",
    version: 1,
    fingerprint: 0,
    type_name: "Pay",
    cancellable: true,
    steps: &[
        step(
            "reserve",
            1,
            RetryPolicy::NO_RETRY,
            undo("release", RetryPolicy::NO_RETRY),
        ),
        step(
            "charge",
            2,
            RetryPolicy::new(1, BackoffKind::Constant, 0),
            refund(true),
        ),
        step("ship", 3, RetryPolicy::NO_RETRY, None),
    ],
};

/// The same with a `refund` that takes the output alone.
static PAY_PLAIN: SagaDefinition = SagaDefinition {
    name: "pay-plain",
    version: 1,
    fingerprint: 0,
    type_name: "PayPlain",
    cancellable: true,
    steps: &[
        step(
            "reserve",
            1,
            RetryPolicy::NO_RETRY,
            undo("release", RetryPolicy::NO_RETRY),
        ),
        step(
            "charge",
            2,
            RetryPolicy::new(1, BackoffKind::Constant, 0),
            refund(false),
        ),
        step("ship", 3, RetryPolicy::NO_RETRY, None),
    ],
};

/// Runs the planned compensation to success; returns its call and input.
fn undo_next(t: &mut TaskInstance, def: &SagaDefinition) -> (Call, Value) {
    let call = expect_call(plan(t, def, None, W));
    let input = call.input(def, t);
    record_attempt(t, def, call);
    on_outcome(t, def, call, undone(), W);
    (call, input)
}

#[test]
fn a_step_found_running_counts_a_lost_outcome_even_when_its_crash_is_forgiven() {
    let mut t = completed(&PAY, 1);
    crash(&mut t, &PAY);
    // As `forgive_crash` leaves it: the budget spared, the attempt still
    // recorded as running.
    t.steps[1].retry_base += 1;
    expect_call(plan(&mut t, &PAY, None, W2));
    let rec = &t.steps[1];
    assert_eq!((rec.status, rec.lost_outcomes), (S::Pending, 1));
    assert_eq!((rec.attempt_count, rec.retry_base), (1, 1));
}

#[test]
fn a_lost_outcome_then_a_failure_for_good_is_undone_from_the_input_before_earlier_steps() {
    let mut t = completed(&PAY, 1);
    crash(&mut t, &PAY);
    let ran = run(&mut t, &PAY, permanent("card declined"));
    assert_eq!(ran.call, step_call(1));
    assert_eq!(t.status, T::Compensating);
    assert_eq!(
        (t.steps[1].status, t.steps[1].lost_outcomes),
        (S::Failed, 1)
    );

    let n = t.audit_log.len();
    let (call, input) = undo_next(&mut t, &PAY);
    assert_eq!(call, comp_call(1), "the lost charge first");
    assert_eq!(call.method(&PAY), "refund");
    assert_eq!(
        input,
        unknown_json(out(0)),
        "with the input it was called with"
    );
    assert_eq!(t.steps[1].status, S::Compensated);
    let entry = &t.audit_log[n];
    assert_eq!(entry.action, AuditAction::StepCompensated);
    assert!(entry
        .details
        .as_deref()
        .is_some_and(|d| d.contains("unknown")));

    let (call, input) = undo_next(&mut t, &PAY);
    assert_eq!(call, comp_call(0));
    assert_eq!(
        input,
        out(0),
        "a compensation that takes the output gets it bare"
    );
    assert_eq!(t.status, T::Compensated);
    assert_eq!(statuses(&t), [S::Compensated, S::Compensated, S::Pending]);
}

#[test]
fn a_lost_outcome_then_a_cancellation_is_undone() {
    let mut t = completed(&PAY, 1);
    crash(&mut t, &PAY);
    expect_commit(plan(&mut t, &PAY, Some(Timestamp(3)), W2));
    assert_eq!(t.status, T::Compensating);
    assert_eq!(
        (t.steps[1].status, t.steps[1].lost_outcomes),
        (S::Failed, 1)
    );
    let (call, input) = undo_next(&mut t, &PAY);
    assert_eq!((call, input), (comp_call(1), unknown_json(out(0))));
    undo_next(&mut t, &PAY);
    assert_eq!(t.status, T::Cancelled);
}

#[test]
fn a_lost_outcome_on_the_first_step_is_undone_from_the_sagas_input() {
    static FIRST: SagaDefinition = SagaDefinition {
        name: "first",
        version: 1,
        fingerprint: 0,
        type_name: "First",
        cancellable: true,
        steps: &[step("charge", 1, RetryPolicy::NO_RETRY, refund(true))],
    };
    let mut t = fresh(&FIRST);
    crash(&mut t, &FIRST);
    // Its only attempt never reported back: the budget is spent.
    expect_commit(plan(&mut t, &FIRST, None, W2));
    assert_eq!(t.status, T::Compensating);
    let (call, input) = undo_next(&mut t, &FIRST);
    assert_eq!(call, comp_call(0));
    assert_eq!(input, unknown_json(json!({"input": "first"})));
    assert_eq!(t.status, T::Compensated);
}

#[test]
fn a_step_known_to_have_failed_is_not_compensated() {
    let mut t = completed(&PAY, 1);
    run(&mut t, &PAY, transient("503"));
    run(&mut t, &PAY, permanent("card declined"));
    assert_eq!(
        (t.steps[1].status, t.steps[1].lost_outcomes),
        (S::Failed, 0)
    );
    let (call, _) = undo_next(&mut t, &PAY);
    assert_eq!(call, comp_call(0), "straight to the completed reserve");
    assert_eq!(t.status, T::Compensated);
    assert_eq!(t.steps[1].status, S::Failed);
}

#[test]
fn a_compensation_that_takes_the_output_is_not_called_for_a_lost_outcome() {
    let mut t = completed(&PAY_PLAIN, 1);
    crash(&mut t, &PAY_PLAIN);
    run(&mut t, &PAY_PLAIN, permanent("card declined"));
    assert_eq!(t.steps[1].lost_outcomes, 1, "recorded all the same");
    let (call, _) = undo_next(&mut t, &PAY_PLAIN);
    assert_eq!(call, comp_call(0));
    assert_eq!(t.status, T::Compensated);
    assert_eq!(t.steps[1].status, S::Failed);
}

#[test]
fn a_completed_step_is_undone_from_its_output_as_completed() {
    let mut t = completed(&PAY, 2);
    run(&mut t, &PAY, permanent("out of stock"));
    let n = t.audit_log.len();
    let (call, input) = undo_next(&mut t, &PAY);
    assert_eq!((call, input), (comp_call(1), completed_json(out(1))));
    assert_eq!(t.audit_log[n].details, None);
}

#[test]
fn an_attempt_dropped_half_way_is_a_lost_outcome_and_one_that_returned_is_not() {
    let dropped_or_not = |dropped: bool| {
        [
            Outcome::TimedOut {
                after: ms(1000),
                dropped,
            },
            Outcome::Interrupted { dropped },
            Outcome::Cancelled {
                at: Timestamp(2),
                error: "stopped".into(),
                dropped,
            },
        ]
    };
    for dropped in [false, true] {
        for outcome in dropped_or_not(dropped) {
            let mut t = completed(&PAY, 1);
            run(&mut t, &PAY, outcome.clone());
            let lost = t.steps[1].lost_outcomes;
            assert_eq!(lost, u32::from(dropped), "{outcome:?}");
        }
    }
}

#[test]
fn a_poisoned_step_counts_the_attempt_its_worker_died_in() {
    let mut t = completed(&PAY, 1);
    crash(&mut t, &PAY);
    poisoned(&mut t, &PAY, 10);
    assert_eq!(t.status, T::DeadLettered);
    assert_eq!(
        (t.steps[1].status, t.steps[1].lost_outcomes),
        (S::Failed, 1)
    );
}

/// The count is written only once an outcome is lost: a step that never
/// lost one is recorded as before.
#[test]
fn lost_outcomes_are_left_out_of_the_record_until_there_is_one() {
    let mut t = completed(&PAY, 1);
    let json = serde_json::to_string(&t.steps[0]).unwrap();
    assert!(!json.contains("lost_outcomes"), "{json}");
    crash(&mut t, &PAY);
    expect_call(plan(&mut t, &PAY, None, W2));
    let json = serde_json::to_value(&t.steps[1]).unwrap();
    assert_eq!(json["lost_outcomes"], 1);
    let back: StepRecord = serde_json::from_value(json).unwrap();
    assert_eq!(back, t.steps[1]);
}
