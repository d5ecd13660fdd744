//! Tallies on a private redis-server, checked by separate processes (one
//! of them SIGKILLed mid-way, with duplicates): the batch completes exactly
//! once, the checks never write the instance, and the tally's keys expire.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use saga_runtime::backend::InstanceStatus;
use saga_runtime::Engine;
use sagas_tests::batch::{Batch, BatchStarted, Batches};

const ITEMS: u32 = 10_000;

fn checker(redis: &TestRedis, tally: &str, range: (u32, u32), seed: u64, pace_us: u64) -> Child {
    Command::new(env!("CARGO_BIN_EXE_tally-checker"))
        .env("REDIS_URL", redis.url())
        .env("TALLY", tally)
        .env("FROM", range.0.to_string())
        .env("TO", range.1.to_string())
        .env("CHECKS", "2")
        .env("SEED", seed.to_string())
        .env("PACE_US", pace_us.to_string())
        .env("RUST_LOG", "off")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn tally-checker")
}

/// How many of its checks completed the tally, as the checker reports.
fn completions(child: Child) -> u32 {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "checker failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tally_checked_by_four_processes_one_killed_completes_exactly_once() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(redis.backend().await)
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

    // Overlapping ranges, each item twice per process: duplicates within
    // and across processes. The first is slow, and is killed mid-way.
    let mut victim = checker(&redis, &json, (0, 3_000), 1, 300);
    let others: Vec<Child> = [(2_500, 5_500), (5_000, 8_000), (7_500, ITEMS)]
        .into_iter()
        .zip(2..)
        .map(|(range, seed)| checker(&redis, &json, range, seed, 0))
        .collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    victim.kill().unwrap(); // SIGKILL
    victim.wait().unwrap();
    let status = engine.tally(&tally).status().await.unwrap();
    assert!(
        !status.complete && status.checked > 0,
        "the victim was killed mid-way: {status:?}"
    );
    // Its work is redone (as a redelivered work item would be).
    let redo = checker(&redis, &json, (0, 3_000), 5, 0);
    let mut reported: u32 = others.into_iter().map(completions).sum();
    reported += completions(redo);
    assert_eq!(reported, 1, "exactly one check completed the tally");

    let until = Instant::now() + Duration::from_secs(20);
    while batch(&engine).await.completions == 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Everything checked again: nothing more happens.
    assert_eq!(completions(checker(&redis, &json, (0, ITEMS), 9, 0)), 0);
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
        "~50,000 checks, and only the start and the completion wrote the instance"
    );
    let status = engine.tally(&tally).status().await.unwrap();
    assert_eq!(
        (status.checked, status.total),
        (u64::from(ITEMS), u64::from(ITEMS))
    );

    // A completed tally's keys expire within the hour.
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*tally*").query(&mut conn).unwrap();
    assert!(!keys.is_empty());
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        assert!(ttl > 0 && ttl <= 3_600_000, "{key}: {ttl}");
    }
    engine.shutdown().await;
}

/// The last item's checker dies between its check and sending the
/// completion (simulated: the last item is moved by hand, as its check's
/// transaction would): the next check of any item sends it, and, with no
/// further checks, housekeeping does. Exactly once either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_whose_checker_died_is_sent_by_the_next_check_or_housekeeping() {
    use saga_runtime::backend::{Backend, Retention};
    use std::sync::Arc;

    let redis = TestRedis::start();
    let backend: Arc<dyn Backend> = Arc::new(redis.backend().await);
    let engine = Engine::builder()
        .backend_arc(backend.clone())
        .process_manager(Batches)
        .workers(2)
        .build()
        .await
        .unwrap();
    let retention = Retention {
        dead_letters: None,
        dead_letters_max: 1000,
        idle_consumers: Duration::from_secs(3600),
        batch: 100,
    };
    let mut conn = redis.conn();
    for batch in ["by-check", "by-housekeeping"] {
        engine
            .publish(BatchStarted {
                batch: batch.into(),
                items: 3,
                deadline_secs: None,
                poll_secs: None,
            })
            .await
            .unwrap();
    }
    let mut tallies = Vec::new();
    for batch in ["by-check", "by-housekeeping"] {
        let until = Instant::now() + Duration::from_secs(10);
        let tally = loop {
            let state = engine.process_state::<Batches>(batch).await.unwrap();
            if let Some(Batch { tally: Some(t), .. }) = state {
                break t;
            }
            assert!(Instant::now() < until, "{batch} never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        for item in ["0", "1"] {
            engine.tally(&tally).check(item).await.unwrap();
        }
        let key = |part: &str| {
            format!(
                "saga:{{saga:pm}}:tally{part}:{}:{}:{}:{}",
                tally.process, tally.name, tally.generation, tally.instance
            )
        };
        let moved: i64 = redis::cmd("SMOVE")
            .arg(key(":pending"))
            .arg(key(":checked"))
            .arg("2")
            .query(&mut conn)
            .unwrap();
        assert_eq!(moved, 1, "the layout the test writes to is the tally's");
        tallies.push(tally);
    }
    let completions = |batch: &'static str| {
        let engine = engine.clone();
        async move {
            engine
                .process_state::<Batches>(batch)
                .await
                .unwrap()
                .unwrap()
                .completions
        }
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(completions("by-check").await, 0, "nothing sent it yet");

    let dup = engine.tally(&tallies[0]).check("0").await.unwrap();
    assert_eq!(dup, saga_runtime::engine::Checked::AlreadyChecked);
    let swept = backend.housekeep(&retention).await.unwrap();
    assert_eq!(swept.tallies, 1, "only the other one was left unsent");
    let again = backend.housekeep(&retention).await.unwrap();
    assert_eq!(again.tallies, 0);
    let until = Instant::now() + Duration::from_secs(10);
    while (
        completions("by-check").await,
        completions("by-housekeeping").await,
    ) != (1, 1)
    {
        assert!(Instant::now() < until, "a completion was lost");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    engine.tally(&tallies[1]).check("1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        (
            completions("by-check").await,
            completions("by-housekeeping").await
        ),
        (1, 1),
        "and only once"
    );
    let open: u64 = redis::cmd("ZCARD")
        .arg("saga:{saga:pm}:tallies")
        .query(&mut conn)
        .unwrap();
    assert_eq!(open, 0, "completed tallies leave the open set");
    engine.shutdown().await;
}
