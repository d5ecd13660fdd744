//! Each way a saga message is turned away, and the one way it is admitted,
//! on a registry of two versions of one saga.

use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::context::StepContext;
use crate::error::StepError;
use crate::policy::RetryPolicy;
use crate::saga::StepDefinition;
use crate::util::BoxFuture;

const fn step(name: &'static str, order: u32) -> StepDefinition {
    StepDefinition {
        name,
        order,
        retry: RetryPolicy::NO_RETRY,
        compensation: None,
        circuit_breaker: None,
        timeout: None,
        input_type: "serde_json::Value",
        limits: &[],
        output_type: "serde_json::Value",
    }
}

static V1: SagaDefinition = SagaDefinition {
    name: "ship",
    version: 1,
    fingerprint: 0x0123_4567_89ab_cdef,
    type_name: "Ship",
    cancellable: true,
    steps: &[step("pack", 1), step("send", 2)],
};

static V2: SagaDefinition = SagaDefinition {
    name: "ship",
    version: 2,
    fingerprint: 0xfeed,
    type_name: "ShipV2",
    cancellable: true,
    steps: &[step("pack", 1), step("weigh", 2), step("send", 3)],
};

struct Defined(&'static SagaDefinition);

impl ErasedSaga for Defined {
    fn definition(&self) -> &'static SagaDefinition {
        self.0
    }
    fn check_input(&self, input: Value) -> Result<Value, StepError> {
        Ok(input)
    }
    fn execute_step<'a>(
        &'a self,
        _: u32,
        input: Value,
        _: &'a StepContext,
    ) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move { Ok(input) })
    }
    fn compensate_step<'a>(
        &'a self,
        _: u32,
        _: Value,
        _: &'a StepContext,
    ) -> BoxFuture<'a, Result<(), StepError>> {
        Box::pin(async { Ok(()) })
    }
}

fn registry() -> SagaRegistry {
    SagaRegistry::new(vec![Arc::new(Defined(&V1)), Arc::new(Defined(&V2))]).unwrap()
}

/// A task of version 1 at sequence 3, and the message that is current for it.
fn task() -> (TaskInstance, QueueMessage) {
    let mut task = TaskInstance::new("ship", json!({}), [("pack".into(), 1), ("send".into(), 2)]);
    task.fingerprint = Some(V1.fingerprint_hex());
    task.seq = 3;
    task.status = TaskStatus::Running;
    let message = QueueMessage {
        task_id: task.id,
        saga: "ship".into(),
        seq: 3,
    };
    (task, message)
}

fn loaded(task: TaskInstance, cancel: Option<Timestamp>) -> Read {
    Read::Loaded {
        task: Some(Box::new(task)),
        cancel_requested: cancel,
    }
}

