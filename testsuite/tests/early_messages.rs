//! Messages that arrive before their instance (issue: a process manager
//! lost them): a continuing message that finds no instance is held,
//! durably, under the value it looks for, and handled in the order held
//! once the instance starts; past its hold, its handler's policy applies.
//!
//! The README's fulfillment manager, fed in both orders by three engines
//! on one store (Redis, PostgreSQL): no order is lost. The same scenario
//! runs on each store; the test kit's virtual time covers holds ending,
//! the handler's own hold and policy, and the cap.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::postgres_server::TestPostgres;
use common::redis_server::TestRedis;
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::{Backend, InstanceStatus};
use saga_runtime::prelude::*;
use saga_runtime::process::{Dispatched, HOLD_CAP};
use saga_runtime::testing::ProcessTest;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
struct OrderSubmitted {
    #[correlation_id]
    order_id: String,
    order_number: String,
}

/// Knows only the order number: correlated by a state field.
#[derive(Message, Serialize, Deserialize)]
struct InventoryReserved {
    order_number: String,
}

#[derive(Message, Serialize, Deserialize)]
struct PaymentCaptured {
    #[correlation_id]
    order_id: String,
}

/// One of a sequence of notes to one order, by its id.
#[derive(Message, Serialize, Deserialize)]
struct Noted {
    #[correlation_id]
    order_id: String,
    n: u32,
}

/// Held 30 s at most, then dropped.
#[derive(Message, Serialize, Deserialize)]
struct Impatient {
    #[correlation_id]
    order_id: String,
}

#[derive(Default, Serialize, Deserialize)]
struct Fulfillment {
    order_number: String,
    reserved: bool,
    paid: bool,
    notes: Vec<u32>,
}

struct Orders;

#[process_manager(name = "orders", state = Fulfillment)]
impl Orders {
    #[starts]
    async fn submitted(
        &self,
        msg: OrderSubmitted,
        state: &mut Fulfillment,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.order_number = msg.order_number;
        done(state, ctx);
        Ok(())
    }

    #[handles]
    #[correlate(state.order_number = msg.order_number)]
    async fn reserved(
        &self,
        _msg: InventoryReserved,
        state: &mut Fulfillment,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.reserved = true;
        done(state, ctx);
        Ok(())
    }

    #[handles]
    async fn paid(
        &self,
        _msg: PaymentCaptured,
        state: &mut Fulfillment,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.paid = true;
        done(state, ctx);
        Ok(())
    }

    #[handles]
    async fn noted(
        &self,
        msg: Noted,
        state: &mut Fulfillment,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if let Some(gate) = handover::gate(&msg.order_id).filter(|_| msg.n == 0) {
            gate.pass().await;
        }
        state.notes.push(msg.n);
        Ok(())
    }

    #[handles(hold = "30s", then = drop)]
    async fn impatient(
        &self,
        _msg: Impatient,
        _state: &mut Fulfillment,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        Ok(())
    }
}

/// Complete once submitted (its number known), reserved and paid.
fn done(state: &Fulfillment, ctx: &mut ProcessContext) {
    if !state.order_number.is_empty() && state.reserved && state.paid {
        ctx.mark_complete();
    }
}

fn submitted(n: usize) -> OrderSubmitted {
    OrderSubmitted {
        order_id: format!("o-{n}"),
        order_number: format!("A-{n}"),
    }
}

fn reserved(n: usize) -> InventoryReserved {
    InventoryReserved {
        order_number: format!("A-{n}"),
    }
}

fn paid(n: usize) -> PaymentCaptured {
    PaymentCaptured {
        order_id: format!("o-{n}"),
    }
}

// ---------------------------------------------------------------- kit --

#[tokio::test]
async fn the_readmes_order_fed_backwards_completes() {
    let mut t = ProcessTest::new(Orders);
    // Both continuing messages come first: each is held under its value.
    for outcome in [t.when(reserved(1)).await, t.when(paid(1)).await] {
        assert!(matches!(outcome, Dispatched::Held { .. }), "{outcome:?}");
    }
    assert_eq!(t.scheduled().await.iter().filter(|s| s.held).count(), 2);
    // The start releases the one held under its id (`paid`); the one
    // held under the order number (`reserved`) is released by the same
    // write, which claims the number.
    t.when(submitted(1)).await;
    let order = t.instance("o-1").await.expect("started");
    assert_eq!(order.status, InstanceStatus::Completed);
    assert!(t.scheduled().await.is_empty(), "nothing is left held");
    assert!(t.dead_letters().await.is_empty());
}

