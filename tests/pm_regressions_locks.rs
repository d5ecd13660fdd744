//! Faults found by a second adversarial review of the instance locks, the
//! lease handover and `#[handles(many)]`, each pinned by a test that
//! failed before its fix: one handler per instance in a process however
//! the message finds it, pessimistic leases named by the instance for
//! shared fields, fanned-out copies only for instances still holding the
//! value, and instances saved before a field was shared not missed.

mod common;

use common::until;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use saga_runtime::backend::memory::MemoryBackend;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

fn config() -> RedisConfig {
    RedisConfig {
        visibility_timeout: Duration::from_millis(800),
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    }
}

// ------------------------------------------------ legacy + new instance --

#[derive(Message, Serialize, Deserialize)]
struct ItemOpened {
    #[correlation_id]
    order: String,
    product: String,
}

#[derive(Message, Serialize, Deserialize)]
struct ItemRepriced {
    product: String,
    price: u32,
}

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
struct Item {
    product: String,
    price: u32,
}

struct ItemsV1;

#[process_manager(name = "items", state = Item)]
impl ItemsV1 {
    #[starts]
    async fn opened(
        &self,
        msg: ItemOpened,
        state: &mut Item,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.product = msg.product;
        Ok(())
    }

    #[handles]
    #[correlate(state.product = msg.product)]
    async fn repriced(
        &self,
        msg: ItemRepriced,
        state: &mut Item,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.price = msg.price;
        Ok(())
    }
}

struct ItemsV2;

#[process_manager(name = "items", state = Item)]
impl ItemsV2 {
    #[starts]
    async fn opened(
        &self,
        msg: ItemOpened,
        state: &mut Item,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.product = msg.product;
        Ok(())
    }

    #[handles(many)]
    #[correlate(state.product = msg.product)]
    async fn repriced(
        &self,
        msg: ItemRepriced,
        state: &mut Item,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.price = msg.price;
        Ok(())
    }
}

/// dispatch.rs (`[] => process_find` in the shared branch): the legacy
/// fallback (an instance saved before the field became shared, found by its
/// old exclusive `idx:` entry) is only consulted when the shared set is
/// empty. As soon as one instance created after the upgrade shares the
/// value, the set is `[new]` and the old instance never gets `many`
/// messages again (nor is it ever migrated, since only its own save would
/// move it into the set).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_instance_is_missed_once_a_new_one_shares_its_value() {
    let redis = TestRedis::start();
    let v1 = Engine::builder()
        .backend(
            RedisBackend::connect_with(&redis.url(), config())
                .await
                .unwrap(),
        )
        .process_manager(ItemsV1)
        .workers(1)
        .build()
        .await
        .unwrap();
    v1.publish(ItemOpened {
        order: "old".into(),
        product: "lamp".into(),
    })
    .await
    .unwrap();
    until("v1 opened", async || {
        v1.process_instances::<ItemsV1>().await.unwrap().len() == 1
    })
    .await;
    v1.shutdown().await;

    let v2 = Engine::builder()
        .backend(
            RedisBackend::connect_with(&redis.url(), config())
                .await
                .unwrap(),
        )
        .process_manager(ItemsV2)
        .workers(1)
        .build()
        .await
        .unwrap();
    v2.publish(ItemOpened {
        order: "new".into(),
        product: "lamp".into(),
    })
    .await
    .unwrap();
    until("v2 opened", async || {
        v2.process_instances::<ItemsV2>().await.unwrap().len() == 2
    })
    .await;
    v2.publish(ItemRepriced {
        product: "lamp".into(),
        price: 20,
    })
    .await
    .unwrap();
    let prices = |v2: &Engine| {
        let v2 = v2.clone();
        async move {
            let mut p: Vec<(String, u32)> = v2
                .process_instances::<ItemsV2>()
                .await
                .unwrap()
                .iter()
                .map(|i| {
                    let s: Item = serde_json::from_value(i.state.clone()).unwrap();
                    (i.id.clone(), s.price)
                })
                .collect();
            p.sort();
            p
        }
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut seen = prices(&v2).await;
    while Instant::now() < deadline && !seen.iter().all(|(_, p)| *p == 20) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = prices(&v2).await;
    }
    v2.shutdown().await;
    assert_eq!(
        seen,
        vec![("new".to_owned(), 20), ("old".to_owned(), 20)],
        "both instances hold `lamp`; the one from before `many` was skipped"
    );
}

// ---------------------------------------------- fan-out copy, value moved --

#[derive(Message, Serialize, Deserialize)]
struct OrderOpened {
    #[correlation_id]
    order: String,
    product: String,
}

#[derive(Message, Serialize, Deserialize)]
struct PriceChanged {
    product: String,
    price: u32,
}

