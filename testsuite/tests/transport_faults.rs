//! Brokers under faults, with the shop's fulfillment manager
//! (`sagas_tests::shop`) on a real store, Redis and PostgreSQL: every connection
//! cut while messages flow, the broker restarted mid-run, the broker down
//! while handlers send, workers SIGKILLed between their store write and
//! their acknowledgement, a poison message. Exactly once is checked by
//! effect: an order keeps the `n` of every `Counted` message applied to
//! it, so a message applied twice, lost or overtaken shows in its list.
//!
//! One test per broker, running the scenarios in turn on a private node
//! (the faults are the broker's), each scenario in a corner of its own
//! names (queues, streams, key prefix, schema).

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::brokers::{Corner, Plain, TestBroker};
use common::postgres_server::TestPostgres;
use common::redis_server::TestRedis;
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::Backend;
use saga_runtime::prelude::*;
use sagas_tests::shop::{
    Fulfillment, InventoryReserved, OrderSubmitted, PaymentCaptured, SHIPPING,
};
use serde_json::json;

/// A store of the scenarios.
#[derive(Clone, Copy, Debug)]
enum Store {
    Redis,
    Postgres,
}

struct Stores {
    redis: TestRedis,
    postgres: TestPostgres,
}

impl Stores {
    fn url(&self, store: Store) -> String {
        match store {
            Store::Redis => self.redis.url(),
            Store::Postgres => self.postgres.url(),
        }
    }

    async fn backend(&self, store: Store, corner: &Corner) -> Arc<dyn Backend> {
        let visibility_timeout = Duration::from_millis(1000);
        match store {
            Store::Redis => Arc::new(
                RedisBackend::connect_with(
                    &self.url(store),
                    RedisConfig {
                        prefix: corner.prefix.clone(),
                        visibility_timeout,
                        block: Duration::from_millis(200),
                        ..RedisConfig::default()
                    },
                )
                .await
                .unwrap(),
            ),
            Store::Postgres => Arc::new(
                PostgresBackend::connect_url(
                    &self.url(store),
                    PostgresConfig {
                        schema: corner.prefix.clone(),
                        visibility_timeout,
                        poll_interval: Duration::from_millis(50),
                        ..PostgresConfig::default()
                    },
                )
                .await
                .unwrap(),
            ),
        }
    }
}

async fn engine(broker: &TestBroker, stores: &Stores, store: Store, corner: &Corner) -> Engine {
    let builder = Engine::builder()
        .backend_arc(stores.backend(store, corner).await)
        .process_manager(Fulfillment)
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(2);
    let builder = match broker {
        TestBroker::Rabbit(_) => builder.transport(broker.rabbitmq(corner).relay(SHIPPING)),
        TestBroker::Nats(_) => builder.transport(broker.nats_transport(corner).relay(SHIPPING)),
    };
    builder.build().await.unwrap()
}

/// Submits `orders` orders through the broker.
async fn submit(shop: &Plain, orders: usize) {
    for o in 0..orders {
        let body = json!({"order_id": format!("o-{o}"), "order_number": format!("N-{o}")});
        shop.publish_event("OrderSubmitted", &format!("s-{o}"), &body)
            .await;
    }
}

/// The `k`th `Counted` message of a feed of `orders` orders: to order
/// `k % orders`, its `n` the round `k / orders`.
async fn count(shop: &Plain, orders: usize, k: usize) {
    let (o, n) = (k % orders, k / orders);
    let body = json!({"order_id": format!("o-{o}"), "n": n});
    shop.publish_event("Counted", &format!("c-{o}-{n}"), &body)
        .await;
}

