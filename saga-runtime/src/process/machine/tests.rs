//! Every branch of the process-manager protocol, on a hand-built
//! definition and hand-built instances.
//!
//! Each test takes the machine's steps the way the worker does (route,
//! admit what was read, turn the handler's run into a save or a verdict,
//! judge a refusal, carry out `#[on_error]`'s answer) and asserts the
//! commit that would be written: the instance as written (state, status,
//! version, audit, processed ids, keys), the correlation entries claimed
//! and released, the messages enqueued, scheduled and sent, the tallies,
//! how the message is settled, and the outcome reported.

use std::time::Duration;

use serde_json::{json, Value};

use super::*;
use crate::model::endpoint::{EndpointMessage, PUBLISHED};
use crate::model::envelope::EnvelopeKind;
use crate::model::process::InstanceStatus;
use crate::model::tally::{TallyProgress, TallyRef};
use crate::process::tally::{self, TallyOpening};
use crate::process::{
    AfterHold, Concurrency, Correlation, Failure, Handled, HandlerDefinition, HandlerKind,
    OnComplete, ProcessContext, ProcessDefinition, ProcessError, ScheduledTimeout, Target,
    Unmatched,
};

const fn handler(
    message_type: &'static str,
    kind: HandlerKind,
    correlation: Correlation,
) -> HandlerDefinition {
    HandlerDefinition {
        method: message_type,
        message_type,
        kind,
        correlation,
        limits: &[],
        unmatched: Unmatched {
            hold: None,
            then: None,
        },
    }
}

/// `#[handles(hold = "30s", then = drop)]` by correlation id.
const LATE: HandlerDefinition = HandlerDefinition {
    unmatched: Unmatched {
        hold: Some(Duration::from_secs(30)),
        then: Some(AfterHold::Drop),
    },
    ..handler("Late", HANDLES, Correlation::Id)
};

const STARTS: HandlerKind = HandlerKind::Starts { strict: false };
const HANDLES: HandlerKind = HandlerKind::Handles {
    strict: false,
    many: false,
};
const BY_NUMBER: Correlation = Correlation::Field {
    state_field: "order_number",
    message_field: "number",
};
const BY_TAG: Correlation = Correlation::Field {
    state_field: "tag",
    message_field: "tag",
};

/// The handlers of the process managers below:
/// - `Placed` starts, `Strict` starts strictly, `Note` continues, and
///   `Shipped` continues strictly, all by correlation id;
/// - `Opened` starts and `Paid` continues by `state.order_number`;
/// - `Remind` is a timeout;
/// - `Tagged` (`many`) and `Retag` continue by `state.tag`, which is
///   shared because of `Tagged`;
/// - `Late` continues by correlation id, held 30 s then dropped.
const HANDLERS: &[HandlerDefinition] = &[
    handler("Placed", STARTS, Correlation::Id),
    handler(
        "Strict",
        HandlerKind::Starts { strict: true },
        Correlation::Id,
    ),
    handler("Note", HANDLES, Correlation::Id),
    handler(
        "Shipped",
        HandlerKind::Handles {
            strict: true,
            many: false,
        },
        Correlation::Id,
    ),
    handler("Opened", STARTS, BY_NUMBER),
    handler("Paid", HANDLES, BY_NUMBER),
    handler("Remind", HandlerKind::Timeout, Correlation::Instance),
    handler(
        "Tagged",
        HandlerKind::Handles {
            strict: false,
            many: true,
        },
        BY_TAG,
    ),
    handler("Retag", HANDLES, BY_TAG),
    LATE,
];

/// Keeps completed instances.
static ORDER: ProcessDefinition = ProcessDefinition {
    name: "order",
    state_type: "Order",
    handlers: HANDLERS,
    on_complete: OnComplete::Keep,
    concurrency: Concurrency::Optimistic,
};

/// Deletes them.
static FLEETING: ProcessDefinition = ProcessDefinition {
    name: "order",
    state_type: "Order",
    handlers: HANDLERS,
    on_complete: OnComplete::Delete,
    concurrency: Concurrency::Optimistic,
};

const NOW: u64 = 1_767_225_600_000;
const AT: Timestamp = Timestamp(1_767_225_601_234);
const TTL: Duration = Duration::from_secs(600);

fn subscribers(message_type: &str) -> Vec<&'static str> {
    match message_type {
        "Placed" => vec!["order", "billing"],
        _ => Vec::new(),
    }
}

fn routing_key(process: &str, _: &str, payload: &Value) -> (Option<String>, Option<String>) {
    (
        Some(format!("{process}:{}", payload["id"])),
        Some("ref".to_owned()),
    )
}

fn given() -> Given<'static> {
    Given {
        now_ms: NOW,
        at: AT,
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned()),
        subscribers: &subscribers,
        routing_key: &routing_key,
        dead_letter_unmatched: false,
        // Not held unless a case says: the cases of what follows a
        // message that finds nothing see it at once.
        hold: Duration::ZERO,
        tombstone_ttl: TTL,
    }
}

fn message(message_type: &str, message_id: &str) -> Envelope {
    Envelope {
        message_id: message_id.to_owned(),
        process: "order".to_owned(),
        message_type: message_type.to_owned(),
        payload: json!({"id": 7}),
        kind: EnvelopeKind::Message,
        instance_id: None,
        generation: None,
        failures: 0,
        key: None,
        key_field: None,
        traceparent: None,
        due_ms: None,
        hops: 0,
        hold_until: None,
    }
}

/// The timeout `Remind` for generation `generation` of `instance`.
fn reminder(instance: &str, generation: Option<&str>) -> Envelope {
    Envelope {
        kind: EnvelopeKind::Timeout,
        instance_id: Some(instance.to_owned()),
        generation: generation.map(str::to_owned),
        ..message("Remind", "t-1")
    }
}

/// A saved instance `o-1` (version 3, generation `g1`) that handled `m0`.
fn instance() -> ProcessInstance {
    ProcessInstance {
        process: "order".to_owned(),
        id: "o-1".to_owned(),
        generation: "g1".to_owned(),
        started_by: Some("m0".to_owned()),
        state: json!({"n": 1}),
        status: InstanceStatus::Active,
        version: 3,
        keys: Vec::new(),
        processed: vec!["m0".to_owned()],
        audit_log: Vec::new(),
        created_at: Timestamp(1),
        updated_at: Timestamp(2),
    }
}

fn holding(keys: &[(&str, &str)]) -> ProcessInstance {
    ProcessInstance {
        keys: keys
            .iter()
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .collect(),
        ..instance()
    }
}

fn entries(keys: &[(&str, &str)]) -> Vec<(String, String)> {
    holding(keys).keys
}

/// Routes `envelope`, whose correlation value is `key`.
fn routed<'a>(def: &'static ProcessDefinition, envelope: &'a Envelope, key: &str) -> Handling<'a> {
    Handling::new(def, envelope, || Ok(Some(key.to_owned()))).expect("routed")
}

fn context(instance: &ProcessInstance, envelope: &Envelope) -> ProcessContext {
    ProcessContext::new(
        "order",
        instance.id.clone(),
        instance.generation.clone(),
        envelope.message_id.clone(),
    )
}

