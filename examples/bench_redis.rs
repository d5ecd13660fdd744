//! Benchmark: a 3-step saga with no-op steps on a private loopback
//! redis-server (no AOF), next to `redis-benchmark -t set -c 50` on the same
//! server in the same run.
//!
//! ```text
//! cargo run --release --example bench_redis [-- TASKS]
//! ```
//!
//! Prints Redis round trips per step in the steady state (counted with
//! `MONITOR`, excluding commands that scripts run inside Redis), completed
//! steps per second with 1, 2 and 4 workers, and the messages per second one
//! process-manager instance sustains with 1 and 4 workers (optimistic
//! concurrency), each also as a ratio of redis-benchmark's SET requests per
//! second.

#[path = "../tests/common/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;

struct NoOp {
    done: Arc<AtomicU64>,
}

#[saga(name = "noop")]
impl NoOp {
    #[saga_step(1)]
    async fn one(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(2)]
    async fn two(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(3)]
    async fn three(&self, n: u64) -> Result<u64, StepError> {
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(n)
    }
}

async fn engine(url: &str, done: &Arc<AtomicU64>, workers: usize) -> Engine {
    let config = RedisConfig {
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    };
    Engine::builder()
        .backend(RedisBackend::connect_with(url, config).await.unwrap())
        .saga(NoOp { done: done.clone() })
        .workers(workers)
        .build()
        .await
        .unwrap()
}

/// Starts `tasks` tasks with no worker running, then runs `workers` workers
/// until all are done. Returns steps per second.
async fn run(url: &str, tasks: u64, workers: usize) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let client = engine(url, &done, 0).await;
    for n in 0..tasks {
        client.start::<NoOp>(n).await.unwrap();
    }
    let started = Instant::now();
    let pool = engine(url, &done, workers).await;
    while done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    pool.shutdown();
    (tasks * 3) as f64 / elapsed.as_secs_f64()
}

fn set_rps(port: u16) -> f64 {
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-t",
            "set",
            "-c",
            "50",
            "-n",
            "200000",
            "-q",
        ])
        .output()
        .expect("redis-benchmark must be on PATH (it comes with redis-server)");
    let text = String::from_utf8_lossy(&out.stdout);
    // The last line reads "SET: 123456.79 requests per second, p50=...".
    let before = text
        .rsplit_once(" requests per second")
        .map(|(before, _)| before)
        .unwrap_or_else(|| panic!("could not parse redis-benchmark output: {text}"));
    before
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("could not parse redis-benchmark output: {text}"))
}

#[derive(Message, serde::Serialize, serde::Deserialize)]
struct Tick {
    #[correlation_id]
    id: String,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Ticks {
    n: u64,
}

struct Hot {
    done: Arc<AtomicU64>,
}

#[process_manager(name = "hot", state = Ticks)]
impl Hot {
    #[starts]
    async fn tick(
        &self,
        _t: Tick,
        s: &mut Ticks,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.n += 1;
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Enqueues `messages` for one instance, then runs `workers` workers until
/// the instance has counted them all. Returns messages per second.
async fn run_process(url: &str, messages: u64, workers: usize, id: &str) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let build = |workers| {
        let done = done.clone();
        async move {
            let config = RedisConfig {
                block: Duration::from_millis(100),
                ..RedisConfig::default()
            };
            Engine::builder()
                .backend(RedisBackend::connect_with(url, config).await.unwrap())
                .process_manager(Hot { done })
                .workers(workers)
                .build()
                .await
                .unwrap()
        }
    };
    let client = build(0).await;
    for _ in 0..messages {
        client.publish(Tick { id: id.to_owned() }).await.unwrap();
    }
    let started = Instant::now();
    let pool = build(workers).await;
    loop {
        let n = client
            .process_state::<Hot>(id)
            .await
            .unwrap()
            .map_or(0, |s| s.n);
        if n >= messages {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    pool.shutdown();
    messages as f64 / elapsed.as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let tasks: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let redis = redis_server::TestRedis::start_with_aof(false);
    let url = redis.url();

    // Round trips: MONITOR prints every command; those a script runs are
    // marked "lua" and are not round trips.
    let mut monitor = Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "monitor"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli must be on PATH");
    let stdout = monitor.stdout.take().unwrap();
    let counter = std::thread::spawn(move || {
        let mut top = std::collections::BTreeMap::<String, u64>::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains(" lua]") || !line.contains('"') {
                continue;
            }
            let cmd = line.split('"').nth(1).unwrap_or("").to_uppercase();
            *top.entry(cmd).or_default() += 1;
        }
        top
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let done = Arc::new(AtomicU64::new(0));
    let client = engine(&url, &done, 0).await;
    let sample = 300u64;
    for n in 0..sample {
        client.start::<NoOp>(n).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mark = Instant::now();
    let pool = engine(&url, &done, 1).await;
    while done.load(Ordering::Relaxed) < sample {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let processing = mark.elapsed();
    pool.shutdown();
    drop(client);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = monitor.kill();
    let _ = monitor.wait();
    let counts = counter.join().unwrap();
    // Task creation (one EVALSHA per task) happened before the workers ran.
    let creation = sample;
    let total: u64 = counts.values().sum::<u64>() - creation;
    println!("round trips (MONITOR, {sample} tasks x 3 steps, 1 worker, {processing:.2?} of processing):");
    for (cmd, n) in &counts {
        println!("  {cmd:<12} {n}");
    }
    println!(
        "  => {:.2} round trips per step (total {total} after subtracting {creation} task-creation scripts; includes idle polling)",
        total as f64 / (sample * 3) as f64
    );

    let set = set_rps(redis.port());
    println!("\nredis-benchmark -t set -c 50: {set:.0} requests/s");
    for workers in [1usize, 2, 4] {
        let steps = run(&url, tasks, workers).await;
        println!(
            "{workers} worker(s): {steps:.0} steps/s ({tasks} tasks x 3 steps) = {:.4} x redis-benchmark SET rps",
            steps / set
        );
    }
    let messages = (tasks / 2).max(200);
    for workers in [1usize, 4] {
        let rate = run_process(&url, messages, workers, &format!("hot-{workers}")).await;
        println!(
            "process manager, one instance, {workers} worker(s): {rate:.0} messages/s ({messages} messages) = {:.4} x redis-benchmark SET rps",
            rate / set
        );
    }
}
