//! Faults found by an adversarial review of tallies, endpoints,
//! `#[handles(many)]` and the instance locks, each pinned by a test
//! against a private redis-server (each failed before its fix).

mod common;

use common::until;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::{
    BackendError, InstanceStatus, ProcessCommit, ProcessInstance, ProcessStore, Settle, TallyOpen,
};
use saga_runtime::prelude::*;
use saga_runtime::process::{Envelope, EnvelopeKind, TallyRef};
use saga_runtime::task::Timestamp;
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------- shop --

#[derive(Message, Serialize, Deserialize)]
struct OrderPlaced {
    #[correlation_id]
    order: String,
}

#[derive(Debug, Message, Serialize, Deserialize)]
struct SendInvoice {
    #[correlation_id]
    order: String,
}

#[derive(Default, Serialize, Deserialize)]
struct Placed;

struct Shop;

#[process_manager(name = "shop", state = Placed)]
impl Shop {
    #[starts]
    async fn placed(
        &self,
        msg: OrderPlaced,
        _state: &mut Placed,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.send("invoicing", SendInvoice { order: msg.order });
        Ok(())
    }
}

const KEY: &str = "saga:{saga:pm}:endpoint:invoicing";

fn config() -> RedisConfig {
    RedisConfig {
        visibility_timeout: Duration::from_millis(800),
        block: Duration::from_millis(200),
        ..RedisConfig::default()
    }
}

async fn shop_engine(redis: &TestRedis) -> Engine {
    Engine::builder()
        .backend(
            RedisBackend::connect_with(&redis.url(), config())
                .await
                .unwrap(),
        )
        .process_manager(Shop)
        .workers(1)
        .build()
        .await
        .unwrap()
}

fn order(n: usize) -> OrderPlaced {
    OrderPlaced {
        order: format!("o-{n}"),
    }
}

/// Every command line MONITOR shows for `for` (commands scripts run
/// excluded).
fn monitor_lines(redis: &TestRedis, r#for: Duration) -> Vec<String> {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "monitor"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter(|l| !l.contains(" lua]"))
            .collect::<Vec<_>>()
    });
    std::thread::sleep(r#for);
    let _ = child.kill();
    let _ = child.wait();
    reader.join().unwrap()
}

/// Was: `endpoint_receive` (backend/redis/endpoint.rs, the blocking
/// `XREADGROUP`) keeps its cached reader connection after an error (the
/// task queue's `read_new` drops it: `r.conn = None`). After a Redis
/// restart the connection is dead for good: every idle round fails
/// ("endpoint read failed"), the consumer never blocks again and only
/// finds messages through the non-blocking script between growing pauses.
/// Seen from the server: no blocking XREADGROUP on the endpoint ever
/// arrives again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_consumer_blocks_again_after_a_redis_restart() {
    let mut redis = TestRedis::start();
    let engine = shop_engine(&redis).await;
    let done = Arc::new(Mutex::new(Vec::new()));
    let d = done.clone();
    engine.consumer("invoicing").spawn(move |m| {
        let d = d.clone();
        async move {
            d.lock().unwrap().push(m.decode::<SendInvoice>()?.order);
            Ok(())
        }
    });
    engine.publish(order(1)).await.unwrap();
    until("first", async || done.lock().unwrap().len() == 1).await;
    let blocking_reads = |seen: &[String]| {
        seen.iter()
            .filter(|l| {
                l.contains("\"XREADGROUP\"")
                    && l.contains("\"BLOCK\"")
                    && l.contains("endpoint:invoicing")
            })
            .count()
    };
    // Control: before the restart the idle consumer blocks on the stream.
    let before = tokio::task::block_in_place(|| monitor_lines(&redis, Duration::from_secs(2)));
    assert!(blocking_reads(&before) > 0, "control: {before:?}");

    redis.restart();
    // Let everything reconnect and the consumer go idle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    engine.publish(order(2)).await.unwrap();
    until("second, after the restart", async || {
        done.lock().unwrap().contains(&"o-2".to_owned())
    })
    .await;

    let seen = tokio::task::block_in_place(|| monitor_lines(&redis, Duration::from_secs(3)));
    let blocking = blocking_reads(&seen);
    engine.shutdown().await;
    assert!(
        blocking > 0,
        "an idle endpoint consumer sent no blocking read in 3 s after the restart \
         (its cached reader connection is dead and never replaced)"
    );
}

