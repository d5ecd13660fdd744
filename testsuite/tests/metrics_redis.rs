//! The queue gauges (feature `metrics`) on Redis: one pipelined round trip
//! per housekeeping beat, sampled by every engine that runs workers, here
//! one that runs only a process manager while saga messages wait for a
//! worker that runs their saga. A private redis-server; its own binary for
//! the process's global recorder.

mod common;

use std::time::Duration;

use common::prometheus::sample;
use common::redis_server::TestRedis;
use saga_runtime::metrics::PrometheusHandle;
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

struct Ship;

#[saga(name = "metrics-ship")]
impl Ship {
    #[saga_step(1)]
    async fn ship(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

#[derive(Message, Serialize, Deserialize)]
struct Ping {
    #[correlation_id]
    id: String,
}

#[derive(Default, Serialize, Deserialize)]
struct Pings {
    n: u32,
}

struct Pinger;

#[process_manager(name = "metrics-pinger", state = Pings)]
impl Pinger {
    #[starts]
    async fn ping(
        &self,
        _msg: Ping,
        state: &mut Pings,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.n += 1;
        Ok(())
    }
}

/// The two saga-queue gauges, once `check` accepts them.
async fn gauges(handle: &PrometheusHandle, check: impl Fn(f64, f64) -> bool) -> (f64, f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = handle.render();
        let depth = sample(&text, "saga_queue_depth", &[("queue", "saga")]);
        let age = sample(
            &text,
            "saga_queue_oldest_pending_age_seconds",
            &[("queue", "saga")],
        );
        if let (Some(depth), Some(age)) = (depth, age) {
            if check(depth, age) {
                return (depth, age);
            }
        }
        if tokio::time::Instant::now() > deadline {
            panic!("the queue gauges never read as expected:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_gauges_follow_the_redis_backlog() {
    let handle = saga_runtime::metrics::install().unwrap();
    let redis = TestRedis::start();

    // Starts tasks, runs no workers.
    let producer = Engine::builder()
        .backend(redis.backend().await)
        .saga(Ship)
        .workers(0)
        .build()
        .await
        .unwrap();
    // Runs workers (so it samples) that take only process-manager messages.
    let sampler = Engine::builder()
        .backend(redis.backend().await)
        .process_manager(Pinger)
        .housekeeping_interval(Duration::from_millis(50))
        .workers(1)
        .build()
        .await
        .unwrap();

    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(producer.start::<Ship>(n).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (depth, age) = gauges(&handle, |depth, age| depth == 3.0 && age >= 0.2).await;
    assert!(age < 10.0, "{depth} messages, the oldest {age} s old");
    assert_eq!(
        sample(
            &handle.render(),
            "saga_queue_depth",
            &[("queue", "process")]
        ),
        Some(0.0),
        "no process-manager message waits"
    );

    // A worker that runs the saga drains the queue.
    let worker = Engine::builder()
        .backend(redis.backend().await)
        .saga(Ship)
        .workers(1)
        .build()
        .await
        .unwrap();
    for id in ids {
        assert_eq!(worker.wait(id).await.unwrap().status, TaskStatus::Completed);
    }
    gauges(&handle, |depth, age| depth == 0.0 && age == 0.0).await;

    worker.shutdown().await;
    sampler.shutdown().await;
    producer.shutdown().await;
}
