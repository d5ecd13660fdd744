//! Faults found by two adversarial reviews of tallies, `#[handles(many)]`,
//! the in-process instance locks and the pessimistic lease handover, each
//! pinned by a test that failed before its fix. (The endpoint ones are in
//! `endpoint_redis.rs`, `outbox.rs` and `scenarios/endpoints.rs`.)

mod common;

use common::until;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use saga_runtime::backend::memory::MemoryBackend;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::{
    InstanceStatus, ProcessCommit, ProcessInstance, ProcessRefusal, ProcessStore, Settle, TallyOpen,
};
use saga_runtime::prelude::*;
use saga_runtime::process::{Envelope, EnvelopeKind, TallyRef};
use saga_runtime::task::Timestamp;
use serde::{Deserialize, Serialize};

/// How many handlers ran, and how many at most at once: two handlers of
/// one instance must never overlap.
struct Overlaps {
    running: AtomicUsize,
    most: AtomicUsize,
    calls: AtomicUsize,
}

impl Overlaps {
    const fn new() -> Self {
        Overlaps {
            running: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
        }
    }

    /// A handler's body, `hold` long.
    async fn run(&self, hold: Duration) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(hold).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
    }

    /// `(most at once, calls)`.
    fn seen(&self) -> (usize, usize) {
        (
            self.most.load(Ordering::SeqCst),
            self.calls.load(Ordering::SeqCst),
        )
    }
}

// ------------------------------------------------------------- tallies --

fn instance(id: &str) -> ProcessInstance {
    let now = Timestamp::now();
    ProcessInstance {
        process: "pm".into(),
        id: id.into(),
        generation: "g1".into(),
        started_by: None,
        state: serde_json::json!({"opened": false}),
        status: InstanceStatus::Active,
        version: 0,
        keys: Vec::new(),
        processed: Vec::new(),
        audit_log: Vec::new(),
        created_at: now,
        updated_at: now,
    }
}

fn envelope(id: &str) -> Envelope {
    Envelope {
        message_id: id.into(),
        process: "pm".into(),
        message_type: "saga.TallyCompleted".into(),
        payload: serde_json::Value::Null,
        kind: EnvelopeKind::Message,
        instance_id: Some("i1".into()),
        generation: Some("g1".into()),
        failures: 0,
        key: Some("i1".into()),
        key_field: None,
        traceparent: None,
        due_ms: None,
        hops: 0,
        hold_until: None,
    }
}

/// Was (misleading error): PROCESS_COMMIT checks "tally exists" (-6)
/// before the version check (-2). A handler that ran on a stale instance
/// (it lost the race to another writer that opened the same tally) gets
/// `TallyExists`, which dispatch hands to `#[on_error]` as a handler
/// failure (dispatch.rs, a refused `TallyExists` write => `fail(..)`),
/// instead of a conflict that re-runs it on the fresh state (where it would
/// see the tally opened and not open it again).
#[tokio::test]
async fn a_stale_commit_that_opens_a_tally_is_a_conflict_not_tally_exists() {
    let redis = TestRedis::start();
    let b = RedisBackend::connect(&redis.url()).await.unwrap();
    let i = instance("i1");
    assert_eq!(
        b.process_commit("pm", ProcessCommit::new(Some(&i), Settle::Nothing))
            .await
            .unwrap(),
        Ok(1)
    );
    let tally = TallyRef {
        process: "pm".into(),
        instance: "i1".into(),
        generation: "g1".into(),
        name: "t".into(),
    };
    let open = || TallyOpen {
        tally: tally.clone(),
        items: vec!["a".into(), "b".into()],
        keep_for: Duration::from_secs(60),
        completion: envelope("done"),
        completion_late: envelope("done"),
    };
    // Two handlers read version 1; both open the tally.
    let mut v1 = instance("i1");
    v1.version = 1;
    let mut first = ProcessCommit::new(Some(&v1), Settle::Nothing);
    first.tallies = vec![open()];
    assert_eq!(b.process_commit("pm", first).await.unwrap(), Ok(2));
    let mut second = ProcessCommit::new(Some(&v1), Settle::Nothing);
    second.tallies = vec![open()];
    let lost = b.process_commit("pm", second).await;
    assert!(
        matches!(lost, Ok(Err(ProcessRefusal::Conflict))),
        "the loser of a version race must be told it is stale, got {lost:?}"
    );
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

/// Was (lost messages after an upgrade): an instance saved before its
/// field became shared has only its old exclusive `idx:` entry, and no
/// later save moved it into the set; then the legacy
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
        .backend(redis.backend().await)
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
        .backend(redis.backend().await)
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
    let backend: std::sync::Arc<dyn saga_runtime::backend::Backend> =
        std::sync::Arc::new(MemoryBackend::new());
    let engine = |workers| {
        Engine::builder()
            .backend_arc(backend.clone())
            .process_manager(Orders)
            .workers(workers)
            .worker_concurrency(1)
            .build()
    };
    let opener = engine(1).await.unwrap();
    for order in ["o-1", "o-2"] {
        opener
            .publish(OrderOpened {
                order: order.into(),
                product: "lamp".into(),
            })
            .await
            .unwrap();
    }
    until("opened", async || {
        opener.process_instances::<Orders>().await.unwrap().len() == 2
    })
    .await;
    opener.shutdown().await;
    // Queued before any worker runs, so in this order: the price change
    // (fanned out: its copies go to the back), then o-1's switch to
    // another product, then the copies.
    let engine = engine(0).await.unwrap();
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
    let worker = engine.clone();
    tokio::spawn(async move { worker.run_workers(1).await });
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

static DESKS: Overlaps = Overlaps::new();

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
        DESKS.run(Duration::from_millis(300)).await;
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
        DESKS.run(Duration::from_millis(300)).await;
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
    let (max, calls) = DESKS.seen();
    assert_eq!(
        (max, calls),
        (1, 2),
        "pessimistic: handlers of o-1 overlapped (max {max} at once) and ran {calls} times for 2 messages"
    );
}