#[derive(Message, Serialize, Deserialize)]
struct ProductSwapped {
    #[correlation_id]
    order: String,
    product: String,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
struct Order {
    product: String,
    price: u32,
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
        state.price = 10;
        Ok(())
    }

    #[handles(many)]
    #[correlate(state.product = msg.product)]
    async fn price_changed(
        &self,
        msg: PriceChanged,
        state: &mut Order,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.price = msg.price;
        Ok(())
    }

    #[handles]
    async fn swapped(
        &self,
        msg: ProductSwapped,
        state: &mut Order,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.product = msg.product;
        Ok(())
    }
}

/// dispatch.rs `(true, Some(id)) => vec![id]`: a fanned-out copy is
/// delivered to the instance it names without checking that the instance
/// still holds the value. An order that switched from `lamp` to `chair`
/// after the fan-out (and before its copy was handled) gets `lamp`'s price:
/// a message for `lamp` handled after the switch would not reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fanned_out_copy_is_not_applied_to_an_instance_that_left_the_value() {
    let engine = Engine::builder()
        .backend(MemoryBackend::new())
        .process_manager(Orders)
        .workers(1)
        .worker_concurrency(1)
        .build()
        .await
        .unwrap();
    for order in ["o-1", "o-2"] {
        engine
            .publish(OrderOpened {
                order: order.into(),
                product: "lamp".into(),
            })
            .await
            .unwrap();
    }
    until("opened", async || {
        engine.process_instances::<Orders>().await.unwrap().len() == 2
    })
    .await;
    // In queue order: the price change (fanned out: its copies go to the
    // back), then o-1's switch to another product, then the copies.
    engine
        .publish(PriceChanged {
            product: "lamp".into(),
            price: 99,
        })
        .await
        .unwrap();
    engine
        .publish(ProductSwapped {
            order: "o-1".into(),
            product: "chair".into(),
        })
        .await
        .unwrap();
    let state = |id: &'static str| {
        let engine = engine.clone();
        async move {
            let i = engine
                .process_instance::<Orders>(id)
                .await
                .unwrap()
                .unwrap();
            serde_json::from_value::<Order>(i.state).unwrap()
        }
    };
    until("o-2 repriced", async || state("o-2").await.price == 99).await;
    until("o-1 swapped", async || {
        state("o-1").await.product == "chair"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let o1 = state("o-1").await;
    engine.shutdown().await;
    assert_eq!(
        o1,
        Order {
            product: "chair".into(),
            price: 10
        },
        "a `lamp` price reached an order of `chair`"
    );
}

// ------------------------------------ pessimistic, shared-field handler --

static IN_HANDLER: AtomicUsize = AtomicUsize::new(0);
static MAX_IN_HANDLER: AtomicUsize = AtomicUsize::new(0);
static CALLS: AtomicUsize = AtomicUsize::new(0);

async fn exclusive_section() {
    CALLS.fetch_add(1, Ordering::SeqCst);
    let now = IN_HANDLER.fetch_add(1, Ordering::SeqCst) + 1;
    MAX_IN_HANDLER.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    IN_HANDLER.fetch_sub(1, Ordering::SeqCst);
}

#[derive(Message, Serialize, Deserialize)]
struct Poke {
    #[correlation_id]
    order: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Desk {
    product: String,
    pokes: u32,
    prices: u32,
}

struct Desks;

#[process_manager(name = "desks", state = Desk, concurrency = pessimistic)]
impl Desks {
    #[starts]
    async fn opened(
        &self,
        msg: OrderOpened,
        state: &mut Desk,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.product = msg.product;
        Ok(())
    }

    #[handles(many)]
    #[correlate(state.product = msg.product)]
    async fn price_changed(
        &self,
        _msg: PriceChanged,
        state: &mut Desk,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        exclusive_section().await;
        state.prices += 1;
        Ok(())
    }

    #[handles]
    async fn poked(
        &self,
        _msg: Poke,
        state: &mut Desk,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        exclusive_section().await;
        state.pokes += 1;
        Ok(())
    }
}

/// worker/process.rs `instance_lock_name`: a message correlated by a
/// shared field (a `#[handles(many)]` message that one instance matches,
/// handled inline, or a plain `#[handles]` on that field) names its lease
/// after `process_find`, the *exclusive* index, which never holds a shared
/// value: the lease is `pm-lock:desks:new:lamp`, not the instance's
/// `pm-lock:desks:o-1`. So in pessimistic mode it runs at the same time as
/// another handler of the same instance (here in one process; equally
/// across processes), one of them loses the save and runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pessimistic_handlers_of_one_instance_never_overlap_with_a_shared_field() {
    let engine = Engine::builder()
        .backend(MemoryBackend::new())
        .process_manager(Desks)
        .workers(1)
        .worker_concurrency(4)
        .build()
        .await
        .unwrap();
    engine
        .publish(OrderOpened {
            order: "o-1".into(),
            product: "lamp".into(),
        })
        .await
        .unwrap();
    until("opened", async || {
        engine.process_instances::<Desks>().await.unwrap().len() == 1
    })
    .await;
    engine
        .publish(PriceChanged {
            product: "lamp".into(),
            price: 1,
        })
        .await
        .unwrap();
    engine
        .publish(Poke {
            order: "o-1".into(),
        })
        .await
        .unwrap();
    until("both handled", async || {
        let i = engine
            .process_instance::<Desks>("o-1")
            .await
            .unwrap()
            .unwrap();
        let s: Desk = serde_json::from_value(i.state).unwrap();
        s.pokes == 1 && s.prices == 1
    })
    .await;
    engine.shutdown().await;
    let (max, calls) = (
        MAX_IN_HANDLER.load(Ordering::SeqCst),
        CALLS.load(Ordering::SeqCst),
    );
    assert_eq!(
        (max, calls),
        (1, 2),
        "pessimistic: handlers of o-1 overlapped (max {max} at once) and ran {calls} times for 2 messages"
    );
}

// ----------------- one process, one instance: value lock vs. id lock --

static IN_T: AtomicUsize = AtomicUsize::new(0);
static MAX_IN_T: AtomicUsize = AtomicUsize::new(0);
static CALLS_T: AtomicUsize = AtomicUsize::new(0);

async fn section_t() {
    CALLS_T.fetch_add(1, Ordering::SeqCst);
    let now = IN_T.fetch_add(1, Ordering::SeqCst) + 1;
    MAX_IN_T.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    IN_T.fetch_sub(1, Ordering::SeqCst);
}

#[derive(Message, Serialize, Deserialize)]
struct TicketOpened {
    number: String,
}

#[derive(Message, Serialize, Deserialize)]
struct TicketNoted {
    number: String,
    n: u32,
}

#[derive(Message, Serialize, Deserialize)]
struct Tick {
    n: u32,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Ticket {
    number: String,
    notes: u32,
    ticks: u32,
}

struct Tickets;

#[process_manager(name = "tickets", state = Ticket)]
impl Tickets {
    #[starts]
    #[correlate(state.number = msg.number)]
    async fn opened(
        &self,
        msg: TicketOpened,
        state: &mut Ticket,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.number = msg.number;
        Ok(())
    }

    #[handles]
    #[correlate(state.number = msg.number)]
    async fn noted(
        &self,
        msg: TicketNoted,
        state: &mut Ticket,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        section_t().await;
        state.notes += 1;
        ctx.request_timeout(Duration::ZERO, Tick { n: msg.n });
        Ok(())
    }

    #[timeout]
    async fn tick(
        &self,
        _t: Tick,
        state: &mut Ticket,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        section_t().await;
        state.ticks += 1;
        Ok(())
    }
}

/// worker/process.rs: the in-process lock is named after what the message
/// finds the instance by (`lookup`): `tickets\0number\0t-1` for a message
/// correlated by `number`, `tickets\0\0<uuid>` for the same instance's
/// timeout. README: "In one process, the workers run one handler per
/// instance at a time ... (no read, no conflict)". Here the two kinds run
/// side by side in one process, and one of them loses the save and runs
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_runs_one_handler_per_instance_whatever_finds_it() {
    let engine = Engine::builder()
        .backend(MemoryBackend::new())
        .process_manager(Tickets)
        .workers(1)
        .worker_concurrency(4)
        .timeout_poll_interval(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    engine
        .publish(TicketOpened {
            number: "t-1".into(),
        })
        .await
        .unwrap();
    until("opened", async || {
        engine.process_instances::<Tickets>().await.unwrap().len() == 1
    })
    .await;
    for n in 0..4 {
        engine
            .publish(TicketNoted {
                number: "t-1".into(),
                n,
            })
            .await
            .unwrap();
    }
    until("all handled", async || {
        let i = &engine.process_instances::<Tickets>().await.unwrap()[0];
        let s: Ticket = serde_json::from_value(i.state.clone()).unwrap();
        s.notes == 4 && s.ticks == 4
    })
    .await;
    engine.shutdown().await;
    let (max, calls) = (
        MAX_IN_T.load(Ordering::SeqCst),
        CALLS_T.load(Ordering::SeqCst),
    );
    assert_eq!(
        (max, calls),
        (1, 8),
        "handlers of one instance overlapped in one process (max {max} at once), {calls} runs for 8 messages"
    );
}
