//! `worker_concurrency`: one worker works on several messages at once, on
//! the paused clock (the in-memory backend hands out one message per read,
//! so the worker must keep reading while slots are free).

use std::time::Duration;

use saga_runtime::prelude::*;

struct Slow;

#[saga(name = "slow")]
impl Slow {
    #[saga_step(1, timeout_ms = 600_000)]
    async fn nap(&self, secs: u64) -> Result<u64, StepError> {
        tokio::time::sleep(Duration::from_secs(secs)).await;
        Ok(secs)
    }
}

#[tokio::test(start_paused = true)]
async fn one_worker_runs_as_many_steps_at_once_as_its_concurrency() {
    let engine = Engine::builder()
        .saga(Slow)
        .workers(1)
        .worker_concurrency(4)
        .build()
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(engine.start::<Slow>(100).await.unwrap());
    }
    for id in ids {
        assert_eq!(engine.wait(id).await.unwrap().status, TaskStatus::Completed);
    }
    // Four 100 s steps side by side: a little over 100 s, not 200 (three
    // at once and the fourth after) nor 400 (one at a time).
    let took = started.elapsed();
    assert!(took < Duration::from_secs(150), "took {took:?}");
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_long_step_does_not_keep_the_other_slots_idle() {
    let engine = Engine::builder()
        .saga(Slow)
        .workers(1)
        .worker_concurrency(4)
        .build()
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let mut long = Vec::new();
    for _ in 0..3 {
        long.push(engine.start::<Slow>(500).await.unwrap());
    }
    // Short ones queued behind three steps that run for 500 s: they go
    // through the fourth slot one after another.
    let mut short = Vec::new();
    for _ in 0..3 {
        short.push(engine.start::<Slow>(10).await.unwrap());
    }
    for id in short {
        assert_eq!(engine.wait(id).await.unwrap().status, TaskStatus::Completed);
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(100), "took {took:?}");
    for id in long {
        assert_eq!(engine.wait(id).await.unwrap().status, TaskStatus::Completed);
    }
    engine.shutdown().await;
}
