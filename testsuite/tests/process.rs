//! Process managers through the test kit (virtual time, the real routing
//! and correlation code) and through the engine on the in-memory backend.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use saga_runtime::backend::ProcessAuditAction;
use saga_runtime::prelude::*;
use saga_runtime::process::Dispatched;
use saga_runtime::testing::ProcessTest;
use serde::{Deserialize, Serialize};

// ---- overdue invoices: either order, a 40-day check, completion ----

#[derive(Message, Serialize, Deserialize)]
struct InvoiceIssued {
    invoice_number: u64,
}

#[derive(Message, Serialize, Deserialize)]
struct InvoicePaid {
    invoice_number: u64,
}

#[derive(Message, Serialize, Deserialize)]
struct CheckPayment;

#[derive(Debug, Message, Serialize, Deserialize, PartialEq)]
struct InvoiceOverdue {
    invoice_number: u64,
}

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
struct Invoice {
    invoice_number: u64,
    issued: bool,
    paid: bool,
    checks: u32,
}

const FORTY_DAYS: Duration = Duration::from_secs(40 * 24 * 3600);

struct Overdue;

#[process_manager(name = "overdue", state = Invoice)]
impl Overdue {
    #[starts]
    #[correlate(state.invoice_number = msg.invoice_number)]
    async fn issued(
        &self,
        _msg: InvoiceIssued,
        state: &mut Invoice,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.issued = true;
        if state.paid {
            ctx.mark_complete();
        } else {
            ctx.request_timeout(FORTY_DAYS, CheckPayment);
        }
        Ok(())
    }

    #[starts]
    #[correlate(state.invoice_number = msg.invoice_number)]
    async fn paid(
        &self,
        _msg: InvoicePaid,
        state: &mut Invoice,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.paid = true;
        if state.issued {
            ctx.mark_complete();
        }
        Ok(())
    }

    #[timeout]
    async fn check(
        &self,
        _t: CheckPayment,
        state: &mut Invoice,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.checks += 1;
        if !state.paid {
            ctx.publish(InvoiceOverdue {
                invoice_number: state.invoice_number,
            });
        }
        ctx.mark_complete();
        Ok(())
    }
}

#[tokio::test]
async fn out_of_order_paid_before_issued_loses_nothing() {
    let mut t = ProcessTest::new(Overdue);
    assert!(matches!(
        t.when(InvoicePaid { invoice_number: 7 }).await,
        Dispatched::Handled { created: true, .. }
    ));
    assert!(matches!(
        t.when(InvoiceIssued { invoice_number: 7 }).await,
        Dispatched::Handled { created: false, .. }
    ));
    let state = t.state_by("invoice_number", "7").await.unwrap();
    assert_eq!(
        state,
        Invoice {
            invoice_number: 7,
            issued: true,
            paid: true,
            checks: 0
        }
    );
    assert_eq!(
        t.instances().await.len(),
        1,
        "both messages reached one instance"
    );
    assert!(
        t.scheduled().await.is_empty(),
        "paid first: no check needed"
    );
    t.advance(FORTY_DAYS * 2).await;
    assert!(t.published().await.is_empty());
}

#[tokio::test]
async fn the_check_fires_after_forty_days_and_publishes_only_if_unpaid() {
    let mut t = ProcessTest::new(Overdue);
    t.given(InvoiceIssued { invoice_number: 1 }).await;
    t.given(InvoiceIssued { invoice_number: 2 }).await;
    t.when(InvoicePaid { invoice_number: 2 }).await;
    let scheduled = t.scheduled().await;
    assert_eq!(scheduled.len(), 2);
    assert_eq!(scheduled[0].due_in, FORTY_DAYS);
    assert_eq!(scheduled[0].message_type, "CheckPayment");

    assert!(
        t.advance(FORTY_DAYS - Duration::from_secs(1))
            .await
            .is_empty(),
        "not yet"
    );
    let fired = t.advance(Duration::from_secs(1)).await;
    assert_eq!(fired.len(), 2);
    // Invoice 1 was unpaid: overdue. Invoice 2 was complete: its check is ignored.
    let published: Vec<InvoiceOverdue> = t
        .published()
        .await
        .iter()
        .filter_map(|m| m.decode())
        .collect();
    assert_eq!(published, [InvoiceOverdue { invoice_number: 1 }]);
    assert_eq!(t.state_by("invoice_number", "1").await.unwrap().checks, 1);
    assert_eq!(
        t.state_by("invoice_number", "2").await.unwrap().checks,
        0,
        "ignored after completion"
    );
    assert!(fired
        .iter()
        .any(|d| matches!(d, Dispatched::Ignored { .. })));
    let two = t
        .instances()
        .await
        .into_iter()
        .find(|i| i.state["invoice_number"] == 2)
        .unwrap();
    assert!(two
        .audit_log
        .iter()
        .any(|e| matches!(e.action, ProcessAuditAction::Ignored { .. })
            && e.message_type == "CheckPayment"));
}

