//! Process managers on a real local Redis Cluster (three primaries, three
//! replicas), whose partitions each sit in a slot of their own:
//!
//! - an instance found by a correlation value it holds besides its id (a
//!   value whose entry lives in another partition) gets its messages: they
//!   take one hop to the instance's partition;
//! - messages sent to endpoints and published to another process manager
//!   leave the instance's partition and arrive, once each;
//! - timeouts fire; instances spread over every shard;
//! - a tally checked from outside completes exactly once.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::redis_cluster::TestCluster;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::InstanceStatus;
use saga_runtime::engine::Checked;
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

fn config() -> RedisConfig {
    RedisConfig {
        visibility_timeout: Duration::from_millis(1000),
        block: Duration::from_millis(100),
        response_timeout: Duration::from_secs(2),
        ..RedisConfig::default()
    }
}

async fn backend(cluster: &TestCluster) -> RedisBackend {
    cluster.backend(config()).await
}

#[derive(Debug, Message, Serialize, Deserialize)]
struct OrderSubmitted {
    #[correlation_id]
    order_id: String,
    order_number: String,
}

/// From a service that knows only the order number.
#[derive(Debug, Message, Serialize, Deserialize)]
struct InventoryReserved {
    order_number: String,
}

#[derive(Debug, Message, Serialize, Deserialize)]
struct Ship;

#[derive(Debug, Message, Serialize, Deserialize)]
struct ReserveInventory {
    order_number: String,
}

#[derive(Debug, Message, Serialize, Deserialize)]
struct OrderAudited {
    #[correlation_id]
    order_id: String,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct OrderState {
    order_number: String,
    submitted: u32,
    reserved: u32,
    shipped: u32,
}

struct Orders;

#[process_manager(name = "orders", state = OrderState)]
impl Orders {
    #[starts]
    async fn submitted(
        &self,
        msg: OrderSubmitted,
        state: &mut OrderState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.submitted += 1;
        state.order_number = msg.order_number.clone();
        ctx.send(
            "inventory",
            ReserveInventory {
                order_number: msg.order_number,
            },
        );
        ctx.publish(OrderAudited {
            order_id: msg.order_id,
        });
        Ok(())
    }

    #[handles]
    #[correlate(state.order_number = msg.order_number)]
    async fn reserved(
        &self,
        _msg: InventoryReserved,
        state: &mut OrderState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.reserved += 1;
        ctx.request_timeout(Duration::from_millis(50), Ship);
        Ok(())
    }

