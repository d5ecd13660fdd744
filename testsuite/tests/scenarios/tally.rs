//! Tallies, on every store: a tally of 10,000 items checked by eight
//! `tally-checker` processes on the store over overlapping ranges, each
//! item twice per process (duplicates within and across processes), one
//! of them SIGKILLed mid-way and its range redone: exactly one check
//! completes it, the process manager handles one completion, the ~60,000
//! checks never write the instance, checking everything again changes
//! nothing, and the completed tally is kept an hour at most.
//!
//! The checker that is SIGKILLed counts its checks on the rig's Redis,
//! out of the store's way, so that it is killed once it is checking. A
//! completion whose checker died between its check and sending it is
//! Redis's alone (its checks are plain commands; a PostgreSQL check
//! enqueues the completion in its own statement): `tests/tally_redis.rs`.

use std::any::Any;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use saga_runtime::backend::InstanceStatus;
use saga_runtime::prelude::*;
use sagas_tests::batch::{Batch, BatchStarted, Batches};

use super::rig::{Rig, Worker};
use crate::common::postgres_server::TestPostgres;
use crate::common::redis_server::TestRedis;
use crate::common::stores::ScenarioStore;

const ITEMS: u32 = 10_000;

/// How many checker processes check the tally at once.
const CHECKERS: u32 = 8;

/// A `tally-checker` process on the rig's store checking `range` of
/// `tally` twice over, shuffled by `seed`; with `name`, counting its checks
/// on the rig's Redis. SIGKILLed when dropped.
fn checker<S: ScenarioStore>(
    rig: &Rig<S>,
    tally: &str,
    name: Option<&str>,
    range: (u32, u32),
    seed: u64,
    pace_us: u64,
) -> Worker {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tally-checker"));
    cmd.env("BACKEND_URL", rig.store.url())
        .env("RECORD_URL", rig.record.url())
        .env("TALLY", tally)
        .env("FROM", range.0.to_string())
        .env("TO", range.1.to_string())
        .env("CHECKS", "2")
        .env("SEED", seed.to_string())
        .env("PACE_US", pace_us.to_string())
        .env("RUST_LOG", "off")
        .stdout(Stdio::piped());
    if let Some(name) = name {
        cmd.env("NAME", name);
    }
    Worker(cmd.spawn().expect("spawn tally-checker"))
}

/// How many of its checks completed the tally, as the checker reports
/// once it is done.
fn completions(mut checker: Worker) -> u32 {
    let mut text = String::new();
    checker
        .0
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut text)
        .unwrap();
    let status = checker.0.wait().unwrap();
    assert!(
        status.success(),
        "checker failed: {status:?}, said {text:?}"
    );
    text.trim()
        .strip_prefix("completed=")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("checker said {text:?}"))
}

async fn batch(engine: &Engine) -> Batch {
    engine
        .process_state::<Batches>("big")
        .await
        .unwrap()
        .unwrap_or_default()
}

/// What the store keeps of a completed tally expires within the hour:
/// every Redis key of it has a TTL of an hour at most, every PostgreSQL
/// row an `expires_at` within the hour.
fn kept_an_hour_at_most<S: ScenarioStore>(store: &S) {
    let store: &dyn Any = store;
    if let Some(redis) = store.downcast_ref::<TestRedis>() {
        let mut conn = redis.conn();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*tally*").query(&mut conn).unwrap();
        assert!(!keys.is_empty());
        for key in keys {
            let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
            assert!(ttl > 0 && ttl <= 3_600_000, "{key}: {ttl}");
        }
    } else if let Some(pg) = store.downcast_ref::<TestPostgres>() {
        let kept = pg.psql(
            "SELECT count(*), count(*) FILTER (WHERE expires_at > clock_timestamp() \
             AND expires_at <= clock_timestamp() + interval '1 hour') FROM saga.tallies",
        );
        let (all, within) = kept.split_once('|').expect("two counts");
        assert!(all != "0" && within == all, "{within} of {all} tallies");
    } else {
        panic!("no way to read what this store keeps of a tally");
    }
}