#[tokio::test]
async fn duplicate_delivery_changes_nothing_the_second_time() {
    let mut t = ProcessTest::new(Overdue);
    assert!(matches!(
        t.when_with_id("m-1", InvoiceIssued { invoice_number: 9 })
            .await,
        Dispatched::Handled { .. }
    ));
    let before = t.instances().await;
    assert!(matches!(
        t.when_with_id("m-1", InvoiceIssued { invoice_number: 9 })
            .await,
        Dispatched::Duplicate { .. }
    ));
    assert_eq!(
        t.instances().await,
        before,
        "state, version and audit log unchanged"
    );
    assert_eq!(t.scheduled().await.len(), 1, "no second timeout");
}

// ---- strict routing, errors and the default policy ----

#[derive(Message, Serialize, Deserialize)]
struct Open {
    #[correlation_id]
    id: String,
}

#[derive(Message, Serialize, Deserialize)]
struct Touch {
    #[correlation_id]
    id: String,
    fail: bool,
}

#[derive(Default, Serialize, Deserialize)]
struct Counter {
    touches: u32,
}

/// What `on_error` saw: kind, failures so far, instance.
type Seen = Arc<Mutex<Vec<(FailureKind, u32, Option<String>)>>>;

#[derive(Default)]
struct Strict {
    failures: Seen,
}

#[process_manager(state = Counter)]
impl Strict {
    #[starts(strict)]
    async fn open(
        &self,
        _m: Open,
        _s: &mut Counter,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        Ok(())
    }

    #[handles(strict)]
    async fn touch(
        &self,
        m: Touch,
        s: &mut Counter,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if m.fail {
            return Err(ProcessError::new("downstream refused"));
        }
        s.touches += 1;
        Ok(())
    }

    #[on_error]
    fn on_error(&self, failure: &Failure) -> ErrorAction {
        self.failures.lock().unwrap().push((
            failure.kind.clone(),
            failure.failures,
            failure.instance_id.clone(),
        ));
        match failure.kind {
            FailureKind::Handler if failure.failures < 2 => ErrorAction::Retry,
            FailureKind::Handler => ErrorAction::Skip,
            _ => ErrorAction::Stop,
        }
    }
}

#[tokio::test]
async fn strict_start_and_continue_errors_reach_on_error() {
    let pm = Strict::default();
    let failures = pm.failures.clone();
    let mut t = ProcessTest::new(pm);

    // Continue before start: NotStarted, and on_error says Stop: dead-lettered.
    let d = t
        .when(Touch {
            id: "a".into(),
            fail: false,
        })
        .await;
    assert!(
        matches!(
            d,
            Dispatched::Failed {
                action: ErrorAction::Stop,
                ..
            }
        ),
        "{d:?}"
    );
    assert_eq!(
        failures.lock().unwrap()[0],
        (FailureKind::NotStarted, 1, None)
    );
    assert_eq!(t.dead_letters().await.len(), 1);

    t.given(Open { id: "a".into() }).await;
    let d = t.when(Open { id: "a".into() }).await;
    assert!(matches!(
        d,
        Dispatched::Failed {
            action: ErrorAction::Stop,
            ..
        }
    ));
    assert_eq!(
        failures.lock().unwrap()[1],
        (FailureKind::AlreadyStarted, 1, Some("a".into()))
    );
    let instance = t.instance("a").await.unwrap();
    assert_eq!(
        instance.status,
        saga_runtime::backend::InstanceStatus::Stopped
    );
    // A stopped instance ignores what follows, with an audit entry.
    assert!(matches!(
        t.when(Touch {
            id: "a".into(),
            fail: false
        })
        .await,
        Dispatched::Ignored { .. }
    ));
    assert_eq!(t.state("a").await.unwrap().touches, 0);
}