#[test]
fn the_current_message_of_a_known_task_advances_it_on_its_own_version() {
    let sagas = registry();
    let (task, message) = task();
    assert!(of_message(&sagas, &message).is_none());
    let cancel = Some(Timestamp(7));
    match of_task(&sagas, &message, loaded(task.clone(), cancel)) {
        Admission::Advance {
            saga,
            task: admitted,
            cancel_requested,
        } => {
            assert_eq!(saga.definition().version, 1);
            assert_eq!(admitted.id, task.id);
            assert_eq!(cancel_requested, cancel);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_saga_this_worker_does_not_run_goes_to_another_version_before_any_read() {
    let (_, mut message) = task();
    message.saga = "refund".into();
    match of_message(&registry(), &message) {
        Some(Admission::AnotherVersion { why, runner }) => {
            assert_eq!(why, "unknown saga `refund` (this worker runs [ship v1/2])");
            assert_eq!(runner.as_deref(), Some("refund"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_busy_task_is_handed_back() {
    let (_, message) = task();
    assert!(matches!(
        of_task(&registry(), &message, Read::Busy),
        Admission::HandBack
    ));
}

#[test]
fn an_unreadable_record_goes_to_another_version_with_no_announcement_to_ask() {
    let (_, message) = task();
    match of_task(
        &registry(),
        &message,
        Read::Unreadable("bad status `x`".into()),
    ) {
        Admission::AnotherVersion { why, runner } => {
            assert!(why.contains("cannot read the record of task"), "{why}");
            assert!(why.contains("bad status `x`"), "{why}");
            assert_eq!(runner, None);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_missing_task_and_a_task_of_another_saga_are_dead_letters() {
    let sagas = registry();
    let (task, message) = task();
    let missing = Read::Loaded {
        task: None,
        cancel_requested: None,
    };
    match of_task(&sagas, &message, missing) {
        Admission::DeadLetter(why) => {
            assert_eq!(why, format!("task {} does not exist", message.task_id))
        }
        other => panic!("{other:?}"),
    }
    let mut other = task;
    other.saga = "refund".into();
    match of_task(&sagas, &message, loaded(other, None)) {
        Admission::DeadLetter(why) => assert!(
            why.starts_with("message names saga `ship` but task") && why.ends_with("`refund`"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_stale_message_is_acknowledged_unless_a_cancellation_is_pending() {
    let sagas = registry();
    let (task, mut message) = task();
    message.seq = 2;
    assert!(matches!(
        of_task(&sagas, &message, loaded(task.clone(), None)),
        Admission::Acknowledge
    ));
    // The wake-up of a cancellation carries the sequence it read before
    // its request landed: it is current while the cancellation is pending.
    assert!(matches!(
        of_task(&sagas, &message, loaded(task.clone(), Some(Timestamp(1)))),
        Admission::Advance { .. }
    ));
    // Once applied, or once the task waits on nothing, it is stale again.
    let mut applied = task.clone();
    applied.cancelled_at = Some(Timestamp(1));
    assert!(matches!(
        of_task(&sagas, &message, loaded(applied, Some(Timestamp(1)))),
        Admission::Acknowledge
    ));
    let mut compensating = task;
    compensating.status = TaskStatus::Compensating;
    assert!(matches!(
        of_task(&sagas, &message, loaded(compensating, Some(Timestamp(1)))),
        Admission::Acknowledge
    ));
}

#[test]
fn a_message_of_an_ended_task_is_acknowledged_even_when_current() {
    let (mut task, message) = task();
    task.status = TaskStatus::Completed;
    assert!(matches!(
        of_task(&registry(), &message, loaded(task, Some(Timestamp(1)))),
        Admission::Acknowledge
    ));
}

#[test]
fn a_version_this_worker_lacks_names_the_runner_of_that_version() {
    let (mut task, message) = task();
    task.saga_version = 3;
    match of_task(&registry(), &message, loaded(task.clone(), None)) {
        Admission::AnotherVersion { why, runner } => {
            assert_eq!(
                why,
                format!(
                    "task {} runs on version 3 of saga `ship`, which this worker does not have (it runs [ship v1/2])",
                    task.id
                )
            );
            assert_eq!(runner.as_deref(), Some("ship@3"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn steps_changed_without_a_version_bump_name_the_runner_of_those_steps() {
    let (mut task, message) = task();
    task.fingerprint = Some("00000000000000aa".into());
    match of_task(&registry(), &message, loaded(task, None)) {
        Admission::AnotherVersion { why, runner } => {
            assert!(
                why.contains("the steps changed without a version bump"),
                "{why}"
            );
            assert!(why.contains("`#[saga(version = 2)]`"), "{why}");
            assert_eq!(runner.as_deref(), Some("ship@1#00000000000000aa"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_record_from_before_fingerprints_is_compared_by_step_names() {
    let sagas = registry();
    let (mut task, message) = task();
    task.fingerprint = None;
    assert!(matches!(
        of_task(&sagas, &message, loaded(task.clone(), None)),
        Admission::Advance { .. }
    ));
    task.steps[1].name = "post".into();
    match of_task(&sagas, &message, loaded(task, None)) {
        Admission::AnotherVersion { why, runner } => {
            assert!(why.contains("fingerprint not recorded"), "{why}");
            assert_eq!(runner, None);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_fingerprint_matches_only_its_own_spelling() {
    for fingerprint in [0, 1, 0xabc, u64::MAX, 0x0123_4567_89ab_cdef] {
        let spelled = format!("{fingerprint:016x}");
        assert!(is_hex_of(&spelled, fingerprint), "{spelled}");
        assert!(!is_hex_of(&spelled, fingerprint ^ 1), "{spelled}");
        assert!(
            !is_hex_of(&spelled.to_uppercase(), fingerprint)
                || !spelled.contains(|c: char| c.is_ascii_alphabetic())
        );
        assert!(!is_hex_of(&spelled[1..], fingerprint));
        assert!(!is_hex_of(&format!("{spelled}0"), fingerprint));
    }
}
