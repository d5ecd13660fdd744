//! Faults only Redis has, against a real redis-server (private per test):
//! lost consumer groups, undecodable stream entries. Each reproduces one way
//! the engine used to stall, loop or grow, and proves that every started
//! task now ends. The faults every store has are engine scenarios, written
//! once for every store (`tests/engine_scenarios.rs`).

mod common;

use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use redis::Value;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use sagas_tests::double::{all_doubled, start_doubles, Double};

async fn backend(redis: &TestRedis, visibility: Duration) -> RedisBackend {
    let config = RedisConfig {
        visibility_timeout: visibility,
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    };
    RedisBackend::connect_with(&redis.url(), config)
        .await
        .unwrap()
}

/// Defect 1: Redis loses its consumer groups (FLUSHALL, a restart without
/// persistence). The claim path used to return `NOGROUP` before the code
/// that recreates groups, and the error backoff never reset: new tasks were
/// accepted and never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_consumer_groups_are_recreated_and_new_tasks_run() {
    let mut redis = TestRedis::start_with_aof(false);
    // Short enough that the claim path is due on every read (it claims
    // every half visibility timeout): that is where NOGROUP used to stick.
    let visibility = Duration::from_millis(100);
    let engine = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .workers(2)
        .build()
        .await
        .unwrap();
    let ids = start_doubles(&engine, 0..3).await;
    all_doubled(&engine, &ids, Duration::from_secs(10)).await;

    // The data and the groups go; the workers' claim path meets NOGROUP.
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
    tokio::time::sleep(visibility * 4).await;
    let ids = start_doubles(&engine, 10..15).await;
    all_doubled(&engine, &ids, Duration::from_secs(10)).await;

    // A restart that keeps nothing.
    redis.restart();
    tokio::time::sleep(visibility * 4).await;
    let ids = start_doubles(&engine, 20..25).await;
    all_doubled(&engine, &ids, Duration::from_secs(15)).await;
}

