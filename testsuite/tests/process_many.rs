//! One message, many instances: `#[handles(many)]` delivers a message
//! whose correlation value several instances share to each of them, each
//! with its own atomic save and duplicate detection; without it an
//! ambiguous correlation is an error, never a silent pick.

mod common;

use common::until;

use common::redis_server::TestRedis;

use saga_runtime::backend::InstanceStatus;
use saga_runtime::prelude::*;
use saga_runtime::process::Dispatched;
use saga_runtime::testing::ProcessTest;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
struct OrderOpened {
    #[correlation_id]
    order: String,
    product: String,
    price: u32,
}

/// Many open orders hold the product: each of them gets it.
#[derive(Message, Serialize, Deserialize)]
struct PriceChanged {
    product: String,
    price: u32,
}

/// Correlated by the same shared field, without `many`.
#[derive(Message, Serialize, Deserialize)]
struct ProductRecalled {
    product: String,
}

#[derive(Message, Serialize, Deserialize)]
struct OrderClosed {
    #[correlation_id]
    order: String,
}

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
struct Order {
    product: String,
    price: u32,
    changes: u32,
    recalled: bool,
}

struct Orders;

#[process_manager(name = "orders", state = Order)]
impl Orders {
    #[starts]
    async fn opened(
        &self,
        msg: OrderOpened,
        state: &mut Order,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.product = msg.product;
        state.price = msg.price;
        Ok(())
    }

    #[handles(many)]
    #[correlate(state.product = msg.product)]
    async fn price_changed(
        &self,
        msg: PriceChanged,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.price = msg.price;
        state.changes += 1;
        ctx.send(
            "pricing",
            PriceChanged {
                product: state.product.clone(),
                price: msg.price,
            },
        );
        Ok(())
    }

    #[handles]
    #[correlate(state.product = msg.product)]
    async fn recalled(
        &self,
        _msg: ProductRecalled,
        state: &mut Order,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.recalled = true;
        Ok(())
    }

    #[handles]
    async fn closed(
        &self,
        _msg: OrderClosed,
        _state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.stop();
        Ok(())
    }
}

fn opened(order: &str, product: &str) -> OrderOpened {
    OrderOpened {
        order: order.into(),
        product: product.into(),
        price: 10,
    }
}

#[tokio::test]
async fn a_shared_value_reaches_every_instance_once() {
    let mut t = ProcessTest::new(Orders);
    for (order, product) in [("o-1", "lamp"), ("o-2", "lamp"), ("o-3", "chair")] {
        t.given(opened(order, product)).await;
    }
    let first = t
        .when_with_id(
            "m-1",
            PriceChanged {
                product: "lamp".into(),
                price: 12,
            },
        )
        .await;
    assert_eq!(first, Dispatched::FannedOut { instances: 2 });
    for order in ["o-1", "o-2"] {
        let state = t.state(order).await.unwrap();
        assert_eq!((state.price, state.changes), (12, 1), "{order}");
    }
    assert_eq!(t.state("o-3").await.unwrap().price, 10, "another product");
    assert_eq!(
        t.sent("pricing").await.len(),
        2,
        "each instance's own effects"
    );

    // A duplicate of the message changes nothing anywhere.
    t.when_with_id(
        "m-1",
        PriceChanged {
            product: "lamp".into(),
            price: 12,
        },
    )
    .await;
    for order in ["o-1", "o-2"] {
        assert_eq!(t.state(order).await.unwrap().changes, 1, "{order}");
    }
    assert_eq!(t.sent("pricing").await.len(), 2);

    // An instance that is gone is no longer reached.
    t.when(OrderClosed {
        order: "o-1".into(),
    })
    .await;
    t.when(PriceChanged {
        product: "lamp".into(),
        price: 13,
    })
    .await;
    assert_eq!(t.state("o-2").await.unwrap().changes, 2);
    assert!(t.instance("o-1").await.is_none());

    // No instance holds the value: unmatched at once (a message for every
    // instance sharing a value waits for no one instance).
    let none = t
        .when(PriceChanged {
            product: "sofa".into(),
            price: 1,
        })
        .await;
    assert!(matches!(none, Dispatched::Unmatched { .. }), "{none:?}");
}