/// Waits until every order counted `per_order` messages, then checks each
/// order's list holds `0..per_order` exactly once: none lost, none twice;
/// in order too if `ordered`. A fault can reorder: a message in flight
/// when its worker died, or when the connection carrying it to the
/// bridge dropped, comes again after its visibility timeout (or AckWait),
/// behind the instance's later messages (see the README); how many came
/// out of order is printed.
async fn applied_once(
    engine: &Engine,
    orders: usize,
    per_order: usize,
    within: Duration,
    ordered: bool,
) {
    let deadline = tokio::time::Instant::now() + within;
    let wanted: Vec<u64> = (0..per_order as u64).collect();
    loop {
        let mut short = Vec::new();
        for o in 0..orders {
            let id = format!("o-{o}");
            let counted = match engine.process_state::<Fulfillment>(&id).await {
                Ok(state) => state.map(|s| s.counted).unwrap_or_default(),
                Err(_) => continue,
            };
            assert!(
                counted.len() <= per_order,
                "{id} applied a message twice: {counted:?}"
            );
            let mut sorted = counted.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(
                sorted.len(),
                counted.len(),
                "{id} applied a message twice: {counted:?}"
            );
            let done = match ordered {
                true => counted == wanted,
                false => sorted == wanted,
            };
            if !done {
                short.push((id, counted));
            }
        }
        if short.is_empty() {
            let reordered = orders_reordered(engine, orders).await;
            println!("{reordered} of {orders} orders saw a message overtaken");
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} orders short or out of order, e.g. {:?}",
            short.len(),
            &short[..short.len().min(3)]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How many orders applied their `Counted` messages out of order.
async fn orders_reordered(engine: &Engine, orders: usize) -> usize {
    let mut n = 0;
    for o in 0..orders {
        if let Ok(Some(state)) = engine.process_state::<Fulfillment>(&format!("o-{o}")).await {
            n += usize::from(state.counted.windows(2).any(|w| w[0] > w[1]));
        }
    }
    n
}

/// 500 messages flow while every client connection is cut three times
/// (NATS: the server restarted, which is what its clients see).
async fn connections_cut(broker: &mut TestBroker, stores: &Stores, store: Store, corner: Corner) {
    let engine = engine(broker, stores, store, &corner).await;
    let mut shop = broker.client(&corner).await;
    submit(&shop, 50).await;
    for k in 0..500 {
        if k % 125 == 124 {
            tokio::task::block_in_place(|| broker.cut_connections());
            shop = broker.client(&corner).await;
        }
        count(&shop, 50, k).await;
    }
    applied_once(&engine, 50, 10, Duration::from_secs(90), false).await;
    engine.shutdown().await;
}

/// The broker stopped and started again on its data mid-run.
async fn broker_restarted(broker: &mut TestBroker, stores: &Stores, store: Store, corner: Corner) {
    let engine = engine(broker, stores, store, &corner).await;
    let mut shop = broker.client(&corner).await;
    submit(&shop, 20).await;
    for k in 0..100 {
        count(&shop, 20, k).await;
    }
    tokio::task::block_in_place(|| {
        broker.stop();
        broker.start_again();
    });
    shop = broker.client(&corner).await;
    for k in 100..200 {
        count(&shop, 20, k).await;
    }
    applied_once(&engine, 20, 10, Duration::from_secs(120), false).await;
    engine.shutdown().await;
}

/// The broker down for 10 s while 1,000 orders ship (their `Ship` commands
/// wait in the outbox): all reach the shipping queue after, each once.
async fn outage_while_handlers_send(
    broker: &mut TestBroker,
    stores: &Stores,
    store: Store,
    corner: Corner,
) {
    const ORDERS: usize = 1000;
    let shop = broker.client(&corner).await;
    shop.receive_endpoint(SHIPPING).await;
    drop(shop);
    let engine = engine(broker, stores, store, &corner).await;
    tokio::task::block_in_place(|| broker.stop());
    let down = tokio::time::Instant::now();
    for o in 0..ORDERS {
        let (id, number) = (format!("o-{o}"), format!("N-{o}"));
        let submitted = OrderSubmitted {
            order_id: id.clone(),
            order_number: number.clone(),
        };
        engine.publish(submitted).await.unwrap();
        engine
            .publish(InventoryReserved {
                order_number: number,
            })
            .await
            .unwrap();
        engine
            .publish(PaymentCaptured { order_id: id })
            .await
            .unwrap();
    }
    let left = Duration::from_secs(10).saturating_sub(down.elapsed());
    tokio::time::sleep(left).await;
    tokio::task::block_in_place(|| broker.start_again());
    let shop = broker.client(&corner).await;
    shop.receive_endpoint(SHIPPING).await;
    let mut shipped = shop.read(SHIPPING, ORDERS, Duration::from_secs(120)).await;
    // Anything more would be a second copy.
    shipped.extend(shop.read(SHIPPING, 50, Duration::from_secs(2)).await);
    let mut ids: Vec<String> = shipped
        .iter()
        .map(|r| {
            r.body["payload"]["order_id"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    ids.sort();
    let before = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), ORDERS, "every order shipped ({before} received)");
    assert_eq!(before, ORDERS, "none shipped twice");
    engine.shutdown().await;
}

/// An engine in this process that runs no workers: it reads the state,
/// and declares the broker's topology at its build (before the shop
/// publishes, while the worker processes are still starting).
async fn reader(broker: &TestBroker, stores: &Stores, store: Store, corner: &Corner) -> Engine {
    let builder = Engine::builder()
        .backend_arc(stores.backend(store, corner).await)
        .process_manager(Fulfillment)
        .workers(0);
    let builder = match broker {
        TestBroker::Rabbit(_) => builder.transport(broker.rabbitmq(corner).relay(SHIPPING)),
        TestBroker::Nats(_) => builder.transport(broker.nats_transport(corner).relay(SHIPPING)),
    };
    builder.build().await.unwrap()
}

/// Spawns a broker worker on `store` (see `tests/support/broker_worker.rs`).
fn worker(broker: &TestBroker, stores: &Stores, store: Store, corner: &Corner, max: u32) -> Child {
    Command::new(env!("CARGO_BIN_EXE_broker-worker"))
        .env("BACKEND_URL", stores.url(store))
        .env("BROKER_URL", broker.url())
        .env("PREFIX", &corner.prefix)
        .env("SCHEMA", &corner.prefix)
        .env("MAX_DELIVERIES", max.to_string())
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn broker-worker")
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Worker processes SIGKILLed again and again while 300 messages flow
/// (some between their store write and their acknowledgement, which the
/// broker then delivers again): every message applied once.
async fn killed_before_the_ack(
    broker: &mut TestBroker,
    stores: &Stores,
    store: Store,
    corner: Corner,
) {
    let reader = reader(broker, stores, store, &corner).await;
    let mut a = worker(broker, stores, store, &corner, 10);
    let mut b = worker(broker, stores, store, &corner, 10);
    let shop = broker.client(&corner).await;
    submit(&shop, 30).await;
    let mut kills = 0;
    for k in 0..300 {
        count(&shop, 30, k).await;
        if k % 40 == 39 {
            // Alternately, so that one survives to take over.
            let victim = if kills % 2 == 0 { &mut a } else { &mut b };
            kill(victim);
            *victim = worker(broker, stores, store, &corner, 10);
            kills += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    println!("{kills} workers SIGKILLed while 300 messages flowed");
    applied_once(&reader, 30, 10, Duration::from_secs(120), false).await;
    kill(&mut a);
    kill(&mut b);
}

/// A `Counted` message whose handler aborts its process every time: it is
/// dead-lettered after the engine's delivery cap; the orders beside it
/// count all of theirs.
async fn poison(broker: &mut TestBroker, stores: &Stores, store: Store, corner: Corner) {
    let reader = reader(broker, stores, store, &corner).await;
    let mut w = worker(broker, stores, store, &corner, 3);
    let shop = broker.client(&corner).await;
    submit(&shop, 5).await;
    let body = json!({"order_id": "o-0", "n": u64::MAX});
    shop.publish_event("Counted", "poison", &body).await;
    for k in 0..25 {
        count(&shop, 5, k).await;
    }
    // Each crash, another worker: as a supervisor would.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(Some(_)) = w.try_wait() {
            w = worker(broker, stores, store, &corner, 3);
        }
        let letters = reader
            .dead_letters(Default::default())
            .await
            .unwrap()
            .letters;
        if letters.iter().any(|l| l.payload.contains("\"poison\"")) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    applied_once(&reader, 5, 5, Duration::from_secs(60), false).await;
    kill(&mut w);
}

/// Every scenario in turn on `broker`, on both stores.
async fn every_fault(mut broker: TestBroker) {
    let stores = Stores {
        redis: TestRedis::start(),
        postgres: TestPostgres::start(),
    };
    let b = broker.name();
    for store in [Store::Redis, Store::Postgres] {
        let s = format!("{store:?}").to_lowercase();
        let corner = |what: &str| Corner::new(&format!("{b}{s}{what}"));
        connections_cut(&mut broker, &stores, store, corner("cut")).await;
        killed_before_the_ack(&mut broker, &stores, store, corner("kill")).await;
        outage_while_handlers_send(&mut broker, &stores, store, corner("outage")).await;
    }
    broker_restarted(
        &mut broker,
        &stores,
        Store::Redis,
        Corner::new(&format!("{b}restart")),
    )
    .await;
    poison(
        &mut broker,
        &stores,
        Store::Redis,
        Corner::new(&format!("{b}poison")),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbitmq_under_faults() {
    every_fault(TestBroker::rabbit()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_under_faults() {
    every_fault(TestBroker::nats()).await;
}