/// Defect 2: one entry a buggy producer wrote (a field name that is not
/// UTF-8) failed the whole claimed or read batch after ownership had moved:
/// every message in it was stranded, and the bad entry was never
/// dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_entry_is_dead_lettered_alone_and_strands_nothing() {
    let redis = TestRedis::start();
    let visibility = Duration::from_millis(400);
    let client = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .workers(0)
        .build()
        .await
        .unwrap();
    let mut conn = redis.conn();
    let queue = "saga:{saga:0}:queue";
    let bad_field = |conn: &mut redis::Connection| {
        let _: String = redis::cmd("XADD")
            .arg(queue)
            .arg("*")
            .arg(&[0xffu8, 0xfe][..])
            .arg("x")
            .query(conn)
            .unwrap();
    };
    // A batch that a worker read and then died holding: good, bad, good.
    let mut ids = start_doubles(&client, 1..2).await;
    bad_field(&mut conn);
    ids.extend(start_doubles(&client, 2..3).await);
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("a-worker-that-died")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg(queue)
        .arg(">")
        .query(&mut conn)
        .unwrap();
    // And more that a live worker reads itself: a bad entry, a payload
    // that is not UTF-8, a good task.
    bad_field(&mut conn);
    let _: String = redis::cmd("XADD")
        .arg(queue)
        .arg("*")
        .arg("payload")
        .arg(&[0xffu8, b'{'][..])
        .query(&mut conn)
        .unwrap();
    ids.extend(start_doubles(&client, 3..4).await);

    let _workers = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .workers(1)
        .build()
        .await
        .unwrap();
    all_doubled(&client, &ids, Duration::from_secs(10)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let letters = loop {
        let letters = client
            .dead_letters(Default::default())
            .await
            .unwrap()
            .letters;
        if letters.len() >= 3 || Instant::now() > deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(letters.len(), 3, "{letters:#?}");
    assert!(
        letters
            .iter()
            .all(|l| l.reason.starts_with("malformed message")),
        "{letters:#?}"
    );
}

/// Issue 39, finding 2: an undecodable entry (a field name that is not
/// UTF-8) that a dead consumer held beside a real task's message. Two live
/// worker loops take both over at once; the real one runs alone (it comes
/// from a worker that died), and the bad one, handed back for later, was
/// acknowledged and deleted by the hand-back because it had no payload to
/// copy: neither pending nor dead-lettered, in about half the rounds.
/// Repeated (`UNDECODABLE_ROUNDS`, 16 by default: before the fix, at least one
/// round in 12 failed in each of 4 runs) on a fresh server each
/// round; the count is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_entry_taken_over_with_others_is_never_dropped() {
    let rounds: usize = std::env::var("UNDECODABLE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(16);
    eprintln!("undecodable take-over rounds: {rounds} (set UNDECODABLE_ROUNDS to change)");
    for round in 0..rounds {
        undecodable_taken_over_round(round).await;
    }
}

async fn undecodable_taken_over_round(round: usize) {
    let redis = TestRedis::start_with_aof(false);
    let visibility = Duration::from_millis(300);
    let client = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .workers(0)
        .build()
        .await
        .unwrap();
    let mut conn = redis.conn();
    let queue = "saga:{saga:0}:queue";
    let _: String = redis::cmd("XADD")
        .arg(queue)
        .arg("*")
        .arg(&[0xffu8, 0xfe][..])
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let ids = start_doubles(&client, 7..8).await;
    // A consumer reads both and dies without settling either.
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("a-worker-that-died")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg(queue)
        .arg(">")
        .query(&mut conn)
        .unwrap();
    let workers = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .workers(2)
        .build()
        .await
        .unwrap();
    all_doubled(&client, &ids, Duration::from_secs(10)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let letters = loop {
        let letters = client
            .dead_letters(Default::default())
            .await
            .unwrap()
            .letters;
        if !letters.is_empty() || Instant::now() > deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let pending: Vec<Value> = redis::cmd("XPENDING")
        .arg(queue)
        .arg("workers")
        .arg("-")
        .arg("+")
        .arg(10)
        .query(&mut conn)
        .unwrap();
    let entries: Vec<Value> = redis::cmd("XRANGE")
        .arg(queue)
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        letters.len(),
        1,
        "round {round}: the undecodable entry is not among the dead letters \
         ({} pending, {} in the stream): {letters:#?}",
        pending.len(),
        entries.len()
    );
    assert!(
        letters[0].reason.starts_with("malformed message"),
        "round {round}: {letters:#?}"
    );
    workers.shutdown().await;
}

/// The store's own side of finding 2: a delivery handed back (`release`,
/// `defer`, as a worker does on shutdown, or the store with the extras of
/// a read over several streams) whose entry has no payload to copy is
/// dead-lettered with its reason, not settled and lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handing_back_an_entry_without_a_payload_dead_letters_it() {
    use saga_runtime::backend::{DeadLetterQuery, DeadLetters, Interest, WorkQueue};
    let redis = TestRedis::start_with_aof(false);
    let store = backend(&redis, Duration::from_secs(30)).await;
    // The engine creates the consumer groups.
    let _engine = Engine::builder()
        .backend(store.clone())
        .saga(Double)
        .workers(0)
        .build()
        .await
        .unwrap();
    let mut conn = redis.conn();
    for _ in 0..2 {
        let _: String = redis::cmd("XADD")
            .arg("saga:{saga:0}:queue")
            .arg("*")
            .arg(&[0xffu8, 0xfe][..])
            .arg("x")
            .query(&mut conn)
            .unwrap();
    }
    let interest = Interest {
        processes: false,
        ..Interest::ALL
    };
    let wait = Duration::from_millis(100);
    let first = store.receive("c1", interest, wait).await.unwrap().unwrap();
    store.release(&first, Duration::ZERO).await.unwrap();
    let second = store.receive("c1", interest, wait).await.unwrap().unwrap();
    assert_ne!(first.id, second.id);
    store.defer(&second, Duration::from_secs(5)).await.unwrap();
    let query = DeadLetterQuery {
        after: None,
        limit: 10,
    };
    let letters = store.dead_letters(&query).await.unwrap().items;
    assert_eq!(letters.len(), 2, "{letters:#?}");
    assert!(
        letters
            .iter()
            .all(|l| l.reason.starts_with("malformed message")),
        "{letters:#?}"
    );
    let pending: Vec<Value> = redis::cmd("XPENDING")
        .arg("saga:{saga:0}:queue")
        .arg("workers")
        .arg("-")
        .arg("+")
        .arg(10)
        .query(&mut conn)
        .unwrap();
    assert!(pending.is_empty(), "{pending:?}");
}