#[tokio::test]
async fn an_ambiguous_correlation_without_many_is_an_error_not_a_pick() {
    let mut t = ProcessTest::new(Orders);
    t.given(opened("o-1", "lamp")).await;
    let one = t
        .when(ProductRecalled {
            product: "lamp".into(),
        })
        .await;
    assert!(
        matches!(one, Dispatched::Handled { .. }),
        "one instance: handled {one:?}"
    );
    t.given(opened("o-2", "lamp")).await;
    let two = t
        .when(ProductRecalled {
            product: "lamp".into(),
        })
        .await;
    assert!(
        matches!(&two, Dispatched::Failed { error, .. } if error.contains("matched 2 instances") && error.contains("#[handles(many)]")),
        "{two:?}"
    );
    assert!(
        !t.state("o-2").await.unwrap().recalled,
        "no instance was picked"
    );
    let dead = t.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
}

/// Opens orders `o-<n>` for `lamp`, `n` in `range`, and waits for them.
async fn open_lamps(engine: &Engine, range: std::ops::Range<usize>) {
    let count = range.len();
    for n in range {
        engine
            .publish(opened(&format!("o-{n}"), "lamp"))
            .await
            .unwrap();
    }
    until("opened", async || {
        engine.process_instances::<Orders>().await.unwrap().len() >= count
    })
    .await;
}

/// Publishes one lamp price change twice (the same id) and waits until all
/// `instances` have it: each exactly once.
async fn reprice_lamps_once(engine: &Engine, instances: usize) {
    for _ in 0..2 {
        let change = PriceChanged {
            product: "lamp".into(),
            price: 20,
        };
        engine.publish_with_id("p-1", change).await.unwrap();
    }
    let states = async || -> Vec<Order> {
        engine
            .process_instances::<Orders>()
            .await
            .unwrap()
            .iter()
            .map(|i| serde_json::from_value(i.state.clone()).unwrap())
            .collect()
    };
    until("repriced", async || {
        let s = states().await;
        s.len() == instances && s.iter().all(|s| s.price == 20)
    })
    .await;
    let s = states().await;
    assert!(s.iter().all(|s| s.changes == 1), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_engine_each_instance_handles_it_once() {
    let engine = Engine::builder()
        .process_manager(Orders)
        .workers(2)
        .build()
        .await
        .unwrap();
    open_lamps(&engine, 0..20).await;
    reprice_lamps_once(&engine, 20).await;
    let all = engine.process_instances::<Orders>().await.unwrap();
    assert!(all.iter().all(|i| i.status == InstanceStatus::Active));
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_the_shared_index_follows_instances_and_each_gets_the_message_once() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .process_manager(Orders)
        .workers(3)
        .build()
        .await
        .unwrap();
    let members = || -> Vec<String> {
        let mut ids: Vec<String> = redis::cmd("SMEMBERS")
            .arg("saga:{saga:pm}:idxs:orders:product:lamp")
            .query(&mut redis.conn())
            .unwrap();
        ids.sort();
        ids
    };
    open_lamps(&engine, 0..30).await;
    assert_eq!(members().len(), 30, "each instance joined the set");
    engine
        .publish(OrderClosed {
            order: "o-0".into(),
        })
        .await
        .unwrap();
    until("a deleted instance leaves the set", async || {
        !members().contains(&"o-0".to_owned())
    })
    .await;
    reprice_lamps_once(&engine, 29).await;
    // Without `many`, the shared value is ambiguous: dead-lettered with why.
    engine
        .publish(ProductRecalled {
            product: "lamp".into(),
        })
        .await
        .unwrap();
    let letters = async || {
        engine
            .dead_letters(saga_runtime::DeadLetterFilter::new())
            .await
            .unwrap()
            .letters
    };
    until("dead-lettered", async || !letters().await.is_empty()).await;
    let letters = letters().await;
    assert!(
        letters[0].reason.contains("matched 29 instances"),
        "{letters:?}"
    );
    engine.shutdown().await;
}
