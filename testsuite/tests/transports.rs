//! Process managers and sagas fed by real brokers (a private RabbitMQ
//! node and a private nats-server, one test each: the node takes seconds
//! to boot, so its scenarios run in turn on it, each in a corner of its
//! own names), with a plain client of each broker (not this library)
//! playing the other services. The same scenarios run on both brokers.
//!
//! The faults (brokers restarted, connections cut, workers killed before
//! their acknowledgement, outages while handlers send) are in
//! `transport_faults.rs`, each with a broker of its own.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::brokers::{Corner, TestBroker};
use saga_runtime::backend::memory::MemoryBackend;
use saga_runtime::backend::{Backend, DeadLetterQuery, DeadLetters};
use saga_runtime::prelude::*;
use sagas_tests::shop::{Fulfillment, Order, SHIPPING};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A saga started by commands.
pub struct Receipt;

#[derive(Serialize, Deserialize)]
pub struct Purchase {
    pub amount: u64,
}

#[saga(name = "receipt")]
impl Receipt {
    #[saga_step(1)]
    async fn print(&self, p: Purchase) -> Result<u64, StepError> {
        Ok(p.amount)
    }
}

/// `builder` with the transport of `broker` for `corner`: it relays the
/// shipping endpoint and starts receipts.
fn with_transport(
    builder: saga_runtime::EngineBuilder,
    broker: &TestBroker,
    corner: &Corner,
) -> saga_runtime::EngineBuilder {
    match broker {
        TestBroker::Rabbit(_) => {
            builder.transport(broker.rabbitmq(corner).relay(SHIPPING).starts::<Receipt>())
        }
        TestBroker::Nats(_) => builder.transport(
            broker
                .nats_transport(corner)
                .relay(SHIPPING)
                .starts::<Receipt>(),
        ),
    }
}

async fn engine(broker: &TestBroker, corner: &Corner, backend: Arc<dyn Backend>) -> Engine {
    let builder = Engine::builder()
        .backend_arc(backend)
        .process_manager(Fulfillment)
        .saga(Receipt)
        .workers(2);
    with_transport(builder, broker, corner)
        .build()
        .await
        .unwrap()
}