/// The handler's result: `state`, and the correlation values it left.
fn ok(state: Value, keys: &[(&'static str, &str)]) -> Result<Handled, ProcessError> {
    let keys = keys.iter().map(|(f, v)| (*f, v.to_string())).collect();
    Ok((state, keys))
}

/// `Paid` (`m1`, by `order_number` 42) handled on `instance` by a
/// handler that did what `ctx` says and left `keys`.
fn paid(
    def: &'static ProcessDefinition,
    instance: ProcessInstance,
    keys: &[(&'static str, &str)],
    ctx: impl FnOnce(&mut ProcessContext),
) -> Save {
    let envelope = message("Paid", "m1");
    let handling = routed(def, &envelope, "42");
    let mut context = context(&instance, &envelope);
    ctx(&mut context);
    let result = ok(json!({"n": 2}), keys);
    handling
        .ran(instance, &context, result, &given())
        .expect("saved")
}

fn decision(verdict: Verdict) -> Decision {
    match verdict {
        Verdict::Decided(decision) => *decision,
        other => panic!("expected a decision, got {other:?}"),
    }
}

fn failing(verdict: Verdict) -> Failing {
    match verdict {
        Verdict::Fail(failing) => *failing,
        other => panic!("expected a failure for #[on_error], got {other:?}"),
    }
}

fn run(admitted: Result<Admitted, Verdict>) -> ProcessInstance {
    match admitted {
        Ok(Admitted::Run(instance)) => *instance,
        other => panic!("expected the handler to run, got {other:?}"),
    }
}

fn is_reread(verdict: &Verdict) -> bool {
    matches!(verdict, Verdict::Reread)
}

/// Asserts a commit that writes nothing but the settlement.
fn assert_settles_only(commit: &Commit, settle: Settlement) {
    assert_eq!(commit.instance, None);
    assert_eq!(commit.handling, None);
    assert_eq!(commit.tombstone_ttl, Duration::ZERO);
    assert_eq!(commit.settle, settle);
    let fx = &commit.effects;
    assert!(!fx.delete);
    assert!(fx.add_keys.is_empty() && fx.remove_keys.is_empty());
    assert!(fx.add_shared.is_empty() && fx.remove_shared.is_empty());
    assert!(fx.enqueue.is_empty() && fx.endpoints.is_empty());
    assert!(fx.schedule.is_empty() && fx.tallies.is_empty());
}

fn parked(decision: Box<Decision>) -> String {
    let Dispatched::DeadLettered { reason } = &decision.outcome else {
        panic!("expected a dead letter, got {:?}", decision.outcome);
    };
    assert_settles_only(&decision.commit, Settlement::DeadLetter(reason.clone()));
    assert_eq!(
        decision.note,
        Some(Note::DeadLettering {
            reason: reason.clone()
        })
    );
    reason.clone()
}

// Routing.

#[test]
fn a_message_without_a_handler_is_parked_without_asking_its_key() {
    let envelope = message("Refund", "m1");
    let refused = Handling::new(&ORDER, &envelope, || panic!("not asked")).unwrap_err();
    assert_eq!(
        parked(refused),
        "process manager `order` has no handler for message type `Refund`"
    );
}

#[test]
fn a_timeout_is_found_by_the_instance_it_names() {
    let envelope = reminder("o-1", Some("g1"));
    let handling = Handling::new(&ORDER, &envelope, || panic!("not asked")).expect("routed");
    assert_eq!(handling.lookup, Lookup::Id("o-1".to_owned()));
    assert_eq!(handling.lookup.key(), "o-1");
}

#[test]
fn a_timeout_that_names_no_instance_is_parked() {
    let envelope = Envelope {
        instance_id: None,
        ..reminder("o-1", None)
    };
    let refused = Handling::new(&ORDER, &envelope, || panic!("not asked")).unwrap_err();
    assert_eq!(parked(refused), "timeout `Remind` names no instance");
}

#[test]
fn a_message_without_a_correlation_value_is_parked() {
    let envelope = message("Paid", "m1");
    let refused = Handling::new(&ORDER, &envelope, || Ok(None)).unwrap_err();
    assert_eq!(
        parked(refused),
        "`Paid` has no correlation id; mark a field `#[correlation_id]` or correlate with `#[correlate]`"
    );
}

#[test]
fn a_correlation_value_that_cannot_be_read_is_parked_with_the_error() {
    let envelope = message("Paid", "m1");
    let error = || Err(ProcessError::invalid_payload("`number` is not a number"));
    let refused = Handling::new(&ORDER, &envelope, error).unwrap_err();
    assert_eq!(parked(refused), "`number` is not a number");
}

#[test]
fn the_lookup_follows_the_handlers_correlation() {
    let lookup = |envelope: &Envelope, key: &str| routed(&ORDER, envelope, key).lookup;
    assert_eq!(
        lookup(&message("Placed", "m1"), "o-9"),
        Lookup::Id("o-9".to_owned())
    );
    assert_eq!(
        lookup(&message("Paid", "m1"), "42"),
        Lookup::Field {
            field: "order_number",
            value: "42".to_owned()
        }
    );
    // A field a `many` handler correlates by is shared by every handler
    // that correlates by it.
    assert_eq!(
        lookup(&message("Retag", "m1"), "blue"),
        Lookup::Shared {
            field: "tag",
            value: "blue".to_owned(),
            many: false
        }
    );
    assert_eq!(
        lookup(&message("Tagged", "m1"), "blue"),
        Lookup::Shared {
            field: "tag",
            value: "blue".to_owned(),
            many: true
        }
    );
    // A copy addressed to one instance is for that one.
    let copy = Envelope {
        instance_id: Some("o-3".to_owned()),
        ..message("Tagged", "m1")
    };
    let found = lookup(&copy, "blue");
    assert_eq!(
        found,
        Lookup::Copy {
            id: "o-3".to_owned(),
            field: "tag",
            value: "blue".to_owned()
        }
    );
    assert_eq!(found.key(), "blue");
    // Only `many` handlers take a message addressed to an instance as a copy.
    let addressed = Envelope {
        instance_id: Some("o-3".to_owned()),
        ..message("Retag", "m1")
    };
    assert!(matches!(
        lookup(&addressed, "blue"),
        Lookup::Shared { many: false, .. }
    ));
}

// Picking among the holders of a shared value.

#[test]
fn a_shared_value_held_by_none_or_one_is_that_instance_or_none() {
    let envelope = message("Tagged", "m1");
    let handling = routed(&ORDER, &envelope, "blue");
    assert_eq!(handling.among(Vec::new()).unwrap(), None);
    assert_eq!(
        handling.among(vec!["o-2".to_owned()]).unwrap(),
        Some("o-2".to_owned())
    );
}

#[test]
fn a_many_message_held_by_several_is_copied_to_each_holder() {
    let envelope = message("Tagged", "m1");
    let handling = routed(&ORDER, &envelope, "blue");
    let ids = vec!["o-1".to_owned(), "o-2".to_owned(), "o-3".to_owned()];
    let mut fanned = decision(handling.among(ids).unwrap_err());
    assert_eq!(fanned.outcome, Dispatched::FannedOut { instances: 3 });
    let copies = std::mem::take(&mut fanned.commit.effects.enqueue);
    assert_eq!(copies.len(), 3);
    for (copy, id) in copies.iter().zip(["o-1", "o-2", "o-3"]) {
        let expected = Envelope {
            instance_id: Some(id.to_owned()),
            key: Some(id.to_owned()),
            key_field: None,
            ..envelope.clone()
        };
        assert_eq!(*copy, expected);
    }
    assert_settles_only(&fanned.commit, Settlement::Ack);
    assert!(!fanned.reread_on_conflict);
}

#[test]
fn a_single_message_held_by_several_is_ambiguous_for_on_error() {
    let envelope = message("Retag", "m1");
    let handling = routed(&ORDER, &envelope, "blue");
    let ids = vec!["o-1".to_owned(), "o-2".to_owned()];
    let failed = failing(handling.among(ids).unwrap_err());
    assert_eq!(failed.kind, FailureKind::Ambiguous);
    assert!(failed.instance.is_none());
    assert_eq!(
        failed.error,
        "`Retag` matched 2 instances of `order` by `tag` = `blue`, and one cannot be \
         picked: mark its handler `#[handles(many)]` to deliver it to each"
    );
}

// Admission: does the handler run on what was read?

#[test]
fn a_starting_message_creates_an_instance_named_by_its_correlation_id() {
    let envelope = message("Placed", "m1");
    let handling = routed(&ORDER, &envelope, "o-9");
    let admitted = handling.admit(None, false, &given()).unwrap();
    assert_eq!(
        admitted,
        Admitted::Start {
            id: Some("o-9".to_owned())
        }
    );
    let fresh = handling.start("o-9".to_owned(), "g7".to_owned(), AT);
    assert_eq!(
        fresh,
        ProcessInstance {
            process: "order".to_owned(),
            id: "o-9".to_owned(),
            generation: "g7".to_owned(),
            started_by: Some("m1".to_owned()),
            state: Value::Null,
            status: InstanceStatus::Active,
            version: 0,
            keys: Vec::new(),
            processed: Vec::new(),
            audit_log: Vec::new(),
            created_at: AT,
            updated_at: AT,
        }
    );
}

#[test]
fn a_start_correlated_by_a_field_leaves_the_id_to_the_store() {
    let envelope = message("Opened", "m1");
    let handling = routed(&ORDER, &envelope, "42");
    let admitted = handling.admit(None, false, &given()).unwrap();
    assert_eq!(admitted, Admitted::Start { id: None });
}

#[test]
fn a_start_on_nothing_need_not_be_read_again() {
    // Its save claims the id (or the value's entry): a stale read of
    // "nothing" loses the write, it does not settle the message.
    let envelope = message("Placed", "m1");
    let handling = routed(&ORDER, &envelope, "o-9");
    let admitted = handling.admit(None, true, &given()).unwrap();
    assert!(matches!(admitted, Admitted::Start { .. }));
}

#[test]
fn a_starting_message_continues_the_instance_it_finds() {
    let envelope = message("Placed", "m1");
    let handling = routed(&ORDER, &envelope, "o-1");
    let found = run(handling.admit(Some(instance()), false, &given()));
    assert_eq!(found, instance());
}

#[test]
fn a_strict_start_on_an_existing_instance_is_for_on_error_with_it() {
    let envelope = message("Strict", "m1");
    let handling = routed(&ORDER, &envelope, "o-1");
    let failed = failing(
        handling
            .admit(Some(instance()), false, &given())
            .unwrap_err(),
    );
    assert_eq!(failed.kind, FailureKind::AlreadyStarted);
    assert_eq!(failed.instance, Some(instance()));
    assert_eq!(
        failed.error,
        "instance `o-1` of `order` already exists (`#[starts(strict)]`)"
    );
    // Without one it starts like any start.
    let admitted = handling.admit(None, false, &given()).unwrap();
    assert!(matches!(admitted, Admitted::Start { .. }));
}

#[test]
fn a_strict_start_on_a_completed_instance_is_ignored_not_failed() {
    let envelope = message("Strict", "m1");
    let handling = routed(&ORDER, &envelope, "o-1");
    let done = ProcessInstance {
        status: InstanceStatus::Completed,
        ..instance()
    };
    let ignored = decision(handling.admit(Some(done), false, &given()).unwrap_err());
    assert_eq!(
        ignored.outcome,
        Dispatched::Ignored {
            reason: "instance is completed".to_owned()
        }
    );
}

#[test]
fn a_continuing_message_that_finds_nothing_is_unmatched() {
    let envelope = message("Paid", "m1");
    let handling = routed(&ORDER, &envelope, "42");
    let dropped = decision(handling.admit(None, false, &given()).unwrap_err());
    assert_eq!(
        dropped.outcome,
        Dispatched::Unmatched {
            key: "42".to_owned(),
            dead_lettered: false,
        }
    );
    assert_settles_only(&dropped.commit, Settlement::Ack);
    assert_eq!(
        dropped.note,
        Some(Note::Unmatched {
            correlation: "42".to_owned()
        })
    );
    // Parked instead, if so configured.
    let parking = Given {
        dead_letter_unmatched: true,
        ..given()
    };
    let parked = decision(handling.admit(None, false, &parking).unwrap_err());
    assert_settles_only(
        &parked.commit,
        Settlement::DeadLetter(
            "`Paid` for process manager `order` matched no instance (correlation `42`)".to_owned(),
        ),
    );
    assert_eq!(
        parked.outcome,
        Dispatched::Unmatched {
            key: "42".to_owned(),
            dead_lettered: true,
        }
    );
}

fn held_an_hour() -> Given<'static> {
    Given {
        hold: Duration::from_secs(3600),
        dead_letter_unmatched: true,
        ..given()
    }
}

#[test]
fn a_continuing_message_that_finds_nothing_is_held_under_what_it_looks_for() {
    // By a state field: held under it, until the engine's hold ends.
    let envelope = message("Paid", "m1");
    let handling = routed(&ORDER, &envelope, "42");
    let held = decision(handling.admit(None, false, &held_an_hour()).unwrap_err());
    let until = NOW + 3_600_000;
    assert_eq!(
        held.outcome,
        Dispatched::Held {
            key: "42".to_owned(),
            until_ms: until
        }
    );
    let hold = held.commit.hold.as_ref().expect("a hold");
    assert_eq!(
        (hold.field.as_deref(), hold.value.as_str()),
        (Some("order_number"), "42")
    );
    // Kept as it came, with its hold's end and what it waits for.
    assert_eq!(
        hold.envelope,
        Envelope {
            hold_until: Some(until),
            key: Some("42".to_owned()),
            key_field: Some("order_number".to_owned()),
            ..envelope.clone()
        }
    );
    assert_eq!(held.commit.instance, None);
    assert_eq!(held.commit.settle, Settlement::Ack);
    // A conflict means the instance exists by now: judged again.
    assert!(held.rereads_after(&Refusal::Conflict));
    // By id, under the handler's own hold.
    let envelope = message("Late", "m2");
    let handling = routed(&ORDER, &envelope, "o-9");
    let held = decision(handling.admit(None, false, &held_an_hour()).unwrap_err());
    let hold = held.commit.hold.as_ref().expect("a hold");
    assert_eq!((hold.field.as_deref(), hold.value.as_str()), (None, "o-9"));
    assert_eq!(hold.envelope.hold_until, Some(NOW + 30_000));
    // A first look is not enough to hold it: read again.
    assert!(matches!(
        handling.admit(None, true, &held_an_hour()),
        Err(Verdict::Reread)
    ));
}

#[test]
fn a_message_whose_hold_ended_takes_its_handlers_policy() {
    // Held before: its hold's end stands, however long the engine's is.
    let envelope = Envelope {
        hold_until: Some(NOW - 1),
        ..message("Paid", "m1")
    };
    let handling = routed(&ORDER, &envelope, "42");
    let parked = decision(handling.admit(None, false, &held_an_hour()).unwrap_err());
    assert_settles_only(
        &parked.commit,
        Settlement::DeadLetter(
            "`Paid` for process manager `order` matched no instance (correlation `42`): held for 1h"
                .to_owned(),
        ),
    );
    // Not yet over: held again until the same end.
    let envelope = Envelope {
        hold_until: Some(NOW + 5),
        ..message("Paid", "m1")
    };
    let handling = routed(&ORDER, &envelope, "42");
    let again = decision(handling.admit(None, false, &held_an_hour()).unwrap_err());
    assert_eq!(
        again
            .commit
            .hold
            .as_ref()
            .and_then(|h| h.envelope.hold_until),
        Some(NOW + 5)
    );
    // `then = drop` goes before the engine's dead-lettering.
    let envelope = Envelope {
        hold_until: Some(NOW),
        ..message("Late", "m2")
    };
    let handling = routed(&ORDER, &envelope, "o-9");
    let dropped = decision(handling.admit(None, false, &held_an_hour()).unwrap_err());
    assert_settles_only(&dropped.commit, Settlement::Ack);
    assert_eq!(
        dropped.outcome,
        Dispatched::Unmatched {
            key: "o-9".to_owned(),
            dead_lettered: false
        }
    );
}

#[test]
fn a_hold_the_store_refuses_falls_back_without_a_read() {
    let envelope = message("Paid", "m1");
    let handling = routed(&ORDER, &envelope, "42");
    let held = decision(handling.admit(None, false, &held_an_hour()).unwrap_err());
    // Full: the policy at once, saying why.
    let full = held.instead(&Refusal::HoldFull).expect("a fallback");
    assert_settles_only(
        &full.commit,
        Settlement::DeadLetter(format!(
            "`Paid` for process manager `order` matched no instance (correlation `42`): \
             {HOLD_CAP} messages are held for it already"
        )),
    );
    // A deleted instance handled it: a duplicate, acknowledged.
    let tombstoned = Refusal::Tombstoned {
        instance: "42".to_owned(),
    };
    let duplicate = held.instead(&tombstoned).expect("a fallback");
    assert_settles_only(&duplicate.commit, Settlement::Ack);
    assert!(matches!(duplicate.outcome, Dispatched::Duplicate { .. }));
    assert!(held.instead(&Refusal::Conflict).is_none());
}

#[test]
fn a_message_for_every_instance_sharing_a_value_is_not_held() {
    let envelope = message("Tagged", "m1");
    let handling = routed(&ORDER, &envelope, "red");
    let unmatched = handling.among(Vec::new()).unwrap();
    assert_eq!(unmatched, None);
    let dropped = decision(handling.admit(None, false, &held_an_hour()).unwrap_err());
    assert!(dropped.commit.hold.is_none());
    assert!(matches!(dropped.outcome, Dispatched::Unmatched { .. }));
}

#[test]
fn a_strict_continuing_message_that_finds_nothing_is_for_on_error() {
    let envelope = message("Shipped", "m1");
    let handling = routed(&ORDER, &envelope, "o-1");
    let failed = failing(handling.admit(None, false, &given()).unwrap_err());
    assert_eq!(failed.kind, FailureKind::NotStarted);
    assert!(failed.instance.is_none());
    assert_eq!(
        failed.error,
        "no instance of `order` for `o-1` (`#[handles(strict)]`)"
    );
}

#[test]
fn what_settles_a_message_without_a_versioned_write_is_not_decided_on_a_first_look() {
    let admit = |envelope: &Envelope, key: &str, found: Option<ProcessInstance>| {
        routed(&ORDER, envelope, key)
            .admit(found, true, &given())
            .unwrap_err()
    };
    // Nothing found: unmatched, strict failure, gone timeout.
    assert!(is_reread(&admit(&message("Paid", "m1"), "42", None)));
    assert!(is_reread(&admit(&message("Shipped", "m1"), "o-1", None)));
    assert!(is_reread(&admit(&reminder("o-1", None), "o-1", None)));
    // A duplicate.
    let seen = Some(instance());
    assert!(is_reread(&admit(&message("Note", "m0"), "o-1", seen)));
    // Another generation.
    let earlier = Some(instance());
    assert!(is_reread(&admit(
        &reminder("o-1", Some("g0")),
        "o-1",
        earlier
    )));
}

#[test]
fn a_message_the_instance_handled_already_is_a_duplicate() {
    let envelope = message("Note", "m0");
    let handling = routed(&ORDER, &envelope, "o-1");
    let dropped = decision(
        handling
            .admit(Some(instance()), false, &given())
            .unwrap_err(),
    );
    assert_eq!(
        dropped.outcome,
        Dispatched::Duplicate {
            instance: "o-1".to_owned()
        }
    );
    assert_settles_only(&dropped.commit, Settlement::Ack);
    // Even by a completed instance: nothing to record twice.
    let done = ProcessInstance {
        status: InstanceStatus::Completed,
        ..instance()
    };
    let again = decision(handling.admit(Some(done), false, &given()).unwrap_err());
    assert!(matches!(again.outcome, Dispatched::Duplicate { .. }));
    assert_eq!(again.commit.instance, None);
}

#[test]
fn a_completed_instance_ignores_a_message_in_its_audit_log() {
    let envelope = message("Note", "m1");
    let handling = routed(&ORDER, &envelope, "o-1");
    let done = ProcessInstance {
        status: InstanceStatus::Completed,
        ..instance()
    };
    let ignored = decision(
        handling
            .admit(Some(done.clone()), false, &given())
            .unwrap_err(),
    );
    let reason = "instance is completed".to_owned();
    assert_eq!(
        ignored.outcome,
        Dispatched::Ignored {
            reason: reason.clone()
        }
    );
    let written = ignored.commit.instance.clone().expect("written");
    assert_eq!(written.version, done.version, "a versioned write");
    assert_eq!(written.status, InstanceStatus::Completed);
    assert_eq!(written.processed, done.processed, "not handled");
    assert_eq!(
        written.audit_log,
        vec![ProcessAudit {
            at: AT,
            message_type: "Note".to_owned(),
            message_id: "m1".to_owned(),
            action: ProcessAuditAction::Ignored { reason },
        }]
    );
    assert_eq!(ignored.commit.settle, Settlement::Ack);
    assert_eq!(ignored.commit.handling, None);
    // The instance moved on if the write conflicts: judged again.
    assert!(ignored.rereads_after(&Refusal::Conflict));
    let tombstoned = Refusal::Tombstoned {
        instance: "o-1".to_owned(),
    };
    assert!(!ignored.rereads_after(&tombstoned));
}

#[test]
fn a_stopped_instance_ignores_messages_too() {
    let envelope = message("Note", "m1");
    let handling = routed(&ORDER, &envelope, "o-1");
    let stopped = ProcessInstance {
        status: InstanceStatus::Stopped,
        ..instance()
    };
    let ignored = decision(handling.admit(Some(stopped), false, &given()).unwrap_err());
    assert_eq!(
        ignored.outcome,
        Dispatched::Ignored {
            reason: "instance is stopped".to_owned()
        }
    );
    assert!(ignored.commit.instance.is_some());
}

#[test]
fn a_timeout_for_a_gone_instance_is_ignored() {
    let envelope = reminder("o-1", Some("g1"));
    let handling = routed(&ORDER, &envelope, "unused");
    let ignored = decision(handling.admit(None, false, &given()).unwrap_err());
    assert_eq!(
        ignored.outcome,
        Dispatched::Ignored {
            reason: "instance `o-1` does not exist".to_owned()
        }
    );
    assert_eq!(
        ignored.note,
        Some(Note::InstanceGone {
            instance: "o-1".to_owned()
        })
    );
    assert_settles_only(&ignored.commit, Settlement::Ack);
}

#[test]
fn a_timeout_for_another_generation_is_ignored() {
    let envelope = reminder("o-1", Some("g0"));
    let handling = routed(&ORDER, &envelope, "unused");
    let ignored = decision(
        handling
            .admit(Some(instance()), false, &given())
            .unwrap_err(),
    );
    assert_eq!(
        ignored.outcome,
        Dispatched::Ignored {
            reason: "`Remind` is for an earlier instance `o-1` (deleted, then created again)"
                .to_owned()
        }
    );
    assert_eq!(
        ignored.note,
        Some(Note::EarlierGeneration {
            instance: "o-1".to_owned()
        })
    );
    assert_settles_only(&ignored.commit, Settlement::Ack);
    // Its own generation, or a record that predates generations, runs it.
    let own = reminder("o-1", Some("g1"));
    run(routed(&ORDER, &own, "").admit(Some(instance()), false, &given()));
    let unknown = ProcessInstance {
        generation: String::new(),
        ..instance()
    };
    run(routed(&ORDER, &envelope, "").admit(Some(unknown), false, &given()));
    // So does a message that names no generation.
    let plain = message("Note", "m1");
    run(routed(&ORDER, &plain, "o-1").admit(Some(instance()), false, &given()));
}

#[test]
fn a_fanned_out_copy_is_for_its_instance_only_while_it_holds_the_value() {
    let copy = Envelope {
        instance_id: Some("o-1".to_owned()),
        ..message("Tagged", "m1")
    };
    let handling = routed(&ORDER, &copy, "blue");
    let holder = holding(&[("tag", "blue")]);
    assert_eq!(
        run(handling.admit(Some(holder.clone()), false, &given())),
        holder
    );
    let reason = "instance `o-1` no longer holds `tag` = `blue` (gone or changed since \
                  the message was handed to it)";
    for found in [Some(holding(&[("tag", "red")])), None] {
        // Not a question of staleness: the copy was handed to it.
        for first_look in [false, true] {
            let ignored = decision(
                handling
                    .admit(found.clone(), first_look, &given())
                    .unwrap_err(),
            );
            assert_eq!(
                ignored.outcome,
                Dispatched::Ignored {
                    reason: reason.to_owned()
                }
            );
            assert_settles_only(&ignored.commit, Settlement::Ack);
        }
    }
}

// The handler's run.

#[test]
fn a_handled_message_saves_the_state_and_acknowledges_it() {
    let save = paid(&ORDER, instance(), &[], |_| {});
    let written = save.instance().expect("written").clone();
    assert_eq!(written.state, json!({"n": 2}));
    assert_eq!(written.status, InstanceStatus::Active);
    assert_eq!(written.version, 3, "the version it was loaded with");
    assert_eq!(written.processed, vec!["m0".to_owned(), "m1".to_owned()]);
    assert_eq!(
        written.audit_log,
        vec![ProcessAudit {
            at: AT,
            message_type: "Paid".to_owned(),
            message_id: "m1".to_owned(),
            action: ProcessAuditAction::Handled,
        }]
    );
    assert_eq!(save.commit.handling.as_deref(), Some("m1"));
    assert_eq!(save.commit.tombstone_ttl, TTL);
    assert_eq!(save.commit.settle, Settlement::Ack);
    assert!(!save.commit.effects.delete);
    assert!(!save.created);
    assert!(save.before.is_none());
    assert_eq!(save.batched, 0);
    assert!(save.batchable());
    assert_eq!(
        save.outcome(),
        Dispatched::Handled {
            instance: "o-1".to_owned(),
            created: false
        }
    );
}

#[test]
fn a_new_instance_is_reported_created() {
    let envelope = message("Placed", "m1");
    let handling = routed(&ORDER, &envelope, "o-9");
    let fresh = handling.start("o-9".to_owned(), "g7".to_owned(), AT);
    let ctx = context(&fresh, &envelope);
    let save = handling
        .ran(fresh, &ctx, ok(json!({"n": 0}), &[]), &given())
        .unwrap();
    assert!(save.created);
    assert_eq!(save.instance().unwrap().version, 0, "created by the write");
    assert_eq!(
        save.outcome(),
        Dispatched::Handled {
            instance: "o-9".to_owned(),
            created: true
        }
    );
}

#[test]
fn a_failed_handler_leaves_the_instance_as_it_was_for_on_error() {
    let envelope = message("Note", "m1");
    let handling = routed(&ORDER, &envelope, "o-1");
    let ctx = context(&instance(), &envelope);
    let error = Err(ProcessError::new("card declined"));
    let failed = failing(handling.ran(instance(), &ctx, error, &given()).unwrap_err());
    assert_eq!(failed.kind, FailureKind::Handler);
    assert_eq!(failed.instance, Some(instance()));
    assert_eq!(failed.error, "card declined");
    // A new instance is not one yet.
    let fresh = handling.start("o-9".to_owned(), "g7".to_owned(), AT);
    let error = Err(ProcessError::new("card declined"));
    let failed = failing(handling.ran(fresh, &ctx, error, &given()).unwrap_err());
    assert_eq!(failed.instance, None);
}

#[test]
fn a_payload_the_handler_cannot_read_is_parked() {
    let envelope = message("Note", "m1");
    let handling = routed(&ORDER, &envelope, "o-1");
    let ctx = context(&instance(), &envelope);
    let error = Err(ProcessError::invalid_payload("missing field `amount`"));
    let verdict = handling.ran(instance(), &ctx, error, &given()).unwrap_err();
    assert_eq!(
        parked(Box::new(decision(verdict))),
        "missing field `amount`"
    );
}

#[test]
fn the_ids_remembered_for_duplicates_are_bounded() {
    let mut full = instance();
    full.processed = (0..PROCESSED).map(|n| format!("p{n}")).collect();
    let save = paid(&ORDER, full, &[], |_| {});
    let processed = &save.instance().unwrap().processed;
    assert_eq!(processed.len(), PROCESSED);
    assert_eq!(processed.first().map(String::as_str), Some("p1"));
    assert_eq!(processed.last().map(String::as_str), Some("m1"));
}

const PROCESSED: usize = super::save::PROCESSED_MEMORY;

#[test]
fn the_audit_log_is_bounded() {
    let mut full = instance();
    let old = |n: usize| ProcessAudit {
        at: Timestamp(n as u64),
        message_type: "Note".to_owned(),
        message_id: format!("a{n}"),
        action: ProcessAuditAction::Handled,
    };
    full.audit_log = (0..AUDIT_MEMORY).map(old).collect();
    let save = paid(&ORDER, full, &[], |_| {});
    let log = &save.instance().unwrap().audit_log;
    assert_eq!(log.len(), AUDIT_MEMORY);
    assert_eq!(log[0].message_id, "a1", "the oldest goes");
    assert_eq!(log[AUDIT_MEMORY - 1].message_id, "m1");
}

#[test]
fn mark_complete_keeps_a_completed_instance() {
    let held = holding(&[("order_number", "42")]);
    let save = paid(&ORDER, held, &[("order_number", "42")], |ctx| {
        ctx.mark_complete()
    });
    let written = save.instance().unwrap();
    assert_eq!(written.status, InstanceStatus::Completed);
    assert_eq!(
        written.audit_log.last().map(|a| &a.action),
        Some(&ProcessAuditAction::Completed)
    );
    let fx = &save.commit.effects;
    assert!(!fx.delete);
    assert!(fx.add_keys.is_empty() && fx.remove_keys.is_empty(), "kept");
}

#[test]
fn mark_complete_with_on_complete_delete_deletes_and_releases_every_entry() {
    let held = holding(&[("order_number", "42")]);
    let keys = [("order_number", "42"), ("ref", "r-1")];
    let save = paid(&FLEETING, held, &keys, |ctx| ctx.mark_complete());
    let fx = &save.commit.effects;
    assert!(fx.delete);
    assert!(
        fx.add_keys.is_empty(),
        "nothing claimed by a deleted instance"
    );
    assert_eq!(fx.remove_keys, entries(&keys), "old and new released");
    assert!(!save.batchable(), "nothing may join a deleted instance");
    // The tombstone remembers what it handled for this long.
    assert_eq!(save.commit.tombstone_ttl, TTL);
    assert_eq!(save.commit.handling.as_deref(), Some("m1"));
}

#[test]
fn stop_deletes_the_instance_whatever_on_complete_says() {
    let held = holding(&[("order_number", "42")]);
    let save = paid(&ORDER, held, &[("order_number", "42")], |ctx| ctx.stop());
    let fx = &save.commit.effects;
    assert!(fx.delete);
    assert_eq!(fx.remove_keys, entries(&[("order_number", "42")]));
    assert_eq!(save.instance().unwrap().status, InstanceStatus::Active);
}

#[test]
fn changed_correlation_values_move_their_entries() {
    let held = holding(&[("order_number", "41"), ("ref", "r-1")]);
    let keys = [("order_number", "42"), ("ref", "r-1"), ("note", "")];
    let save = paid(&ORDER, held, &keys, |_| {});
    let fx = &save.commit.effects;
    assert_eq!(fx.add_keys, entries(&[("order_number", "42")]));
    assert_eq!(fx.remove_keys, entries(&[("order_number", "41")]));
    assert!(fx.add_shared.is_empty() && fx.remove_shared.is_empty());
    // An empty value is no entry.
    assert_eq!(
        save.instance().unwrap().keys,
        entries(&[("order_number", "42"), ("ref", "r-1")])
    );
    // Unchanged values claim and release nothing.
    let same = holding(&[("order_number", "42")]);
    let save = paid(&ORDER, same, &[("order_number", "42")], |_| {});
    assert!(save.commit.effects.add_keys.is_empty());
    assert!(save.commit.effects.remove_keys.is_empty());
}

#[test]
fn shared_entries_join_their_sets_on_every_save_and_drop_legacy_entries() {
    // Held before the field was shared: an exclusive entry.
    let legacy = holding(&[("tag", "blue")]);
    let save = paid(&ORDER, legacy, &[("tag", "blue")], |_| {});
    let fx = &save.commit.effects;
    assert!(fx.add_keys.is_empty());
    assert_eq!(fx.add_shared, entries(&[("tag", "blue")]), "joined (again)");
    assert_eq!(
        fx.remove_keys,
        entries(&[("tag", "blue")]),
        "legacy dropped"
    );
    assert!(fx.remove_shared.is_empty());
    // A changed value leaves the old set and joins the new one.
    let held = holding(&[("tag", "blue")]);
    let save = paid(&ORDER, held, &[("tag", "red")], |_| {});
    let fx = &save.commit.effects;
    assert_eq!(fx.add_shared, entries(&[("tag", "red")]));
    assert_eq!(fx.remove_shared, entries(&[("tag", "blue")]));
    assert!(fx.add_keys.is_empty());
    assert_eq!(fx.remove_keys, entries(&[("tag", "red")]));
}

#[test]
fn a_completed_instance_leaves_its_shared_sets() {
    let held = holding(&[("tag", "blue")]);
    let save = paid(&ORDER, held, &[("tag", "blue")], |ctx| ctx.mark_complete());
    let fx = &save.commit.effects;
    assert!(fx.add_shared.is_empty());
    assert_eq!(fx.remove_shared, entries(&[("tag", "blue")]));
    assert!(!fx.delete);
    // Deleted, it leaves them with its entries.
    let held = holding(&[("tag", "blue")]);
    let save = paid(&FLEETING, held, &[("tag", "blue")], |ctx| {
        ctx.mark_complete()
    });
    let fx = &save.commit.effects;
    assert!(fx.delete && fx.add_shared.is_empty());
    assert_eq!(fx.remove_shared, entries(&[("tag", "blue")]));
}

fn outgoing(target: Target, message_type: &str) -> Outgoing {
    Outgoing {
        target,
        message_type: message_type.to_owned(),
        payload: json!({"id": 5}),
        correlation_id: Some("o-1".to_owned()),
    }
}

fn sends(ctx: &mut ProcessContext) {
    ctx.outgoing
        .push(outgoing(Target::Endpoint("billing".to_owned()), "Charge"));
    ctx.outgoing.push(outgoing(Target::Publish, "Placed"));
}

#[test]
fn sent_and_published_messages_carry_ids_derived_from_the_message() {
    let save = paid(&ORDER, instance(), &[], sends);
    let fx = &save.commit.effects;
    let first = derived_id("m1", "o-1", "0");
    let second = derived_id("m1", "o-1", "1");
    assert_ne!(first, second);
    let endpoints: Vec<(&str, EndpointMessage)> = fx
        .endpoints
        .iter()
        .map(|(name, raw)| (name.as_str(), EndpointMessage::parse(raw).unwrap()))
        .collect();
    assert_eq!(endpoints.len(), 2);
    let (name, charge) = &endpoints[0];
    assert_eq!(*name, "billing");
    assert_eq!(charge.message_id, first);
    assert_eq!(charge.message_type, "Charge");
    assert_eq!(charge.from, "order");
    assert_eq!(charge.sent_at, NOW);
    assert_eq!(charge.correlation_id.as_deref(), Some("o-1"));
    assert_eq!(
        charge.headers.get("instance").map(String::as_str),
        Some("o-1")
    );
    assert_eq!(charge.payload, json!({"id": 5}));
    // A published message goes to the published log, and to every
    // process manager that handles it, routed as each finds its instance.
    let (name, placed) = &endpoints[1];
    assert_eq!(*name, PUBLISHED);
    assert_eq!(placed.message_id, second);
    let routed: Vec<_> = fx
        .enqueue
        .iter()
        .map(|e| (e.process.as_str(), e.key.as_deref(), e.key_field.as_deref()))
        .collect();
    assert_eq!(
        routed,
        vec![
            ("order", Some("order:5"), Some("ref")),
            ("billing", Some("billing:5"), Some("ref"))
        ]
    );
    for envelope in &fx.enqueue {
        assert_eq!(envelope.message_id, second);
        assert_eq!(envelope.message_type, "Placed");
        assert_eq!(envelope.kind, EnvelopeKind::Message);
        assert_eq!(envelope.payload, json!({"id": 5}));
        assert_eq!(envelope.traceparent, given().traceparent);
        assert_eq!(
            (envelope.instance_id.as_ref(), envelope.failures),
            (None, 0)
        );
    }
}

#[test]
fn a_handler_run_again_emits_the_same_messages() {
    // After a conflict (or a redelivery) the receivers see duplicates
    // they can drop.
    let once = paid(&ORDER, instance(), &[], sends);
    let again = paid(&ORDER, instance(), &[], sends);
    assert_eq!(
        once.commit.effects.endpoints,
        again.commit.effects.endpoints
    );
    assert_eq!(once.commit.effects.enqueue, again.commit.effects.enqueue);
    // Another message's are others.
    let envelope = message("Paid", "m2");
    let handling = routed(&ORDER, &envelope, "42");
    let mut ctx = context(&instance(), &envelope);
    sends(&mut ctx);
    let other = handling
        .ran(instance(), &ctx, ok(json!({}), &[]), &given())
        .unwrap();
    assert_ne!(
        other.commit.effects.endpoints,
        once.commit.effects.endpoints
    );
    assert_ne!(
        other.commit.effects.enqueue[0].message_id,
        once.commit.effects.enqueue[0].message_id
    );
}

#[test]
fn timeouts_are_scheduled_from_now_for_this_generation() {
    let remind = |ctx: &mut ProcessContext| {
        ctx.timeouts.push(ScheduledTimeout {
            delay: Duration::from_secs(5),
            message_type: "Remind".to_owned(),
            payload: json!({"again": true}),
        });
        ctx.timeouts.push(ScheduledTimeout {
            delay: Duration::MAX,
            message_type: "Remind".to_owned(),
            payload: json!({}),
        });
    };
    let save = paid(&ORDER, instance(), &[], remind);
    let schedule = &save.commit.effects.schedule;
    assert_eq!(schedule.len(), 2);
    let (due_ms, timeout) = &schedule[0];
    assert_eq!(*due_ms, NOW + 5_000);
    assert_eq!(
        *timeout,
        Envelope {
            message_id: derived_id("m1", "o-1", "t0"),
            process: "order".to_owned(),
            message_type: "Remind".to_owned(),
            payload: json!({"again": true}),
            kind: EnvelopeKind::Timeout,
            instance_id: Some("o-1".to_owned()),
            generation: Some("g1".to_owned()),
            failures: 0,
            key: None,
            key_field: None,
            traceparent: given().traceparent,
            due_ms: Some(NOW + 5_000),
            hops: 0,
            hold_until: None,
        }
    );
    assert_eq!(schedule[1].0, u64::MAX, "an absurd delay saturates");
    // A record from before generations names none.
    let unknown = ProcessInstance {
        generation: String::new(),
        ..instance()
    };
    let save = paid(&ORDER, unknown, &[], remind);
    assert_eq!(save.commit.effects.schedule[0].1.generation, None);
}

#[test]
fn tallies_open_with_the_write_and_keep_the_state_before_for_on_error() {
    let open = |ctx: &mut ProcessContext| {
        ctx.tallies.push(TallyOpening {
            name: "parts".to_owned(),
            items: vec!["b".to_owned(), "a".to_owned(), "b".to_owned()],
            deadline: Some(Duration::from_secs(10)),
            keep_for: Duration::from_secs(3600),
        });
        ctx.polls
            .push((Duration::from_secs(30), "parts".to_owned()));
    };
    let save = paid(&ORDER, instance(), &[], open);
    assert_eq!(save.before, Some(instance()), "as it was");
    assert!(!save.batchable());
    let fx = &save.commit.effects;
    assert_eq!(fx.tallies.len(), 1);
    let opened = &fx.tallies[0];
    let reference = TallyRef {
        process: "order".to_owned(),
        instance: "o-1".to_owned(),
        generation: "g1".to_owned(),
        name: "parts".to_owned(),
    };
    assert_eq!(opened.tally, reference);
    assert_eq!(opened.items, vec!["a".to_owned(), "b".to_owned()]);
    assert_eq!(opened.keep_for, Duration::from_secs(3600));
    let done = derived_id("m1", "o-1", "completed:parts");
    assert_eq!(opened.completion.message_id, done);
    assert_eq!(opened.completion_late.message_id, done);
    assert_eq!(opened.completion.payload["total"], json!(2));
    assert_eq!(opened.completion.payload["late"], json!(false));
    assert_eq!(opened.completion_late.payload["late"], json!(true));
    assert_eq!(opened.completion.traceparent, given().traceparent);
    // Its deadline and the poll are reports, due from now.
    let reports: Vec<_> = fx
        .schedule
        .iter()
        .map(|(due, e)| (*due, e.kind, e.message_id.clone(), e.payload.clone()))
        .collect();
    assert_eq!(
        reports,
        vec![
            (
                NOW + 10_000,
                EnvelopeKind::TallyReport,
                derived_id("m1", "o-1", "deadline:parts"),
                json!({"tally": "parts", "deadline": true})
            ),
            (
                NOW + 30_000,
                EnvelopeKind::TallyReport,
                derived_id("m1", "o-1", "poll0:parts"),
                json!({"tally": "parts", "deadline": false})
            ),
        ]
    );
    // A new instance has no state before.
    let envelope = message("Placed", "m1");
    let handling = routed(&ORDER, &envelope, "o-9");
    let fresh = handling.start("o-9".to_owned(), "g7".to_owned(), AT);
    let mut ctx = context(&fresh, &envelope);
    open(&mut ctx);
    let save = handling
        .ran(fresh, &ctx, ok(json!({}), &[]), &given())
        .unwrap();
    assert_eq!(save.before, None);
}

// A refused write.

#[test]
fn a_conflict_runs_the_handler_again_on_a_fresh_read() {
    let save = paid(&ORDER, instance(), &[], |_| {});
    assert!(is_reread(&save.refused(Refusal::Conflict)));
}

#[test]
fn a_late_duplicate_of_a_deleted_instances_message_is_dropped() {
    let save = paid(&ORDER, instance(), &[], sends);
    let refusal = Refusal::Tombstoned {
        instance: "o-0".to_owned(),
    };
    let dropped = decision(save.refused(refusal.clone()));
    assert_eq!(
        dropped.outcome,
        Dispatched::Duplicate {
            instance: "o-0".to_owned()
        }
    );
    assert_eq!(
        dropped.note,
        Some(Note::DeletedDuplicate {
            instance: "o-0".to_owned()
        })
    );
    assert_settles_only(&dropped.commit, Settlement::Ack);
    assert!(!dropped.rereads_after(&Refusal::Conflict));
    // With messages batched in, any of them may be the duplicate: each
    // goes on alone, this one again.
    let mut batched = paid(&ORDER, instance(), &[], |_| {});
    batched.batched = 1;
    assert!(is_reread(&batched.refused(refusal)));
}

#[test]
fn a_tally_that_exists_already_is_for_on_error_with_the_state_before() {
    let open = |ctx: &mut ProcessContext| {
        ctx.tallies.push(TallyOpening {
            name: "parts".to_owned(),
            items: vec!["a".to_owned()],
            deadline: None,
            keep_for: Duration::from_secs(60),
        });
    };
    let save = paid(&ORDER, instance(), &[], open);
    let error = "tally `parts` of instance `o-1` of `order` is already open".to_owned();
    let failed = failing(save.refused(Refusal::TallyExists {
        error: error.clone(),
    }));
    assert_eq!(failed.kind, FailureKind::Handler);
    assert_eq!(
        failed.instance,
        Some(instance()),
        "not as the handler left it"
    );
    assert_eq!(failed.error, error);
}

// `#[on_error]`.

fn failed_note(failures: u32, instance: Option<ProcessInstance>) -> (Envelope, Failing) {
    let envelope = Envelope {
        failures,
        ..message("Note", "m1")
    };
    let failing = Failing {
        instance,
        kind: FailureKind::Handler,
        error: "card declined".to_owned(),
    };
    (envelope, failing)
}

#[test]
fn on_error_hears_of_the_failure_counted() {
    let (envelope, failing) = failed_note(2, Some(instance()));
    let handling = routed(&ORDER, &envelope, "o-1");
    assert_eq!(
        handling.failure(&failing),
        Failure {
            kind: FailureKind::Handler,
            error: "card declined".to_owned(),
            message_type: "Note".to_owned(),
            message_id: "m1".to_owned(),
            instance_id: Some("o-1".to_owned()),
            failures: 3,
        }
    );
    let (_, unknown) = failed_note(0, None);
    assert_eq!(handling.failure(&unknown).instance_id, None);
}

#[test]
fn retry_enqueues_the_message_again_with_its_failure_counted() {
    let (envelope, failing) = failed_note(1, Some(instance()));
    let handling = routed(&ORDER, &envelope, "o-1");
    let mut retried = handling.failed(failing, ErrorAction::Retry, &given());
    assert_eq!(
        retried.outcome,
        Dispatched::Failed {
            action: ErrorAction::Retry,
            error: "card declined".to_owned()
        }
    );
    let again = std::mem::take(&mut retried.commit.effects.enqueue);
    assert_eq!(
        again,
        vec![Envelope {
            failures: 2,
            ..envelope.clone()
        }]
    );
    // Nothing else: the instance is as it was.
    assert_settles_only(&retried.commit, Settlement::Ack);
    assert!(!retried.reread_on_conflict);
}

#[test]
fn retry_after_schedules_the_message_again() {
    let (envelope, failing) = failed_note(0, Some(instance()));
    let handling = routed(&ORDER, &envelope, "o-1");
    let delay = Duration::from_millis(250);
    let mut retried = handling.failed(failing, ErrorAction::RetryAfter(delay), &given());
    let again = std::mem::take(&mut retried.commit.effects.schedule);
    assert_eq!(
        again,
        vec![(
            NOW + 250,
            Envelope {
                failures: 1,
                ..envelope.clone()
            }
        )]
    );
    assert_settles_only(&retried.commit, Settlement::Ack);
}

#[test]
fn skip_drops_the_message_with_an_entry_in_the_instances_audit_log() {
    let (envelope, failing) = failed_note(0, Some(instance()));
    let handling = routed(&ORDER, &envelope, "o-1");
    let mut skipped = handling.failed(failing, ErrorAction::Skip, &given());
    let written = skipped.commit.instance.take().expect("written");
    assert_eq!(written.status, InstanceStatus::Active);
    assert_eq!(written.state, instance().state);
    assert_eq!(written.processed, instance().processed, "not handled");
    assert_eq!(
        written.audit_log,
        vec![ProcessAudit {
            at: AT,
            message_type: "Note".to_owned(),
            message_id: "m1".to_owned(),
            action: ProcessAuditAction::Skipped {
                error: "card declined".to_owned()
            },
        }]
    );
    assert_settles_only(&skipped.commit, Settlement::Ack);
    // Without an instance, nothing to write.
    let (_, failing) = failed_note(0, None);
    let skipped = handling.failed(failing, ErrorAction::Skip, &given());
    assert_settles_only(&skipped.commit, Settlement::Ack);
}

#[test]
fn stop_stops_the_instance_and_parks_the_message() {
    let (envelope, failing) = failed_note(2, Some(instance()));
    let handling = routed(&ORDER, &envelope, "o-1");
    let mut stopped = handling.failed(failing, ErrorAction::Stop, &given());
    let written = stopped.commit.instance.take().expect("written");
    assert_eq!(written.status, InstanceStatus::Stopped);
    assert_eq!(
        written.audit_log.last().map(|a| &a.action),
        Some(&ProcessAuditAction::Stopped {
            error: "card declined".to_owned()
        })
    );
    let reason = "process `order` stopped after: card declined".to_owned();
    assert_settles_only(&stopped.commit, Settlement::DeadLetter(reason.clone()));
    assert_eq!(
        stopped.outcome,
        Dispatched::Failed {
            action: ErrorAction::Stop,
            error: "card declined".to_owned()
        }
    );
    // Without an instance the message is parked all the same.
    let (_, failing) = failed_note(0, None);
    let stopped = handling.failed(failing, ErrorAction::Stop, &given());
    assert_settles_only(&stopped.commit, Settlement::DeadLetter(reason));
}

// Batching: messages that waited for the instance join the write.

#[test]
fn only_a_fresh_message_for_this_instance_may_join_its_write() {
    let held = holding(&[("order_number", "42"), ("tag", "blue")]);
    let joins_with = |envelope: &Envelope, key: Option<&str>| {
        joins(&ORDER, &held, envelope, || key.map(str::to_owned))
    };
    // For it: by id, by a value it holds, a timeout it asked for.
    assert!(joins_with(&message("Note", "m2"), Some("o-1")));
    assert!(joins_with(&message("Paid", "m2"), Some("42")));
    let own = reminder("o-1", Some("g1"));
    assert!(joins(&ORDER, &held, &own, || panic!("not asked")));
    // Not for it.
    assert!(!joins_with(&message("Note", "m2"), Some("o-2")));
    assert!(!joins_with(&message("Paid", "m2"), Some("41")));
    assert!(!joins_with(&message("Paid", "m2"), None));
    assert!(!joins_with(&reminder("o-2", Some("g1")), None));
    // A shared value may be held by others too.
    assert!(!joins_with(&message("Retag", "m2"), Some("blue")));
    // Not a plain handling of it: a duplicate, another generation, a
    // tally report (filled in when handled alone), a strict start, no
    // handler.
    assert!(!joins_with(&message("Note", "m0"), Some("o-1")));
    assert!(!joins_with(&reminder("o-1", Some("g0")), None));
    let report = Envelope {
        kind: EnvelopeKind::TallyReport,
        ..message("Note", "m2")
    };
    assert!(!joins_with(&report, Some("o-1")));
    assert!(!joins_with(&message("Strict", "m2"), Some("o-1")));
    assert!(!joins_with(&message("Refund", "m2"), Some("o-1")));
    // Nor to an instance that is done.
    let done = ProcessInstance {
        status: InstanceStatus::Completed,
        ..held.clone()
    };
    assert!(!joins(&ORDER, &done, &message("Note", "m2"), || Some(
        "o-1".to_owned()
    )));
}

/// `Note` `m2` joined to `save`, by a handler that leaves `keys` and does
/// what `ctx` says.
fn join_note(
    save: &mut Save,
    def: &'static ProcessDefinition,
    keys: &[(&'static str, &str)],
    ctx: impl FnOnce(&mut ProcessContext),
) -> bool {
    let envelope = message("Note", "m2");
    let mut context = context(save.instance().unwrap(), &envelope);
    ctx(&mut context);
    let handled = ok(json!({"n": 3}), keys).unwrap();
    let later = Given {
        now_ms: NOW + 7,
        ..given()
    };
    save.join(def, &envelope, &context, handled, &later)
}

#[test]
fn a_joined_message_is_handled_in_the_same_write() {
    let keys = [("order_number", "42"), ("tag", "blue")];
    let held = holding(&keys);
    let mut save = paid(&ORDER, held, &keys, sends);
    let remind = |ctx: &mut ProcessContext| {
        sends(ctx);
        ctx.timeouts.push(ScheduledTimeout {
            delay: Duration::from_secs(1),
            message_type: "Remind".to_owned(),
            payload: json!({}),
        });
    };
    assert!(join_note(&mut save, &ORDER, &keys, remind));
    assert_eq!(save.batched, 1);
    let written = save.instance().unwrap();
    assert_eq!(written.state, json!({"n": 3}), "the last handler's state");
    assert_eq!(
        written.processed,
        vec!["m0".to_owned(), "m1".to_owned(), "m2".to_owned()]
    );
    let handled: Vec<_> = written
        .audit_log
        .iter()
        .map(|a| a.message_id.as_str())
        .collect();
    assert_eq!(handled, vec!["m1", "m2"]);
    let fx = &save.commit.effects;
    assert_eq!(save.commit.handling.as_deref(), Some("m1"), "the first's");
    // Each one's outbox, in turn, with its own ids; delays run from when
    // it ran.
    assert_eq!(fx.endpoints.len(), 4);
    assert_eq!(fx.enqueue.len(), 4);
    let ids: Vec<_> = fx.enqueue.iter().map(|e| e.message_id.clone()).collect();
    assert_eq!(ids[0], derived_id("m1", "o-1", "1"));
    assert_eq!(ids[2], derived_id("m2", "o-1", "1"));
    assert_eq!(fx.schedule, {
        let timeout = Envelope {
            message_id: derived_id("m2", "o-1", "t0"),
            process: "order".to_owned(),
            message_type: "Remind".to_owned(),
            payload: json!({}),
            kind: EnvelopeKind::Timeout,
            instance_id: Some("o-1".to_owned()),
            generation: Some("g1".to_owned()),
            failures: 0,
            key: None,
            key_field: None,
            traceparent: given().traceparent,
            due_ms: Some(NOW + 7 + 1_000),
            hops: 0,
            hold_until: None,
        };
        vec![(NOW + 7 + 1_000, timeout)]
    });
    // The shared set is joined once.
    assert_eq!(fx.add_shared, entries(&[("tag", "blue")]));
    assert_eq!(
        save.outcome(),
        Dispatched::Handled {
            instance: "o-1".to_owned(),
            created: false
        }
    );
}

#[test]
fn a_joined_message_that_does_more_than_save_the_instance_is_left_out() {
    let keys = [("order_number", "42"), ("tag", "blue")];
    let base = || paid(&ORDER, holding(&keys), &keys, |_| {});
    let untouched = |save: &Save| {
        assert_eq!(save.batched, 0);
        assert_eq!(save.instance().unwrap().state, json!({"n": 2}));
        assert_eq!(save.instance().unwrap().processed.len(), 2);
    };
    // It changes the correlation values.
    let mut save = base();
    assert!(!join_note(
        &mut save,
        &ORDER,
        &[("order_number", "43")],
        |_| {}
    ));
    untouched(&save);
    // It opens a tally.
    let mut save = base();
    let tally = |ctx: &mut ProcessContext| {
        ctx.tallies.push(TallyOpening {
            name: "parts".to_owned(),
            items: vec!["a".to_owned()],
            deadline: None,
            keep_for: Duration::from_secs(60),
        })
    };
    assert!(!join_note(&mut save, &ORDER, &keys, tally));
    untouched(&save);
    // It deletes the instance.
    let mut save = paid(&FLEETING, holding(&keys), &keys, |_| {});
    assert!(!join_note(&mut save, &FLEETING, &keys, |c| c.mark_complete()));
    untouched(&save);
    let mut save = base();
    assert!(!join_note(&mut save, &ORDER, &keys, |c| c.stop()));
    untouched(&save);
    // It completes the instance, which leaves its shared sets.
    let mut save = base();
    assert!(!join_note(&mut save, &ORDER, &keys, |c| c.mark_complete()));
    untouched(&save);
    assert!(save.commit.effects.remove_shared.is_empty());
}

// Tally reports.

#[test]
fn a_due_tally_report_with_nothing_to_report_is_acknowledged() {
    let ignored =
        unreported("tally `parts` of instance `o-1` of `order` no longer exists".to_owned());
    assert_eq!(
        ignored.outcome,
        Dispatched::Ignored {
            reason: "tally `parts` of instance `o-1` of `order` no longer exists".to_owned()
        }
    );
    assert!(matches!(ignored.note, Some(Note::NotReported { .. })));
    assert_settles_only(&ignored.commit, Settlement::Ack);
}

#[test]
fn a_due_tally_report_is_filled_in_from_the_progress_read() {
    let reference = TallyRef {
        process: "order".to_owned(),
        instance: "o-1".to_owned(),
        generation: "g1".to_owned(),
        name: "parts".to_owned(),
    };
    let due = Envelope {
        kind: EnvelopeKind::TallyReport,
        instance_id: Some("o-1".to_owned()),
        generation: Some("g1".to_owned()),
        payload: json!({"tally": "parts", "deadline": true}),
        ..message("TallyStatus", "r-1")
    };
    let progress = |complete: bool| TallyProgress {
        total: 3,
        checked: 1,
        missing: vec!["c".to_owned(), "b".to_owned()],
        complete,
        deadline_passed: true,
    };
    assert_eq!(
        tally::report(&due, &reference, true, None),
        Err("tally `parts` of instance `o-1` of `order` no longer exists".to_owned())
    );
    assert_eq!(
        tally::report(&due, &reference, true, Some(progress(true))),
        Err("tally `parts` of instance `o-1` of `order` completed before its deadline".to_owned())
    );
    // A poll reports a complete tally all the same.
    assert!(tally::report(&due, &reference, false, Some(progress(true))).is_ok());
    let filled = tally::report(&due, &reference, true, Some(progress(false))).unwrap();
    assert_eq!(filled.kind, EnvelopeKind::Message);
    assert_eq!(filled.message_id, "r-1");
    assert_eq!(filled.instance_id.as_deref(), Some("o-1"));
    assert_eq!(filled.payload["missing"], json!(["b", "c"]));
    assert_eq!(filled.payload["deadline"], json!(true));
    assert_eq!(filled.payload["checked"], json!(1));
}
