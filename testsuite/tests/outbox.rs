//! An endpoint is an outbox while a consumer group reads it: no message a
//! group has not settled is trimmed away; one at its cap refuses the write
//! (the handler's message waits) instead, whole when it sends several. An
//! endpoint nobody reads keeps its newest messages, exactly its cap of
//! them. The same scenario on memory, Redis and PostgreSQL, with a cap
//! of 5.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::postgres_server::TestPostgres;
use common::redis_server::TestRedis;
use saga_runtime::backend::memory::MemoryBackend;
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::{
    Endpoints, InstanceStatus, ProcessBackend, ProcessCommit, ProcessInstance, ProcessRefusal,
    Settle,
};
use saga_runtime::prelude::*;
use saga_runtime::task::Timestamp;
use sagas_tests::shop::Fulfillment;
use serde_json::json;

const CAP: usize = 5;

fn instance(id: &str, version: u64) -> ProcessInstance {
    ProcessInstance {
        process: "pm".into(),
        id: id.into(),
        generation: format!("{id}-g"),
        started_by: None,
        state: json!({}),
        status: InstanceStatus::Active,
        version,
        keys: Vec::new(),
        processed: Vec::new(),
        audit_log: Vec::new(),
        created_at: Timestamp::now(),
        updated_at: Timestamp::now(),
    }
}

fn envelope(n: usize) -> String {
    json!({"v": 1, "message_id": format!("m-{n}"), "message_type": "T", "from": "pm", "payload": {"n": n}})
        .to_string()
}

/// A write of instance `id` at `version` sending message `n` to `endpoint`.
async fn send(
    p: &dyn ProcessBackend,
    i: &ProcessInstance,
    endpoint: &str,
    n: usize,
) -> Result<u64, ProcessRefusal> {
    let mut commit = ProcessCommit::new(Some(i), Settle::Nothing);
    commit.endpoints = vec![(endpoint.to_owned(), envelope(n))];
    p.process_commit("pm", commit).await.unwrap()
}