async fn until<F: AsyncFnMut() -> bool>(what: &str, within: Duration, mut done: F) {
    let deadline = tokio::time::Instant::now() + within;
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn order(engine: &Engine, id: &str) -> Option<Order> {
    engine.process_state::<Fulfillment>(id).await.unwrap()
}

/// The shop publishes with its plain client, some orders backwards; every
/// order completes and its `Ship` command reaches the shipping queue with
/// its CloudEvents attributes.
async fn a_plain_client_feeds_a_process_manager(broker: &TestBroker, test: &str) {
    let corner = Corner::new(test);
    let shop = broker.client(&corner).await;
    shop.receive_endpoint(SHIPPING).await;
    let engine = engine(broker, &corner, Arc::new(MemoryBackend::new())).await;
    const ORDERS: usize = 10;
    for n in 0..ORDERS {
        let submitted = json!({"order_id": format!("o-{n}"), "order_number": format!("A-{n}")});
        let reserved = json!({"order_number": format!("A-{n}")});
        let paid = json!({"order_id": format!("o-{n}")});
        let events = [
            ("OrderSubmitted", submitted),
            ("InventoryReserved", reserved),
            ("PaymentCaptured", paid),
        ];
        let mut order: Vec<_> = events.iter().collect();
        if n % 2 == 1 {
            order.reverse();
        }
        for (t, body) in order {
            shop.publish_event(t, &format!("{t}-{n}"), body).await;
        }
    }
    let shipped = shop.read(SHIPPING, ORDERS, Duration::from_secs(30)).await;
    let mut numbers: Vec<String> = shipped
        .iter()
        .map(|r| {
            r.body["payload"]["order_number"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    numbers.sort();
    let mut expected: Vec<String> = (0..ORDERS).map(|n| format!("A-{n}")).collect();
    expected.sort();
    assert_eq!(numbers, expected, "{shipped:?}");
    for r in &shipped {
        assert_eq!(r.ce_type.as_deref(), Some("Ship"));
        assert_eq!(r.ce_id.as_deref(), r.body["message_id"].as_str());
    }
    let letters = engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    assert!(letters.is_empty(), "{letters:?}");
    engine.shutdown().await;
}

/// Garbage, an unknown type and a message without an id are each
/// dead-lettered in the engine's dead letters with a reason, and
/// acknowledged; a good message behind them is handled.
async fn what_is_not_a_message_is_dead_lettered_alone(broker: &TestBroker, test: &str) {
    let corner = Corner::new(test);
    let backend = Arc::new(MemoryBackend::new());
    let engine = engine(broker, &corner, backend.clone()).await;
    let shop = broker.client(&corner).await;
    shop.publish_raw("OrderSubmitted", Some("g-1"), b"\xff not json", true)
        .await;
    shop.publish_raw("OrderSubmitted", None, br#"{"order_id":"x"}"#, true)
        .await;
    // A body that does not fit the type's fields: the worker parks it.
    shop.publish_event("OrderSubmitted", "bad-fields", &json!({"order_id": 7}))
        .await;
    shop.publish_event(
        "OrderSubmitted",
        "good-1",
        &json!({"order_id": "o-good", "order_number": "G-1"}),
    )
    .await;
    until("the good order", Duration::from_secs(20), async || {
        order(&engine, "o-good").await.is_some()
    })
    .await;
    let reasons = async || -> Vec<String> {
        let page = backend
            .dead_letters(&DeadLetterQuery {
                after: None,
                limit: 10,
            })
            .await
            .unwrap();
        page.items.into_iter().map(|l| l.reason).collect()
    };
    until("three dead letters", Duration::from_secs(20), async || {
        reasons().await.len() == 3
    })
    .await;
    let reasons = reasons().await;
    assert!(
        reasons.iter().any(|r| r.contains("not JSON")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("has no id")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("order_id")),
        "{reasons:?}"
    );
    engine.shutdown().await;
}

/// A command on the start queue starts a task keyed by its id: the same
/// command again starts nothing new.
async fn commands_start_sagas_once(broker: &TestBroker, test: &str) {
    let corner = Corner::new(test);
    let engine = engine(broker, &corner, Arc::new(MemoryBackend::new())).await;
    let shop = broker.client(&corner).await;
    for _ in 0..3 {
        shop.publish_start("receipt", "purchase-1", &json!({"amount": 42}))
            .await;
    }
    shop.publish_start("receipt", "purchase-2", &json!({"amount": 7}))
        .await;
    until("two receipts", Duration::from_secs(20), async || {
        let tasks = engine.tasks_of("receipt").await.unwrap();
        tasks.len() >= 2 && tasks.iter().all(|t| t.status == TaskStatus::Completed)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(engine.tasks_of("receipt").await.unwrap().len(), 2);
    engine.shutdown().await;
}

/// A message of a type no process manager here handles is dead-lettered
/// once, with the reason, whatever the broker delivered it to.
async fn an_unknown_type_is_dead_lettered_once(broker: &TestBroker, test: &str) {
    let corner = Corner::new(test);
    let backend = Arc::new(MemoryBackend::new());
    let engine = engine(broker, &corner, backend.clone()).await;
    let shop = broker.client(&corner).await;
    let queue = format!("{}.process.fulfillment", corner.prefix);
    shop.publish_direct(&queue, "Refunded", "r-1", &json!({"order_id": "o-1"}))
        .await;
    let reason = "no process manager of this engine handles messages of type `Refunded`";
    until(
        "the unknown type dead-lettered",
        Duration::from_secs(20),
        async || {
            let letters = backend
                .dead_letters(&DeadLetterQuery {
                    after: None,
                    limit: 10,
                })
                .await
                .unwrap();
            letters.items.iter().any(|l| l.reason.contains(reason))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let letters = engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    assert_eq!(letters.len(), 1, "{letters:?}");
    engine.shutdown().await;
}

/// RabbitMQ: what a handler sends to a queue nobody declared is returned
/// unrouted: the relay says so, retries, and after the delivery cap parks
/// it on the endpoint's dead letters with the reason; nothing is dropped
/// unseen. (Run before anything declares the `shipping` queue.)
async fn an_unroutable_send_is_parked_on_its_endpoint(broker: &TestBroker, test: &str) {
    use saga_runtime::backend::Endpoints;
    let corner = Corner::new(test);
    let backend = Arc::new(MemoryBackend::new());
    let builder = Engine::builder()
        .backend(backend.as_ref().clone())
        .process_manager(Fulfillment)
        .saga(Receipt)
        .max_deliveries(2)
        .workers(2);
    let engine = with_transport(builder, broker, &corner)
        .build()
        .await
        .unwrap();
    use sagas_tests::shop::{InventoryReserved, OrderSubmitted, PaymentCaptured};
    engine
        .publish(OrderSubmitted {
            order_id: "o-u".into(),
            order_number: "U-1".into(),
        })
        .await
        .unwrap();
    engine
        .publish(InventoryReserved {
            order_number: "U-1".into(),
        })
        .await
        .unwrap();
    engine
        .publish(PaymentCaptured {
            order_id: "o-u".into(),
        })
        .await
        .unwrap();
    until(
        "the Ship command parked",
        Duration::from_secs(30),
        async || {
            let letters = backend.endpoint_dead_letters(SHIPPING).await.unwrap();
            letters
                .iter()
                .any(|l| l.reason.contains("nothing receives"))
        },
    )
    .await;
    engine.shutdown().await;
}

/// Every scenario in turn on `broker`.
async fn every_scenario(broker: TestBroker) {
    let b = broker.name();
    if let TestBroker::Rabbit(_) = broker {
        an_unroutable_send_is_parked_on_its_endpoint(&broker, &format!("{b}unroutable")).await;
    }
    an_unknown_type_is_dead_lettered_once(&broker, &format!("{b}unknown")).await;
    a_plain_client_feeds_a_process_manager(&broker, &format!("{b}feed")).await;
    what_is_not_a_message_is_dead_lettered_alone(&broker, &format!("{b}bad")).await;
    commands_start_sagas_once(&broker, &format!("{b}start")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq() {
    every_scenario(TestBroker::rabbit()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_nats() {
    every_scenario(TestBroker::nats()).await;
}
