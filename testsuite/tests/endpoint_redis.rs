//! Endpoints on a private redis-server, what only Redis has: a consumer
//! written against the documented key and envelope with plain commands, a
//! consumer that outlives the loss of its consumer group, one that blocks
//! again after a restart, and restarted consumers that do not pile up in
//! the group. A consumer killed mid-handler and an endpoint's cap, on
//! every store, are in `tests/scenarios/endpoints.rs`.

mod common;

use common::until;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::endpoint_shop::{order, SendInvoice, Shop};
use common::redis_server::TestRedis;
use saga_runtime::prelude::*;

const KEY: &str = "saga:{saga:pm}:endpoint:invoicing";

async fn engine(redis: &TestRedis, workers: usize) -> Engine {
    Engine::builder()
        .backend(redis.backend().await)
        .process_manager(Shop)
        .workers(workers)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_redis_client_consumes_the_documented_stream() {
    let redis = TestRedis::start();
    let engine = engine(&redis, 2).await;
    let mut conn = redis.conn();
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(KEY)
        .arg("billing")
        .arg("0")
        .arg("MKSTREAM")
        .query(&mut conn)
        .unwrap();
    engine.publish(order(7)).await.unwrap();
    let read: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("billing")
        .arg("worker-1")
        .arg("COUNT")
        .arg(10)
        .arg("BLOCK")
        .arg(5000)
        .arg("STREAMS")
        .arg(KEY)
        .arg(">")
        .query(&mut conn)
        .unwrap();
    let entry = &read.keys[0].ids[0];
    let envelope: String = entry.get("envelope").expect("the `envelope` field");
    let envelope: serde_json::Value = serde_json::from_str(&envelope).unwrap();
    assert_eq!(envelope["v"], 1);
    assert_eq!(envelope["message_type"], "SendInvoice");
    assert_eq!(envelope["from"], "shop");
    assert_eq!(envelope["correlation_id"], "o-7");
    assert_eq!(envelope["headers"]["instance"], "o-7");
    assert_eq!(envelope["payload"]["order"], "o-7");
    assert!(envelope["message_id"]
        .as_str()
        .is_some_and(|id| !id.is_empty()));
    let acked: i64 = redis::cmd("XACK")
        .arg(KEY)
        .arg("billing")
        .arg(&entry.id)
        .query(&mut conn)
        .unwrap();
    assert_eq!(acked, 1);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_outlives_the_loss_of_its_group() {
    let redis = TestRedis::start();
    let engine = engine(&redis, 2).await;
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
    let mut conn = redis.conn();
    let _: i64 = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(KEY)
        .arg("consumers")
        .query(&mut conn)
        .unwrap();
    engine.publish(order(2)).await.unwrap();
    until("second, after the group was lost", async || {
        done.lock().unwrap().contains(&"o-2".to_owned())
    })
    .await;
    // A recreated group starts at the oldest message kept: o-1 may come
    // again (at least once; consumers drop duplicates by message id).
    let done = done.lock().unwrap().clone();
    assert!(done.iter().all(|o| o == "o-1" || o == "o-2"), "{done:?}");
    engine.shutdown().await;
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
    let engine = engine(&redis, 1).await;
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
        let engine = engine(&redis, 1).await;
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