#[tokio::test]
async fn on_error_retry_then_skip_counts_failures_per_message() {
    let pm = Strict::default();
    let failures = pm.failures.clone();
    let mut t = ProcessTest::new(pm);
    t.given(Open { id: "b".into() }).await;
    let d = t
        .when(Touch {
            id: "b".into(),
            fail: true,
        })
        .await;
    assert!(matches!(
        d,
        Dispatched::Failed {
            action: ErrorAction::Retry,
            ..
        }
    ));
    // The immediate retry ran too (and failed again: Skip).
    let seen: Vec<u32> = failures.lock().unwrap().iter().map(|f| f.1).collect();
    assert_eq!(seen, [1, 2]);
    let instance = t.instance("b").await.unwrap();
    assert!(instance.audit_log.iter().any(|e| matches!(&e.action, ProcessAuditAction::Skipped { error } if error == "downstream refused")));
    assert!(t.dead_letters().await.is_empty(), "skipped, not parked");
}

/// No `#[on_error]`: the documented default.
struct Flaky;

#[process_manager(state = Counter)]
impl Flaky {
    #[starts]
    async fn open(
        &self,
        _m: Open,
        _s: &mut Counter,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        Ok(())
    }

    #[handles]
    async fn touch(
        &self,
        m: Touch,
        s: &mut Counter,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if m.fail {
            return Err(ProcessError::new("still broken"));
        }
        s.touches += 1;
        Ok(())
    }
}

#[tokio::test]
async fn default_policy_retries_after_100_then_200_ms_then_stops_and_dead_letters() {
    let mut t = ProcessTest::new(Flaky);
    t.given(Open { id: "c".into() }).await;
    let d = t
        .when(Touch {
            id: "c".into(),
            fail: true,
        })
        .await;
    assert_eq!(
        d,
        Dispatched::Failed {
            action: ErrorAction::RetryAfter(Duration::from_millis(100)),
            error: "still broken".into()
        }
    );
    let scheduled = t.scheduled().await;
    assert_eq!(
        (scheduled.len(), scheduled[0].due_in, scheduled[0].retry),
        (1, Duration::from_millis(100), true)
    );
    assert!(t.advance(Duration::from_millis(99)).await.is_empty());
    let d = t.advance(Duration::from_millis(1)).await;
    assert_eq!(
        d,
        [Dispatched::Failed {
            action: ErrorAction::RetryAfter(Duration::from_millis(200)),
            error: "still broken".into()
        }]
    );
    let d = t.advance(Duration::from_millis(200)).await;
    assert_eq!(
        d,
        [Dispatched::Failed {
            action: ErrorAction::Stop,
            error: "still broken".into()
        }]
    );
    assert_eq!(t.dead_letters().await.len(), 1);
    assert!(t.dead_letters().await[0].reason.contains("still broken"));
    assert_eq!(
        t.instance("c").await.unwrap().status,
        saga_runtime::backend::InstanceStatus::Stopped
    );
}

#[tokio::test]
async fn continuing_message_without_instance_is_held_then_dead_lettered_not_silently_dropped() {
    let mut t = ProcessTest::new(Flaky);
    let held = t
        .when(Touch {
            id: "nobody".into(),
            fail: false,
        })
        .await;
    assert!(
        matches!(&held, Dispatched::Held { key, .. } if key == "nobody"),
        "{held:?}"
    );
    assert!(t.dead_letters().await.is_empty());
    // Its hold (the engine's hour) ends with no instance: dead-lettered.
    let outcomes = t.advance(Duration::from_secs(3600)).await;
    assert_eq!(
        outcomes,
        [Dispatched::Unmatched {
            key: "nobody".into(),
            dead_lettered: true
        }]
    );
    assert!(t.dead_letters().await[0].reason.contains("held for 1h"));
}

// ---- stop deletes state; sends go through the outbox ----

#[derive(Message, Serialize, Deserialize)]
struct Requested {
    #[correlation_id]
    id: String,
    amount: u64,
}

#[derive(Message, Serialize, Deserialize)]
struct Done {
    #[correlation_id]
    id: String,
}

#[derive(Debug, Message, Serialize, Deserialize, PartialEq)]
struct Withdraw {
    amount: u64,
}

#[derive(Default, Serialize, Deserialize)]
struct Transfer {
    amount: u64,
}

struct Transfers;

#[process_manager(state = Transfer)]
impl Transfers {
    #[starts]
    async fn requested(
        &self,
        m: Requested,
        s: &mut Transfer,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.amount = m.amount;
        ctx.send("accounts", Withdraw { amount: m.amount });
        if m.amount == 0 {
            return Err(ProcessError::new("zero transfer"));
        }
        Ok(())
    }

