//! The engine on Redis: entries other producers wrote straight onto the
//! stream (malformed, or with no payload) dead-lettered with the other
//! kinds of bad input. A server SIGKILLed and restarted mid-run
//! (`scenarios/faults.rs`), a long step keeping its lease and a
//! cancellation across engines (`scenarios/leases.rs`) are engine
//! scenarios, on every store.

mod common;

use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::{QueueMessage, WorkItem};
use saga_runtime::prelude::*;
use sagas_tests::double::Double;

async fn backend(redis: &TestRedis) -> RedisBackend {
    let config = RedisConfig {
        visibility_timeout: Duration::from_millis(800),
        block: Duration::from_millis(200),
        ..RedisConfig::default()
    };
    RedisBackend::connect_with(&redis.url(), config)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_on_the_stream_is_dead_lettered_and_other_tasks_finish() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(backend(&redis).await)
        .saga(Double)
        // The message for an unknown saga goes back twice (1 s, 2 s) for a
        // worker that knows it, then is dead-lettered.
        .max_deliveries(2)
        .timeout_poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let backend = engine.backend().clone();

    // A malformed entry written straight onto the stream by another producer.
    let mut conn = redis.conn();
    let _: String = redis::cmd("XADD")
        .arg("saga:{saga:0}:queue")
        .arg("*")
        .arg("payload")
        .arg("{oops")
        .query(&mut conn)
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg("saga:{saga:0}:queue")
        .arg("*")
        .arg("unexpected")
        .arg("field")
        .query(&mut conn)
        .unwrap();
    let stray = TaskId::new();
    backend
        .enqueue(&[WorkItem::Saga(QueueMessage {
            task_id: stray,
            saga: "no-such-saga".into(),
            seq: 0,
        })])
        .await
        .unwrap();
    let bad = TaskInstance::new(
        "double",
        serde_json::json!("three"),
        [("double".to_owned(), 1)],
    );
    backend
        .create_task(
            &bad,
            &QueueMessage {
                task_id: bad.id,
                saga: "double".into(),
                seq: 0,
            },
        )
        .await
        .unwrap();
    let good: Vec<TaskId> =
        futures::future::try_join_all((0..10).map(|n| engine.start::<Double>(n)))
            .await
            .unwrap();

    for (n, id) in good.iter().enumerate() {
        assert_eq!(
            engine
                .wait(*id)
                .await
                .unwrap()
                .output_as::<u32>()
                .unwrap()
                .unwrap(),
            n as u32 * 2
        );
    }
    assert_eq!(
        engine.wait(bad.id).await.unwrap().status,
        TaskStatus::DeadLettered
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let letters = loop {
        let letters = engine
            .dead_letters(Default::default())
            .await
            .unwrap()
            .letters;
        if letters.len() == 4 || Instant::now() > deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let reasons: Vec<&str> = letters.iter().map(|l| l.reason.as_str()).collect();
    assert_eq!(letters.len(), 4, "{reasons:?}");
    assert_eq!(
        reasons
            .iter()
            .filter(|r| r.starts_with("malformed message"))
            .count(),
        2,
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("unknown saga `no-such-saga`")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("does not deserialize as `u32`")),
        "{reasons:?}"
    );
    assert!(
        letters.iter().any(|l| l.payload == "{oops"),
        "the raw payload is kept"
    );
}
