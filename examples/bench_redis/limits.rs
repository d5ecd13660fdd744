//! `bench_redis --limits`: the benchmark's no-op saga next to the same
//! saga with every step under a concurrency limit it never reaches, in one
//! run: round trips per step (1 worker, MONITOR) and steps per second (1
//! worker; 4 workers of read batch 16), and their ratios. The unlimited
//! figures are measured here the same way as the limited ones, on the same
//! server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;

use super::{commandstats, durability, process_cpu, redis_cpu, redis_server, NoOp};

/// `NoOp` with every step under a concurrency limit it never reaches
/// (`--limits`): what a limit costs where it does not bite.
struct Limited {
    done: Arc<AtomicU64>,
}

#[saga(name = "limited")]
impl Limited {
    #[saga_step(1)]
    #[limit(concurrency = 1000, name = "bench")]
    async fn one(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(2)]
    #[limit(concurrency = 1000, name = "bench")]
    async fn two(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(3)]
    #[limit(concurrency = 1000, name = "bench")]
    async fn three(&self, n: u64) -> Result<u64, StepError> {
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(n)
    }
}

/// What one run measured, per step.
#[derive(Clone, Copy)]
struct Figures {
    steps_per_s: f64,
    round_trips: f64,
    redis_us: f64,
    engine_us: f64,
}

/// Starts `n` tasks of `NoOp` (or `Limited`), then runs `workers` workers
/// of read batch `batch` until all are done; `monitor`: counts the
/// commands clients send meanwhile (MONITOR slows the server: the round
/// trips of such a run are its figure, not its pace).
async fn run(
    redis: &redis_server::TestRedis,
    limited: bool,
    (workers, batch): (usize, usize),
    n: u64,
    monitor: bool,
) -> Figures {
    let done = Arc::new(AtomicU64::new(0));
    let build = |workers| {
        let (done, url) = (done.clone(), redis.url());
        async move {
            let config = RedisConfig {
                block: Duration::from_millis(100),
                durability: durability(),
                ..RedisConfig::default()
            };
            let backend = RedisBackend::connect_with(&url, config).await.unwrap();
            let b = Engine::builder().backend(backend).workers(workers);
            match limited {
                true => b.saga(Limited { done }),
                false => b.saga(NoOp { done }),
            }
            .worker_concurrency(batch)
            .build()
            .await
            .unwrap()
        }
    };
    let client = build(0).await;
    let saga = if limited { "limited" } else { "noop" };
    for n in 0..n {
        client.start_json(saga, n.into(), None).await.unwrap();
    }
    let stats = std::env::var_os("BENCH_COMMANDSTATS").is_some() && !monitor;
    if stats {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut redis.conn())
            .unwrap();
    }
    let monitor = monitor.then(|| redis.monitor());
    let (redis0, cpu0) = (redis_cpu(redis.port()), process_cpu());
    let started = Instant::now();
    let pool = build(workers).await;
    while done.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    let (redis1, cpu1) = (redis_cpu(redis.port()), process_cpu());
    // The last commit (and slot release) lands after the last step.
    tokio::time::sleep(Duration::from_millis(100)).await;
    pool.shutdown().await;
    let steps = (n * 3) as f64;
    if stats {
        println!("{saga}, {workers} worker(s) of read batch {batch}, per step:");
        commandstats(redis.port(), steps);
    }
    Figures {
        steps_per_s: steps / elapsed.as_secs_f64(),
        round_trips: monitor.map_or(0.0, |m| m.stop().len() as f64 / steps),
        redis_us: (redis1 - redis0).as_secs_f64() * 1e6 / steps,
        engine_us: (cpu1 - cpu0).as_secs_f64() * 1e6 / steps,
    }
}

/// `--limits`: `NoOp`, then `Limited`, for round trips per step (300
/// tasks, 1 worker, MONITOR from before the worker starts, as above), then
/// steps per second with 1 worker (each step waits for its acquire: the
/// latency a limit adds) and with 4 workers of read batch 16 (`tasks`).
pub(crate) async fn limits(redis: &redis_server::TestRedis, tasks: u64) {
    let round_trips = |limited| run(redis, limited, (1, 1), 300, true);
    let (plain, limited) = (round_trips(false).await, round_trips(true).await);
    println!(
        "round trips per step (300 tasks x 3 steps, 1 worker): unlimited {:.2}, concurrency = 1000 {:.2}; \
         limited - unlimited = {:+.2}",
        plain.round_trips,
        limited.round_trips,
        limited.round_trips - plain.round_trips
    );
    for (workers, batch, n) in [(1, 1, (tasks / 3).max(300)), (4, 16, tasks)] {
        let plain = run(redis, false, (workers, batch), n, false).await;
        let limited = run(redis, true, (workers, batch), n, false).await;
        println!(
            "steps/s ({n} tasks x 3 steps, {workers} worker(s) of read batch {batch}): unlimited {:.0}, \
             concurrency = 1000 {:.0}; limited / unlimited = {:.2}; Redis CPU {:.1} vs {:.1} us/step, \
             engine CPU {:.1} vs {:.1} us/step",
            plain.steps_per_s,
            limited.steps_per_s,
            limited.steps_per_s / plain.steps_per_s,
            plain.redis_us,
            limited.redis_us,
            plain.engine_us,
            limited.engine_us,
        );
    }
}