/// Was (unbounded growth): every `Consumer::run` names its consumers
/// `<engine instance>-<n>` and nothing ever deletes them from the group
/// (`XGROUP DELCONSUMER` is only used for the work queues). Each restart
/// of a consuming service adds `concurrency` consumers to the group, for
/// ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_consumers_do_not_pile_up_in_the_group() {
    let redis = TestRedis::start();
    for n in 0..5 {
        let engine = shop_engine(&redis).await;
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        engine.consumer("invoicing").spawn(move |_m| {
            let d = d.clone();
            async move {
                d.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        });
        engine.publish(order(n)).await.unwrap();
        until("delivered", async || done.load(Ordering::SeqCst) >= 1).await;
        engine.shutdown().await;
    }
    let consumers: Vec<redis::Value> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(KEY)
        .arg("consumers")
        .query(&mut redis.conn())
        .unwrap();
    assert!(
        consumers.len() <= 1,
        "{} consumers left in the group after 5 restarts of a 1-consumer service",
        consumers.len()
    );
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
    }
}

/// Was (misleading error): PROCESS_COMMIT checks "tally exists" (-6)
/// before the version check (-2). A handler that ran on a stale instance
/// (it lost the race to another writer that opened the same tally) gets
/// `TallyExists`, which dispatch hands to `#[on_error]` as a handler
/// failure (dispatch.rs, `Err(BackendError::TallyExists(..)) => fail(..)`),
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
        1
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
    assert_eq!(b.process_commit("pm", first).await.unwrap(), 2);
    let mut second = ProcessCommit::new(Some(&v1), Settle::Nothing);
    second.tallies = vec![open()];
    let lost = b.process_commit("pm", second).await;
    assert!(
        matches!(lost, Err(BackendError::ProcessConflict { .. })),
        "the loser of a version race must be told it is stale, got {lost:?}"
    );
}

// ----------------------------------------------- handles(many) upgrade --

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

/// Release 1: the product index is a plain one.
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

/// Release 2: the same handler becomes `#[handles(many)]`.
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

/// Was (lost messages after an upgrade): marking an existing
/// `#[correlate]` handler `#[handles(many)]` moves the field's index from
/// `idx:` (a string per value) to `idxs:` (a set per value), but instances
/// saved before keep only their `idx:` entry, and their `keys` already
/// list (field, value), so no later save adds them to the set. Every
/// `many` message for them is "matched no instance" and acknowledged; the
/// old `idx:` key is never deleted either (no TTL, nothing removes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_from_before_many_still_get_many_messages() {
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
        order: "o-1".into(),
        product: "lamp".into(),
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while v1.process_instances::<ItemsV1>().await.unwrap().is_empty() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    v2.publish(ItemRepriced {
        product: "lamp".into(),
        price: 20,
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let price = loop {
        let states: Vec<Item> = v2
            .process_instances::<ItemsV2>()
            .await
            .unwrap()
            .iter()
            .map(|i| serde_json::from_value(i.state.clone()).unwrap())
            .collect();
        if states[0].price == 20 || Instant::now() > deadline {
            break states[0].price;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let unmatched = v2
        .process_metrics()
        .unmatched
        .load(std::sync::atomic::Ordering::Relaxed);
    v2.shutdown().await;
    assert_eq!(
        price,
        20,
        "the instance opened before `many` never got the reprice (unmatched: {unmatched}); \
         keys: {:?}",
        redis.keys()
    );
}

// ------------------------------------------- pessimistic lease handover --

#[derive(Message, Serialize, Deserialize)]
struct TicketOpened {
    number: String,
}

#[derive(Message, Serialize, Deserialize)]
struct TicketNoted {
    number: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Ticket {
    number: String,
    notes: u32,
}

struct Tickets;

#[process_manager(name = "tickets", state = Ticket, concurrency = pessimistic)]
impl Tickets {
    #[starts]
    #[correlate(state.number = msg.number)]
    async fn opened(
        &self,
        msg: TicketOpened,
        state: &mut Ticket,
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
        _msg: TicketNoted,
        state: &mut Ticket,
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
        .process_manager(Tickets)
        .workers(1)
        .worker_concurrency(4)
        .build()
        .await
        .unwrap();
    engine
        .publish(TicketOpened {
            number: "t-1".into(),
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    engine
        .publish(TicketNoted {
            number: "t-1".into(),
        })
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let states: Vec<Ticket> = engine
            .process_instances::<Tickets>()
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