#[tokio::test]
async fn messages_held_for_one_instance_are_handled_in_the_order_held() {
    let mut t = ProcessTest::new(Orders);
    for n in 0..10 {
        let note = Noted {
            order_id: "o-1".into(),
            n,
        };
        assert!(matches!(t.when(note).await, Dispatched::Held { .. }));
    }
    t.when(submitted(1)).await;
    let notes = t.state("o-1").await.expect("started").notes;
    assert_eq!(notes, (0..10).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_hold_ends_in_the_handlers_policy_or_the_engines() {
    let mut t = ProcessTest::new(Orders);
    // The engine's: an hour, then dead-lettered.
    t.when(paid(7)).await;
    // The handler's own: 30 s, then dropped.
    t.when(Impatient {
        order_id: "o-7".into(),
    })
    .await;
    let outcomes = t.advance(Duration::from_secs(30)).await;
    assert_eq!(
        outcomes,
        [Dispatched::Unmatched {
            key: "o-7".into(),
            dead_lettered: false
        }]
    );
    assert!(t.dead_letters().await.is_empty(), "dropped, not parked");
    let outcomes = t.advance(Duration::from_secs(3600)).await;
    assert_eq!(
        outcomes,
        [Dispatched::Unmatched {
            key: "o-7".into(),
            dead_lettered: true
        }]
    );
    let letters = t.dead_letters().await;
    assert!(letters[0].reason.contains("held for 1h"), "{letters:?}");
    // An instance started after a hold ended gets nothing of it.
    t.when(submitted(7)).await;
    assert!(!t.state("o-7").await.unwrap().paid);
}

#[tokio::test]
async fn a_value_holds_at_most_its_cap_and_the_rest_take_the_policy_at_once() {
    let mut t = ProcessTest::new(Orders);
    for n in 0..HOLD_CAP as u32 {
        let note = Noted {
            order_id: "o-1".into(),
            n,
        };
        assert!(matches!(t.when(note).await, Dispatched::Held { .. }));
    }
    let over = t
        .when(Noted {
            order_id: "o-1".into(),
            n: 999,
        })
        .await;
    assert!(
        matches!(
            over,
            Dispatched::Unmatched {
                dead_lettered: true,
                ..
            }
        ),
        "{over:?}"
    );
    let letters = t.dead_letters().await;
    assert!(
        letters[0]
            .reason
            .contains("messages are held for it already"),
        "{letters:?}"
    );
    // The held ones are all handled once it starts.
    t.when(submitted(1)).await;
    assert_eq!(t.state("o-1").await.unwrap().notes.len(), HOLD_CAP);
}

// ------------------------------------------------------- real stores --

/// Three engines on one store, fed 40 orders from the first: half in
/// the README's order (submitted, reserved, paid), half backwards; every
/// order completes, nothing is dead-lettered or dropped. Then a sequence
/// of notes to one order, published in order, is handled in order.
async fn no_order_is_lost(engines: Vec<Engine>) {
    let feeder = &engines[0];
    const ORDERS: usize = 40;
    for n in 0..ORDERS {
        if n % 2 == 0 {
            feeder.publish(submitted(n)).await.unwrap();
            feeder.publish(reserved(n)).await.unwrap();
            feeder.publish(paid(n)).await.unwrap();
        } else {
            feeder.publish(reserved(n)).await.unwrap();
            feeder.publish(paid(n)).await.unwrap();
            feeder.publish(submitted(n)).await.unwrap();
        }
    }
    let completed = async || {
        let mut n = 0;
        for i in 0..ORDERS {
            let id = format!("o-{i}");
            if let Some(order) = feeder.process_instance::<Orders>(&id).await.unwrap() {
                n += usize::from(order.status == InstanceStatus::Completed);
            }
        }
        n
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut done = completed().await;
    while done < ORDERS && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        done = completed().await;
    }
    let sum = |f: fn(&saga_runtime::engine::ProcessMetrics) -> u64| {
        engines.iter().map(|e| f(e.process_metrics())).sum::<u64>()
    };
    let held = sum(|m| m.held.load(std::sync::atomic::Ordering::Relaxed));
    let unmatched = sum(|m| m.unmatched.load(std::sync::atomic::Ordering::Relaxed));
    let letters = feeder
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    let reasons: Vec<&str> = letters.iter().take(3).map(|l| l.reason.as_str()).collect();
    assert_eq!(
        (done, unmatched, letters.len()),
        (ORDERS, 0, 0),
        "completed, unmatched, dead letters ({held} holds; the first reasons: {reasons:?})"
    );
    assert!(held > 0, "no message arrived before its instance");

    // Notes to one order, published in order, each awaited.
    feeder.publish(submitted(1000)).await.unwrap();
    for n in 0..20 {
        let note = Noted {
            order_id: "o-1000".into(),
            n,
        };
        feeder.publish(note).await.unwrap();
    }
    let notes = async || {
        feeder
            .process_state::<Orders>("o-1000")
            .await
            .unwrap()
            .map(|s| s.notes)
            .unwrap_or_default()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut seen = notes().await;
    while seen.len() < 20 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = notes().await;
    }
    assert_eq!(seen, (0..20).collect::<Vec<_>>(), "handled out of order");
    for engine in engines {
        engine.shutdown().await;
    }
}

async fn engine_on(backend: Arc<dyn Backend>) -> Engine {
    Engine::builder()
        .backend_arc(backend)
        .process_manager(Orders)
        .workers(2)
        .worker_concurrency(8)
        .timeout_poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_redis_three_engines_lose_no_order_whatever_the_order_of_its_messages() {
    let redis = TestRedis::start();
    let mut engines = Vec::new();
    for _ in 0..3 {
        engines.push(engine_on(Arc::new(redis.backend().await)).await);
    }
    no_order_is_lost(engines).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_three_engines_lose_no_order_whatever_the_order_of_its_messages() {
    let pg = TestPostgres::start();
    let mut engines = Vec::new();
    for _ in 0..3 {
        let config = PostgresConfig {
            visibility_timeout: Duration::from_secs(2),
            poll_interval: Duration::from_millis(50),
            ..PostgresConfig::default()
        };
        let backend = PostgresBackend::connect_url(&pg.url(), config)
            .await
            .unwrap();
        engines.push(engine_on(Arc::new(backend)).await);
    }
    no_order_is_lost(engines).await;
}

/// The first note of each `joining-` (`leaving-`) order waits until the
/// test opens that gate: its partition's owner is busy with it while
/// another engine joins (or the owner shuts down).
mod handover {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    pub struct Gate {
        pub waiting: AtomicUsize,
        pub open: AtomicBool,
    }

    pub static JOINING: Gate = Gate::new();
    pub static LEAVING: Gate = Gate::new();

    pub fn gate(order: &str) -> Option<&'static Gate> {
        match order.split('-').next()? {
            "joining" => Some(&JOINING),
            "leaving" => Some(&LEAVING),
            _ => None,
        }
    }

    impl Gate {
        const fn new() -> Self {
            Gate {
                waiting: AtomicUsize::new(0),
                open: AtomicBool::new(false),
            }
        }

        pub async fn pass(&self) {
            self.waiting.fetch_add(1, Ordering::SeqCst);
            while !self.open.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// 24 orders whose first notes are being handled by the only engine when
/// a second one joins (and, `leaving`, the first one shuts down): the
/// partitions that move to the second stay the first one's, unread,
/// until those notes are done, so the second note of each order
/// (published meanwhile) is handled after its first. Before, the newcomer
/// read the second notes at once and handled them first (the first
/// engine's write then retried on the newer state).
async fn a_partition_moving_keeps_its_instances_order(prefix: &str, leaving: bool) {
    use std::sync::atomic::Ordering;
    let gate = handover::gate(prefix).unwrap();
    let redis = TestRedis::start();
    let one = |concurrency| {
        let redis = &redis;
        async move {
            Engine::builder()
                .backend(redis.backend().await)
                .process_manager(Orders)
                .workers(1)
                .worker_concurrency(concurrency)
                .build()
                .await
                .unwrap()
        }
    };
    let first = one(64).await;
    const ORDERS: usize = 24;
    let order = |i: usize| format!("{prefix}-{i}");
    for i in 0..ORDERS {
        let start = OrderSubmitted {
            order_id: order(i),
            order_number: format!("{prefix}-number-{i}"),
        };
        first.publish(start).await.unwrap();
        let note = Noted {
            order_id: order(i),
            n: 0,
        };
        first.publish(note).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while gate.waiting.load(Ordering::SeqCst) < ORDERS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first notes never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = one(8).await;
    // A few heartbeats (visibility 800 ms: one every ~270 ms) to balance.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stopping = leaving.then(|| {
        let first = first.clone();
        tokio::spawn(async move { first.shutdown().await })
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..ORDERS {
        let note = Noted {
            order_id: order(i),
            n: 1,
        };
        second.publish(note).await.unwrap();
    }
    // Time for the second engine to read the second notes.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    gate.open.store(true, Ordering::SeqCst);
    if let Some(stopping) = stopping {
        stopping.await.unwrap();
    }
    let mut wrong = Vec::new();
    for i in 0..ORDERS {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let notes = second
                .process_state::<Orders>(&order(i))
                .await
                .unwrap()
                .map(|s| s.notes)
                .unwrap_or_default();
            if notes.len() == 2 {
                if notes != [0, 1] {
                    wrong.push((i, notes));
                }
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "order {i}: notes {notes:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(wrong.is_empty(), "handled out of order: {wrong:?}");
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_redis_a_partition_moving_to_an_engine_that_joins_keeps_its_instances_order() {
    a_partition_moving_keeps_its_instances_order("joining", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_redis_a_partition_left_by_an_engine_shutting_down_keeps_its_instances_order() {
    a_partition_moving_keeps_its_instances_order("leaving", true).await;
}