// ----------------- one process, one instance: value lock vs. id lock --

static TICKETS: Overlaps = Overlaps::new();

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
        TICKETS.run(Duration::from_millis(200)).await;
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
        TICKETS.run(Duration::from_millis(200)).await;
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
    let (max, calls) = TICKETS.seen();
    assert_eq!(
        (max, calls),
        (1, 8),
        "handlers of one instance overlapped in one process (max {max} at once), {calls} runs for 8 messages"
    );
}
// ------------------------------------------- pessimistic lease handover --

#[derive(Message, Serialize, Deserialize)]
struct LockedTicketOpened {
    number: String,
}

#[derive(Message, Serialize, Deserialize)]
struct LockedTicketNoted {
    number: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct LockedTicket {
    number: String,
    notes: u32,
}

struct LockedTickets;

#[process_manager(name = "locked-tickets", state = LockedTicket, concurrency = pessimistic)]
impl LockedTickets {
    #[starts]
    #[correlate(state.number = msg.number)]
    async fn opened(
        &self,
        msg: LockedTicketOpened,
        state: &mut LockedTicket,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        // Long enough for the next message of the ticket to queue behind
        // this one on the in-process instance lock.
        tokio::time::sleep(Duration::from_millis(400)).await;
        state.number = msg.number;
        Ok(())
    }

    #[handles(strict)]
    #[correlate(state.number = msg.number)]
    async fn noted(
        &self,
        _msg: LockedTicketNoted,
        state: &mut LockedTicket,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.notes += 1;
        Ok(())
    }
}

/// Was (a lease left held): the starter of a field-correlated pessimistic
/// instance takes the lease `pm-lock:<pm>:new:<value>` (no instance yet);
/// with the next message of the value waiting on the in-process lock, it
/// hands that lease over instead of releasing it (worker/process.rs). The
/// next handler names the lease by the now existing instance's id, so
/// `handed.filter(|l| l.name == name)` drops the handed lease without
/// releasing it: it stays held in Redis for the whole lease TTL, blocking
/// a starter of that value in any process (e.g. after the instance is
/// stopped) meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_lease_that_is_not_used_is_released() {
    let redis = TestRedis::start();
    let config = RedisConfig {
        visibility_timeout: Duration::from_secs(30),
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    };
    let engine = Engine::builder()
        .backend(
            RedisBackend::connect_with(&redis.url(), config)
                .await
                .unwrap(),
        )
        .process_manager(LockedTickets)
        .workers(1)
        .worker_concurrency(4)
        .build()
        .await
        .unwrap();
    engine
        .publish(LockedTicketOpened {
            number: "t-1".into(),
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    engine
        .publish(LockedTicketNoted {
            number: "t-1".into(),
        })
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let states: Vec<LockedTicket> = engine
            .process_instances::<LockedTickets>()
            .await
            .unwrap()
            .iter()
            .map(|i| serde_json::from_value(i.state.clone()).unwrap())
            .collect();
        if states.first().is_some_and(|s| s.notes == 1) {
            break;
        }
        assert!(Instant::now() < deadline, "{states:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leases: Vec<(String, i64)> = redis
        .keys()
        .into_iter()
        .filter(|k| k.contains("lease:pm-lock"))
        .map(|k| {
            let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut redis.conn()).unwrap();
            (k, ttl)
        })
        .collect();
    engine.shutdown().await;
    assert!(
        leases.is_empty(),
        "both messages are handled, yet these instance leases are still held: {leases:?}"
    );
}