    #[handles]
    async fn done(
        &self,
        _m: Done,
        _s: &mut Transfer,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.stop();
        Ok(())
    }

    #[on_error]
    fn on_error(&self, _failure: &Failure) -> ErrorAction {
        ErrorAction::Skip
    }
}

#[tokio::test]
async fn sends_are_saved_with_the_state_and_a_failing_handler_saves_and_sends_nothing() {
    let mut t = ProcessTest::new(Transfers);
    t.when(Requested {
        id: "t1".into(),
        amount: 5,
    })
    .await;
    let sent: Vec<Withdraw> = t
        .sent("accounts")
        .await
        .iter()
        .filter_map(|m| m.decode())
        .collect();
    assert_eq!(sent, [Withdraw { amount: 5 }]);

    // The handler sent, then failed: neither the state nor the send survive.
    t.when(Requested {
        id: "t2".into(),
        amount: 0,
    })
    .await;
    assert!(t.instance("t2").await.is_none());
    assert_eq!(t.sent("accounts").await.len(), 1);

    // Stop deletes the state; a later continuing message matches nothing.
    t.when(Done { id: "t1".into() }).await;
    assert!(t.instance("t1").await.is_none());
    let late = t.when(Done { id: "t1".into() }).await;
    assert!(matches!(late, Dispatched::Held { .. }), "{late:?}");
}

// ---- the engine on the in-memory backend ----

#[tokio::test]
async fn malformed_process_messages_are_dead_lettered_with_a_reason() {
    let engine = Engine::builder()
        .process_manager(Flaky)
        // The message for an unknown process manager goes back once (1 s)
        // for a worker that runs it, then is dead-lettered.
        .max_deliveries(1)
        .build()
        .await
        .unwrap();
    let b = engine.backend().clone();
    for bad in [
        serde_json::json!({"process": "flaky", "message_id": "1", "message_type": "Open", "payload": {"wrong": 1}, "kind": "message"}),
        serde_json::json!({"process": "nope", "message_id": "2", "message_type": "Open", "payload": {"id": "x"}, "kind": "message"}),
        serde_json::json!({"process": "flaky", "message_id": "3", "message_type": "Unknown", "payload": {}, "kind": "message"}),
        serde_json::json!({"process": "flaky", "oops": true}),
    ] {
        b.enqueue_raw(bad.to_string().as_bytes()).await.unwrap();
    }
    engine.publish(Open { id: "fine".into() }).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let letters = loop {
        let letters = engine
            .dead_letters(Default::default())
            .await
            .unwrap()
            .letters;
        if letters.len() >= 4 || tokio::time::Instant::now() > deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let reasons: Vec<&str> = letters.iter().map(|l| l.reason.as_str()).collect();
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("does not deserialize")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("unknown process manager `nope`")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("no handler for message type `Unknown`")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("malformed process-manager envelope")),
        "{reasons:?}"
    );
    assert!(
        engine
            .process_instance::<Flaky>("fine")
            .await
            .unwrap()
            .is_some(),
        "other messages unaffected"
    );
}