async fn scenario(p: Arc<dyn ProcessBackend>) {
    // Read by a group: the group's consumer reads one message first.
    let mut read = instance("a", 0);
    assert!(send(&*p, &read, "billing", 0).await.is_ok());
    read.version = 1;
    let first = p
        .endpoint_receive("billing", "g", "c", Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap()
        .expect("the first message");
    for n in 1..CAP - 1 {
        assert!(send(&*p, &read, "billing", n).await.is_ok(), "{n}");
        read.version += 1;
    }
    // One short of the cap, a write of two: refused whole (it went past
    // the cap by one on Redis and memory, which counted one message).
    let mut two = ProcessCommit::new(Some(&read), Settle::Nothing);
    two.endpoints = vec![
        ("billing".to_owned(), envelope(CAP - 1)),
        ("billing".to_owned(), envelope(CAP)),
    ];
    assert_eq!(
        p.process_commit("pm", two).await.unwrap(),
        Err(ProcessRefusal::EndpointFull {
            endpoint: "billing".into()
        })
    );
    assert_eq!(p.endpoint_messages("billing").await.unwrap().len(), CAP - 1);
    assert!(send(&*p, &read, "billing", CAP - 1).await.is_ok());
    read.version += 1;
    // At the cap, with nothing settled: refused, the instance untouched.
    let refused = send(&*p, &read, "billing", CAP).await;
    assert_eq!(
        refused,
        Err(ProcessRefusal::EndpointFull {
            endpoint: "billing".into()
        })
    );
    assert_eq!(
        p.process_load("pm", "a").await.unwrap().unwrap().version,
        read.version
    );
    let kept = p.endpoint_messages("billing").await.unwrap();
    assert_eq!(kept.len(), CAP, "nothing unread was dropped");
    assert!(kept[0].contains("\"m-0\""), "the oldest is still there");
    // The group catches up and its settled messages are trimmed: room again.
    p.endpoint_settle("billing", "g", &first, None)
        .await
        .unwrap();
    while let Some(d) = p
        .endpoint_receive("billing", "g", "c", Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap()
    {
        p.endpoint_settle("billing", "g", &d, None).await.unwrap();
    }
    p.endpoint_trim("billing", Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(
        send(&*p, &read, "billing", CAP).await.is_ok(),
        "room again after the trim"
    );

    // Read by nobody: a log of its newest messages, exactly its cap of
    // them, which never refuses (Redis trimmed whole stream nodes, `MAXLEN
    // ~`, and kept all 15 here).
    let mut log = instance("b", 0);
    for n in 0..CAP * 3 {
        assert!(send(&*p, &log, "journal", n).await.is_ok(), "{n}");
        log.version += 1;
    }
    let kept = p.endpoint_messages("journal").await.unwrap();
    assert_eq!(kept.len(), CAP, "{kept:?}");
    assert!(kept[0].contains(&format!("\"m-{}\"", CAP * 2)), "{kept:?}");
    assert!(kept
        .last()
        .unwrap()
        .contains(&format!("\"m-{}\"", CAP * 3 - 1)));
}

#[tokio::test]
async fn memory() {
    let backend = Arc::new(MemoryBackend::new().with_endpoint_cap(CAP));
    scenario(backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis() {
    let redis = TestRedis::start();
    let config = RedisConfig {
        endpoint_max_len: CAP,
        ..RedisConfig::default()
    };
    let backend = RedisBackend::connect_with(&redis.url(), config)
        .await
        .unwrap();
    scenario(Arc::new(backend)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let pg = TestPostgres::start();
    let config = PostgresConfig {
        endpoint_max_len: CAP,
        ..PostgresConfig::default()
    };
    let backend = PostgresBackend::connect_url(&pg.url(), config)
        .await
        .unwrap();
    scenario(Arc::new(backend)).await;
}

/// Through the engine: a handler whose send an endpoint refuses waits, and
/// is saved once its endpoint's consumer catches up; nothing is lost.
#[tokio::test]
async fn a_handler_whose_endpoint_is_full_waits_for_its_consumer() {
    let backend = MemoryBackend::new().with_endpoint_cap(2);
    let engine = Engine::builder()
        .backend(backend.clone())
        .process_manager(Fulfillment)
        .build()
        .await
        .unwrap();
    // A consumer group reads `shipping`: it is an outbox.
    backend
        .endpoint_receive(
            sagas_tests::shop::SHIPPING,
            "g",
            "c",
            Duration::from_secs(60),
            Duration::ZERO,
        )
        .await
        .unwrap();
    for n in 0..3 {
        engine_publish(&engine, &format!("o-{n}"), n).await;
    }
    let shipped = async || {
        backend
            .endpoint_messages(sagas_tests::shop::SHIPPING)
            .await
            .unwrap()
            .len()
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(shipped().await, 2, "the third waits: the endpoint is full");
    let waiting = engine.process_instance::<Fulfillment>("o-2").await.unwrap();
    assert!(
        waiting.is_none_or(|i| i.status == InstanceStatus::Active),
        "the third order is not complete yet"
    );
    // The consumer settles what it has; the third goes through.
    while let Some(d) = backend
        .endpoint_receive(
            sagas_tests::shop::SHIPPING,
            "g",
            "c",
            Duration::ZERO,
            Duration::ZERO,
        )
        .await
        .unwrap()
    {
        backend
            .endpoint_settle(sagas_tests::shop::SHIPPING, "g", &d, None)
            .await
            .unwrap();
    }
    backend
        .endpoint_trim(sagas_tests::shop::SHIPPING, Duration::from_secs(3600))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let done = engine
            .process_instance::<Fulfillment>("o-2")
            .await
            .unwrap()
            .is_some_and(|i| i.status == InstanceStatus::Completed);
        if done {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the third never went out"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    engine.shutdown().await;
}

/// Submits, reserves and pays order `id` (it ships when all three are in).
async fn engine_publish(engine: &Engine, id: &str, n: usize) {
    use sagas_tests::shop::{InventoryReserved, OrderSubmitted, PaymentCaptured};
    let number = format!("A-{n}");
    engine
        .publish(OrderSubmitted {
            order_id: id.into(),
            order_number: number.clone(),
        })
        .await
        .unwrap();
    engine
        .publish(InventoryReserved {
            order_number: number,
        })
        .await
        .unwrap();
    engine
        .publish(PaymentCaptured {
            order_id: id.into(),
        })
        .await
        .unwrap();
}
