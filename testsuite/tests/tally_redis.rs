//! Tallies on a private redis-server, what only Redis has: a check is
//! plain commands, so a checker can die between moving the last item and
//! sending the completion; the next check or housekeeping sends it, once,
//! and the completed tally leaves the set of open ones.
//! A tally checked by processes (one SIGKILLed, with duplicates), on every
//! store, is in `tests/scenarios/tally.rs`.

mod common;

use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use saga_runtime::Engine;
use sagas_tests::batch::{Batch, BatchStarted, Batches};

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