#[tokio::test]
async fn retry_after_does_not_block_other_instances() {
    let engine = Engine::builder()
        .process_manager(Transfers)
        .process_manager(Slowpoke)
        .workers(1)
        .build()
        .await
        .unwrap();
    engine
        .publish(Ping {
            id: "slow".into(),
            fail: true,
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = tokio::time::Instant::now();
    for n in 0..20 {
        engine
            .publish(Ping {
                id: format!("fast-{n}"),
                fail: false,
            })
            .await
            .unwrap();
    }
    loop {
        let done = engine
            .process_instances::<Slowpoke>()
            .await
            .unwrap()
            .iter()
            .filter(|i| i.id.starts_with("fast"))
            .count();
        if done == 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "one worker kept flowing while `slow` waits 5 s to retry"
    );
    let slow = engine.process_state::<Slowpoke>("slow").await.unwrap();
    assert!(slow.is_none(), "the failing message saved nothing yet");
}

#[derive(Message, Serialize, Deserialize)]
struct Ping {
    #[correlation_id]
    id: String,
    fail: bool,
}

struct Slowpoke;

#[process_manager(state = Counter)]
impl Slowpoke {
    #[starts]
    async fn ping(
        &self,
        m: Ping,
        s: &mut Counter,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if m.fail {
            return Err(ProcessError::new("not yet"));
        }
        s.touches += 1;
        Ok(())
    }

    #[on_error]
    fn on_error(&self, _f: &Failure) -> ErrorAction {
        ErrorAction::RetryAfter(Duration::from_secs(5))
    }
}

/// Two handlers for one wire name. `#[process_manager]` refuses them at
/// compile time (ui-tests/fail/pm_same_wire_name.rs), so the definition is
/// written by hand: what the engine refuses when it is built.
mod wire_names {
    use saga_runtime::prelude::*;
    use saga_runtime::process::{
        Concurrency, Correlation, HandlerDefinition, HandlerKind, OnComplete, ProcessDefinition,
        Unmatched,
    };
    use saga_runtime::saga::BoxFuture;
    use serde_json::Value;

    const ONE: HandlerDefinition = HandlerDefinition {
        method: "one",
        message_type: "same",
        kind: HandlerKind::Starts { strict: false },
        correlation: Correlation::Id,
        limits: &[],
        unmatched: Unmatched {
            hold: None,
            then: None,
        },
    };

    static DEFINITION: ProcessDefinition = ProcessDefinition {
        name: "clash",
        state_type: "()",
        handlers: &[
            ONE,
            HandlerDefinition {
                method: "two",
                kind: HandlerKind::Handles {
                    strict: false,
                    many: false,
                },
                ..ONE
            },
        ],
        on_complete: OnComplete::Keep,
        concurrency: Concurrency::Optimistic,
    };

    struct Clash;

    impl ProcessManager for Clash {
        type State = ();
        const NAME: &'static str = "clash";

        fn definition() -> &'static ProcessDefinition {
            &DEFINITION
        }

        fn new_state() {}

        fn encode_state(_: &()) -> Result<Value, ProcessError> {
            Ok(Value::Null)
        }

        fn decode_state(_: Value) -> Result<(), ProcessError> {
            Ok(())
        }

        fn handle<'a>(
            &'a self,
            _: &'a str,
            _: Value,
            _: &'a mut (),
            _: &'a mut ProcessContext,
        ) -> BoxFuture<'a, Result<(), ProcessError>> {
            Box::pin(async { Ok(()) })
        }

        fn state_keys(_: &()) -> Vec<(&'static str, String)> {
            Vec::new()
        }

        fn message_key(_: &str, _: &Value) -> Result<Option<String>, ProcessError> {
            Ok(None)
        }

        fn seed(_: &str, _: &Value, _: &mut ()) -> Result<(), ProcessError> {
            Ok(())
        }
    }

    pub fn clash() -> impl ProcessManager {
        Clash
    }
}

#[tokio::test]
async fn two_message_types_with_one_wire_name_are_refused_at_build() {
    let err = Engine::builder()
        .process_manager(wire_names::clash())
        .build()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("two handlers for message type `same`"),
        "{err}"
    );
}

// ---- pessimistic concurrency: one handler per instance at a time ----

#[derive(Message, Serialize, Deserialize)]
struct Bump {
    #[correlation_id]
    id: String,
}

struct Locked {
    calls: Arc<std::sync::atomic::AtomicU64>,
}

#[process_manager(state = Counter, concurrency = pessimistic)]
impl Locked {
    #[starts]
    async fn bump(
        &self,
        _m: Bump,
        s: &mut Counter,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::task::yield_now().await;
        s.touches += 1;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pessimistic_mode_runs_each_handler_once_under_contention() {
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let engine = Engine::builder()
        .process_manager(Locked {
            calls: calls.clone(),
        })
        .lock_retry_delay(Duration::from_millis(1))
        .workers(4)
        .build()
        .await
        .unwrap();
    for _ in 0..200 {
        engine.publish(Bump { id: "one".into() }).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let n = engine
            .process_state::<Locked>("one")
            .await
            .unwrap()
            .map_or(0, |s| s.touches);
        if n == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "stuck at {n}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        200,
        "no conflict re-runs under the lease"
    );
}

#[tokio::test]
async fn unmatched_messages_are_counted_and_dead_lettered_when_configured() {
    let engine = Engine::builder()
        .process_manager(Flaky)
        // Not held: the policy applies at once.
        .hold_unmatched(Duration::ZERO)
        .dead_letter_unmatched(true)
        .build()
        .await
        .unwrap();
    engine
        .publish(Touch {
            id: "ghost".into(),
            fail: false,
        })
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters
        .is_empty()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let letters = engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    assert!(
        letters[0]
            .reason
            .contains("matched no instance (correlation `ghost`)"),
        "{}",
        letters[0].reason
    );
    let unmatched = engine
        .process_metrics()
        .unmatched
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(unmatched, 1);
}