    #[timeout]
    async fn ship(
        &self,
        _t: Ship,
        state: &mut OrderState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.shipped += 1;
        ctx.mark_complete();
        Ok(())
    }
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Audit {
    seen: u32,
}

struct Auditor;

#[process_manager(name = "auditor", state = Audit)]
impl Auditor {
    #[starts]
    async fn audited(
        &self,
        _msg: OrderAudited,
        state: &mut Audit,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.seen += 1;
        ctx.mark_complete();
        Ok(())
    }
}

const ORDERS: usize = 60;

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Submits orders `0..n` and waits until each asked for its inventory
/// (its instance exists).
async fn submit_orders(engine: &Engine, n: usize) {
    for i in 0..n {
        engine
            .publish(OrderSubmitted {
                order_id: format!("order-{i}"),
                order_number: format!("N-{i}"),
            })
            .await
            .unwrap();
    }
    until("every order asked for its inventory", async || {
        engine
            .process_store()
            .unwrap()
            .endpoint_messages("inventory")
            .await
            .unwrap()
            .len()
            >= n
    })
    .await;
}

/// Reserves the inventory of orders `0..n`, by order number.
async fn reserve_orders(engine: &Engine, n: usize) {
    for i in 0..n {
        engine
            .publish(InventoryReserved {
                order_number: format!("N-{i}"),
            })
            .await
            .unwrap();
    }
}

/// Waits until orders `0..n` are complete (a read that fails, as during a
/// failover, counts as not yet).
async fn until_shipped(engine: &Engine, n: usize) {
    until("every order shipped", async || {
        let mut shipped = 0;
        for i in 0..n {
            let instance = engine
                .process_instance::<Orders>(&format!("order-{i}"))
                .await
                .ok()
                .flatten();
            shipped += usize::from(instance.is_some_and(|i| i.status == InstanceStatus::Completed));
        }
        shipped == n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_reach_instances_across_partitions_once_each() {
    let cluster = TestCluster::start();
    let engine = Engine::builder()
        .backend(backend(&cluster).await)
        .process_manager(Orders)
        .process_manager(Auditor)
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(2)
        .worker_concurrency(4)
        .build()
        .await
        .unwrap();
    submit_orders(&engine, ORDERS).await;
    reserve_orders(&engine, ORDERS).await;
    until_shipped(&engine, ORDERS).await;
    for i in 0..ORDERS {
        let id = format!("order-{i}");
        let order = engine
            .process_instance::<Orders>(&id)
            .await
            .unwrap()
            .unwrap();
        let state: OrderState = serde_json::from_value(order.state).unwrap();
        assert_eq!(
            (state.submitted, state.reserved, state.shipped),
            (1, 1, 1),
            "{id}: each message applied once"
        );
        let audit = engine
            .process_instance::<Auditor>(&id)
            .await
            .unwrap()
            .unwrap();
        let audit: Audit = serde_json::from_value(audit.state).unwrap();
        assert_eq!(audit.seen, 1, "{id}: published once, delivered once");
    }
    let sent = engine
        .process_store()
        .unwrap()
        .endpoint_messages("inventory")
        .await
        .unwrap();
    assert_eq!(sent.len(), ORDERS, "each endpoint message relayed once");
    let metrics = engine.process_metrics();
    assert!(
        metrics.forwarded.load(Ordering::Relaxed) > 0,
        "the secondary correlation and the publishes were forwarded"
    );
    // The instances spread over every primary.
    let mut per_primary: BTreeMap<u16, usize> = BTreeMap::new();
    for port in cluster.primaries() {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_connection()
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("saga:*:inst:orders:*")
            .query(&mut c)
            .unwrap();
        per_primary.insert(port, keys.len());
    }
    assert_eq!(
        per_primary.values().sum::<usize>(),
        ORDERS,
        "{per_primary:?}"
    );
    assert!(
        per_primary.values().all(|n| *n > 0),
        "every primary holds instances: {per_primary:?}"
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tally_checked_from_outside_completes_once_on_a_cluster() {
    use sagas_tests::batch::{Batch, BatchStarted, Batches};
    let cluster = TestCluster::start();
    let engine = Engine::builder()
        .backend(backend(&cluster).await)
        .process_manager(Batches)
        .workers(2)
        .build()
        .await
        .unwrap();
    engine
        .publish(BatchStarted {
            batch: "b-1".into(),
            items: 300,
            deadline_secs: None,
            poll_secs: None,
        })
        .await
        .unwrap();
    let tally = {
        let mut tally = None;
        until("the tally opened", async || {
            let instance = engine.process_instance::<Batches>("b-1").await.unwrap();
            tally = instance
                .and_then(|i| serde_json::from_value::<Batch>(i.state).ok())
                .and_then(|b| b.tally);
            tally.is_some()
        })
        .await;
        tally.unwrap()
    };
    let checks: Vec<_> = (0..300u32)
        .map(|i| {
            let engine = engine.clone();
            let tally = tally.clone();
            tokio::spawn(async move { engine.tally(&tally).check(&i.to_string()).await })
        })
        .collect();
    let mut completed = 0;
    for check in checks {
        if matches!(check.await.unwrap().unwrap(), Checked::Completed { .. }) {
            completed += 1;
        }
    }
    assert_eq!(completed, 1, "one check completes the tally");
    until("the batch received its completion", async || {
        engine
            .process_instance::<Batches>("b-1")
            .await
            .unwrap()
            .is_some_and(|i| i.status == InstanceStatus::Completed)
    })
    .await;
    let batch: Batch = serde_json::from_value(
        engine
            .process_instance::<Batches>("b-1")
            .await
            .unwrap()
            .unwrap()
            .state,
    )
    .unwrap();
    assert_eq!(batch.completions, 1);
    engine.shutdown().await;
}

/// A primary SIGKILLed while process managers run: its replica takes
/// over, and every order still completes with each message applied once
/// (what the old primary acknowledged last is replayed: a handler's writes
/// and its acknowledgement replicate together).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_managers_ride_out_a_primary_failover() {
    let mut cluster = TestCluster::start();
    let engine = Engine::builder()
        .backend(backend(&cluster).await)
        .process_manager(Orders)
        .process_manager(Auditor)
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(2)
        .worker_concurrency(4)
        .build()
        .await
        .unwrap();
    const N: usize = 40;
    submit_orders(&engine, N).await;
    reserve_orders(&engine, N).await;
    let (old, new) = tokio::task::block_in_place(|| {
        // What was acknowledged up to here survives the failover.
        cluster.wait_replicated();
        let victim = cluster.primaries()[0];
        let slot = cluster.first_slot_of(victim);
        cluster.kill(victim);
        let new = cluster.wait_failover(victim, slot);
        cluster.restart(victim);
        (victim, new)
    });
    until_shipped(&engine, N).await;
    for i in 0..N {
        let id = format!("order-{i}");
        let order = engine
            .process_instance::<Orders>(&id)
            .await
            .unwrap()
            .unwrap();
        let state: OrderState = serde_json::from_value(order.state).unwrap();
        assert_eq!(
            (state.submitted, state.reserved, state.shipped),
            (1, 1, 1),
            "{id} (failover {old} -> {new})"
        );
    }
    engine.shutdown().await;
}

/// The spread layout with 32 process-manager partitions (its count is the
/// deployment's, recorded with the layout), on one server: messages find
/// their instances across partitions; the compact layout refuses another
/// count than its 16, and a backend asking another count than the one
/// recorded is refused with what to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_partition_count_is_the_deployments() {
    use common::redis_server::TestRedis;
    use saga_runtime::backend::redis::KeyLayout;
    let redis = TestRedis::start_with_aof(false);
    let spread = |n| RedisConfig {
        layout: KeyLayout::Spread,
        process_partitions: Some(n),
        ..config()
    };
    let engine = Engine::builder()
        .backend(
            RedisBackend::connect_with(&redis.url(), spread(32))
                .await
                .unwrap(),
        )
        .process_manager(Orders)
        .process_manager(Auditor)
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(2)
        .build()
        .await
        .unwrap();
    submit_orders(&engine, 40).await;
    reserve_orders(&engine, 40).await;
    until_shipped(&engine, 40).await;
    let tags: std::collections::BTreeSet<String> = redis
        .keys()
        .into_iter()
        .filter(|k| k.contains(":inst:orders:"))
        .filter_map(|k| Some(k.split_once('{')?.1.split_once('}')?.0.to_owned()))
        .collect();
    assert!(
        tags.len() > 16,
        "instances over more than 16 partitions: {tags:?}"
    );
    engine.shutdown().await;

    let refused = RedisBackend::connect_with(&redis.url(), spread(16))
        .await
        .err()
        .expect("another count than the recorded one");
    assert!(
        refused.to_string().contains("process_partitions: Some(32)"),
        "{refused}"
    );
    let compact = RedisConfig {
        prefix: "other".into(),
        process_partitions: Some(8),
        ..config()
    };
    let refused = RedisBackend::connect_with(&redis.url(), compact)
        .await
        .err()
        .expect("the compact layout has 16");
    assert!(refused.to_string().contains("compact layout"), "{refused}");
}