/// Eight checker processes over overlapping ranges, each item twice per
/// process; the first, slow one is SIGKILLed mid-way and its range redone
/// (as a redelivered work item would be): exactly one check completes the
/// tally, once.
pub async fn a_tally_checked_by_eight_processes_with_duplicates_one_killed_completes_exactly_once<
    S: ScenarioStore,
>() {
    let rig = Rig::<S>::start();
    let engine = Engine::builder()
        .backend_arc(rig.store.backend(Duration::from_secs(2)).await)
        .process_manager(Batches)
        .workers(2)
        .build()
        .await
        .unwrap();
    engine
        .publish(BatchStarted {
            batch: "big".into(),
            items: ITEMS,
            deadline_secs: None,
            poll_secs: None,
        })
        .await
        .unwrap();
    let started = Instant::now();
    let tally = loop {
        if let Some(t) = batch(&engine).await.tally {
            break t;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let json = serde_json::to_string(&tally).unwrap();

    // Overlapping ranges, each twice the eighth it starts at (the last
    // ends at ITEMS): duplicates within and across processes. The first is
    // slow, and is killed mid-way; the first half of its range is its
    // alone.
    let range = |n: u32| {
        let from = n * ITEMS / CHECKERS;
        (from, (from + 2 * ITEMS / CHECKERS).min(ITEMS))
    };
    let t = Instant::now();
    let mut victim = checker(&rig, &json, Some("victim"), range(0), 1, 300);
    let others: Vec<Worker> = (1..CHECKERS)
        .map(|n| checker(&rig, &json, None, range(n), u64::from(n) + 1, 0))
        .collect();
    let mut recorder = rig.record.conn();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let checks: Option<u64> = redis::cmd("GET")
            .arg("tally-checker:victim:checks")
            .query(&mut recorder)
            .unwrap();
        if checks.unwrap_or(0) >= 200 {
            break;
        }
        assert!(!victim.exited(), "the victim ended before it was killed");
        assert!(Instant::now() < deadline, "the victim never checked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    victim.0.kill().unwrap(); // SIGKILL
    victim.0.wait().unwrap();
    let status = engine.tally(&tally).status().await.unwrap();
    assert!(
        !status.complete && status.checked > 0,
        "the victim was killed mid-way: {status:?}"
    );
    // Its work is redone (as a redelivered work item would be).
    let redo = checker(&rig, &json, None, range(0), 99, 0);
    let mut reported: u32 = others.into_iter().map(completions).sum();
    reported += completions(redo);
    println!(
        "{ITEMS} items checked twice by {CHECKERS} processes (one SIGKILLed) and a redo: {:?}",
        t.elapsed()
    );
    assert_eq!(reported, 1, "exactly one check completed the tally");

    let until = Instant::now() + Duration::from_secs(20);
    while batch(&engine).await.completions == 0 {
        assert!(Instant::now() < until, "the completion was never handled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Everything checked again: nothing more happens.
    let t = Instant::now();
    assert_eq!(completions(checker(&rig, &json, None, (0, ITEMS), 9, 0)), 0);
    println!("{ITEMS} items checked twice again: {:?}", t.elapsed());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let instance = engine
        .process_instance::<Batches>("big")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(batch(&engine).await.completions, 1);
    assert_eq!(instance.status, InstanceStatus::Completed);
    assert_eq!(
        instance.version, 2,
        "~60,000 checks, and only the start and the completion wrote the instance"
    );
    let status = engine.tally(&tally).status().await.unwrap();
    assert_eq!(
        (status.checked, status.total),
        (u64::from(ITEMS), u64::from(ITEMS))
    );

    // A completed tally is kept an hour at most.
    kept_an_hour_at_most(&rig.store);
    engine.shutdown().await;
}
