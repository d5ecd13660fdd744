//! Benchmark: a 3-step saga with no-op steps on a private loopback
//! redis-server (no AOF), next to `redis-benchmark -t set -c 50` on the same
//! server in the same run, and optionally next to the peer (apalis-redis).
//!
//! ```text
//! cargo run --release --example bench_redis [-- TASKS] [--peer PATH]
//! cargo run --release --example bench_redis -- TASKS --only 4x16   # one run, for a profiler
//! cargo run --release --example bench_redis -- TASKS --only 4x16 --durability replicated
//! cargo run --release --example bench_redis -- TASKS --limits   # a limited step next to an unlimited one
//! ```
//!
//! `--durability primary|replicated|fsynced` sets `RedisConfig::durability`
//! for every engine of the run: `replicated` starts a local replica and
//! waits for it (`WAIT 1`), `fsynced` turns the primary's append-only file
//! on (`appendfsync always`) and waits for its disk (`WAITAOF 1 0`, Redis
//! 7.2 or later: an older server refuses the level at connect).
//!
//! Prints, in one run:
//! - Redis round trips per step in the steady state (counted with
//!   `MONITOR`, excluding commands that scripts run inside Redis);
//! - steps per second with 1, 2, 4 and 8 workers, with the Redis server's
//!   and this process's CPU microseconds per step;
//! - end-to-end latency (p50, p99) of a 3-step task, `start` to `wait`
//!   returning, one task at a time and with 32 callers at once;
//! - the in-memory engine next to a hand-written loop that does the same
//!   serde_json bookkeeping;
//! - the messages per second one process-manager instance sustains;
//! - with `--peer PATH` (the `peer-apalis` binary built from
//!   `../shared/peer-apalis`), the peer's chained jobs on the same server
//!   right after, stock and favourable settings at concurrency 4.

#[path = "../tests/common/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

/// `--limits`: a limited step next to an unlimited one.
#[path = "bench_redis/limits.rs"]
mod limits;

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use saga_runtime::backend::redis::{Durability, RedisBackend, RedisConfig};
use saga_runtime::backend::Partitions;
use saga_runtime::prelude::*;
use saga_runtime::{StepStatus, TaskInstance};

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
    engine_batched(url, done, workers, 1).await
}

async fn engine_batched(url: &str, done: &Arc<AtomicU64>, workers: usize, batch: usize) -> Engine {
    let config = RedisConfig {
        block: Duration::from_millis(100),
        durability: durability(),
        ..RedisConfig::default()
    };
    let backend = match RedisBackend::connect_with(url, config).await {
        Ok(backend) => backend,
        Err(error) => {
            eprintln!(
                "connecting at durability {:?} failed: {error}",
                durability()
            );
            std::process::exit(2);
        }
    };
    Engine::builder()
        .backend(backend)
        .saga(NoOp { done: done.clone() })
        .workers(workers)
        .worker_concurrency(batch)
        .build()
        .await
        .unwrap()
}

/// The level `--durability` chose (default: the primary's acknowledgement).
static DURABILITY: std::sync::OnceLock<Durability> = std::sync::OnceLock::new();

fn durability() -> Durability {
    DURABILITY.get().copied().unwrap_or_default()
}

/// CPU time this process has used (user + system), from `/proc/self/stat`
/// (clock ticks of 10 ms: read over runs of a second or more).
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line: 12 and 13 here.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// CPU time the Redis server has used (user + system), from `INFO cpu`.
fn redis_cpu(port: u16) -> Duration {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "cpu"])
        .output()
        .expect("redis-cli must be on PATH");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Duration::from_secs_f64(field("used_cpu_user:") + field("used_cpu_sys:"))
}

struct Throughput {
    steps_per_s: f64,
    redis_us_per_step: f64,
    engine_us_per_step: f64,
}

/// Starts `tasks` tasks with no worker running, then runs `workers` workers
/// until all are done.
async fn run(url: &str, port: u16, tasks: u64, workers: usize, batch: usize) -> Throughput {
    let done = Arc::new(AtomicU64::new(0));
    let client = engine(url, &done, 0).await;
    for n in 0..tasks {
        client.start::<NoOp>(n).await.unwrap();
    }
    let _ = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "config", "resetstat"])
        .output();
    let (redis0, cpu0) = (redis_cpu(port), process_cpu());
    let started = Instant::now();
    let pool = engine_batched(url, &done, workers, batch).await;
    while done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    let (redis1, cpu1) = (redis_cpu(port), process_cpu());
    pool.shutdown().await;
    let steps = (tasks * 3) as f64;
    if std::env::var_os("BENCH_COMMANDSTATS").is_some() {
        commandstats(port, steps);
    }
    Throughput {
        steps_per_s: steps / elapsed.as_secs_f64(),
        redis_us_per_step: (redis1 - redis0).as_secs_f64() * 1e6 / steps,
        engine_us_per_step: (cpu1 - cpu0).as_secs_f64() * 1e6 / steps,
    }
}

/// Prints where the server's time went, per step: each command's calls
/// and microseconds (commands run by scripts included).
fn commandstats(port: u16, steps: f64) {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "commandstats"])
        .output()
        .expect("redis-cli must be on PATH");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rows: Vec<(f64, String)> = Vec::new();
    for line in text.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |k: &str| {
            rest.split(',')
                .find_map(|f| f.strip_prefix(k))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let (calls, usec) = (field("calls="), field("usec="));
        rows.push((
            usec,
            format!(
                "  {name:<14} {:>6.2} calls/step {:>7.1} us/step",
                calls / steps,
                usec / steps
            ),
        ));
    }
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (_, row) in rows.iter().take(14) {
        println!("{row}");
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// `start` to `wait` returning, for `tasks` tasks, `callers` at a time.
async fn latency(url: &str, tasks: u64, callers: u64, workers: usize) -> (Duration, Duration) {
    let done = Arc::new(AtomicU64::new(0));
    let pool = engine(url, &done, workers).await;
    let client = engine(url, &done, 0).await;
    // Warm up connections and scripts.
    for n in 0..20 {
        let id = client.start::<NoOp>(n).await.unwrap();
        client.wait(id).await.unwrap();
    }
    let mut handles = Vec::new();
    for c in 0..callers {
        let client = client.clone();
        handles.push(tokio::spawn(async move {
            let mut times = Vec::new();
            for n in 0..tasks / callers {
                let t0 = Instant::now();
                let id = client.start::<NoOp>(c * 1_000_000 + n).await.unwrap();
                let task = client.wait(id).await.unwrap();
                assert_eq!(task.status, TaskStatus::Completed);
                times.push(t0.elapsed());
            }
            times
        }));
    }
    let mut times = Vec::new();
    for h in handles {
        times.extend(h.await.unwrap());
    }
    pool.shutdown().await;
    times.sort();
    (percentile(&times, 0.5), percentile(&times, 0.99))
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

/// One client's round trip on this server: `redis-benchmark -c 1 -t ping`
/// p50, in milliseconds (the unit the latency figures are read in).
fn ping_p50_ms(port: u16) -> f64 {
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-c",
            "1",
            "-n",
            "20000",
            "-t",
            "ping",
            "-q",
        ])
        .output()
        .expect("redis-benchmark must be on PATH (it comes with redis-server)");
    let text = String::from_utf8_lossy(&out.stdout);
    text.rsplit_once("p50=")
        .and_then(|(_, rest)| rest.split_whitespace().next())
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

/// The same instance counter, with `concurrency = pessimistic`.
struct HotLocked {
    done: Arc<AtomicU64>,
}

#[derive(serde::Serialize, serde::Deserialize, saga_runtime::Message)]
struct LockedTick {
    #[correlation_id]
    id: String,
}

#[process_manager(name = "hot-locked", state = Ticks, concurrency = pessimistic)]
impl HotLocked {
    #[starts]
    async fn tick(
        &self,
        _t: LockedTick,
        s: &mut Ticks,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.n += 1;
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Enqueues `messages` for one instance, then runs `workers` workers in
/// each of `engines` engines (as separate processes would: each its own
/// runtime, instance locks and partitions) until the instance has counted
/// them all. Returns messages per second.
async fn run_process(
    url: &str,
    messages: u64,
    (engines, workers): (usize, usize),
    id: &str,
    locked: bool,
) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let build = |workers| {
        let done = done.clone();
        async move {
            let config = RedisConfig {
                block: Duration::from_millis(100),
                durability: durability(),
                ..RedisConfig::default()
            };
            Engine::builder()
                .backend(RedisBackend::connect_with(url, config).await.unwrap())
                .process_manager(Hot { done: done.clone() })
                .process_manager(HotLocked { done })
                .workers(workers)
                .build()
                .await
                .unwrap()
        }
    };
    let client = build(0).await;
    // Queued as while workers run (on the instance's partition, not the
    // stream a deployment without partition readers writes to), by a
    // stand-in reader that lets go before the workers start.
    let stand_in = RedisBackend::connect(url).await.unwrap();
    stand_in
        .process_partitions("bench-publisher", Duration::from_secs(60))
        .await
        .unwrap();
    for _ in 0..messages {
        match locked {
            true => client.publish(LockedTick { id: id.to_owned() }).await,
            false => client.publish(Tick { id: id.to_owned() }).await,
        }
        .unwrap();
    }
    stand_in
        .leave_process_partitions("bench-publisher")
        .await
        .unwrap();
    let started = Instant::now();
    let mut pools = Vec::new();
    for _ in 0..engines {
        pools.push(build(workers).await);
    }
    loop {
        let n = match locked {
            true => client.process_state::<HotLocked>(id).await,
            false => client.process_state::<Hot>(id).await,
        }
        .unwrap()
        .map_or(0, |s| s.n);
        if n >= messages {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    for pool in pools {
        pool.shutdown().await;
    }
    messages as f64 / elapsed.as_secs_f64()
}

/// The in-memory engine with one worker: steps per second.
async fn run_memory(tasks: u64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let engine = Engine::builder()
        .saga(NoOp { done: done.clone() })
        .workers(0)
        .build()
        .await
        .unwrap();
    for n in 0..tasks {
        engine.start::<NoOp>(n).await.unwrap();
    }
    let started = Instant::now();
    let workers = engine.clone();
    tokio::spawn(async move { workers.run_workers(1).await });
    while done.load(Ordering::Relaxed) < tasks {
        tokio::task::yield_now().await;
    }
    let elapsed = started.elapsed();
    engine.shutdown().await;
    (tasks * 3) as f64 / elapsed.as_secs_f64()
}

/// The same bookkeeping written by hand: per step, the task record is
/// decoded from JSON, the step's input taken, its record updated (attempt,
/// status, output, audit) and the record encoded again.
fn run_handwritten(tasks: u64) -> f64 {
    let started = Instant::now();
    let mut finished = 0u64;
    for n in 0..tasks {
        let steps = ["one", "two", "three"].map(|s| (s.to_owned(), 1));
        let task = TaskInstance::new("noop", serde_json::json!(n), steps);
        let mut doc = serde_json::to_string(&task).unwrap();
        for i in 0..3 {
            let mut task: TaskInstance = serde_json::from_str(&doc).unwrap();
            let input = match i {
                0 => task.input.clone(),
                _ => task.steps[i - 1].output.clone().unwrap(),
            };
            let rec = &mut task.steps[i];
            rec.attempt_count += 1;
            rec.status = StepStatus::Running;
            doc = serde_json::to_string(&task).unwrap();
            let mut task: TaskInstance = serde_json::from_str(&doc).unwrap();
            let output: u64 = serde_json::from_value(input).unwrap();
            let rec = &mut task.steps[i];
            rec.status = StepStatus::Completed;
            rec.output = Some(serde_json::json!(output));
            if i == 2 {
                task.set_status(TaskStatus::Completed);
                finished += 1;
            }
            doc = serde_json::to_string(&task).unwrap();
        }
    }
    assert_eq!(finished, tasks);
    (tasks * 3) as f64 / started.elapsed().as_secs_f64()
}

/// Runs the peer's chained jobs on the same server, concurrency 4.
fn run_peer(peer: &str, port: u16, tasks: u64) {
    let url = format!("redis://127.0.0.1:{port}/");
    for (label, args) in [
        ("stock", &["--wake", "100"][..]),
        (
            "favourable",
            &["--wake", "tick:1", "--batch", "50", "--lean"][..],
        ),
    ] {
        let _ = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "flushall"])
            .output();
        let out = Command::new(peer)
            .args(["--jobs", &tasks.to_string(), "--concurrency", "4"])
            .args(["--redis", &url, "--timeout-s", "100"])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("could not run the peer {peer}: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        let result = text.lines().find(|l| l.starts_with("RESULT")).unwrap_or("");
        let field = |name: &str| {
            result
                .split_whitespace()
                .find_map(|f| f.strip_prefix(name))
                .unwrap_or("?")
                .to_owned()
        };
        println!(
            "peer apalis-redis {label:<10} c=4: {} steps/s, {} Redis calls per step, Redis CPU {} s, client CPU {} s",
            field("steps_per_s="),
            field("calls_per_step="),
            field("redis_cpu_s="),
            field("client_cpu_s="),
        );
    }
}

/// One instance receiving `messages` at once, with 1 and 4 workers, in
/// both concurrency modes; and the ratios the issue tracks.
async fn hot_instance(url: &str, messages: u64) {
    let mut rates = Vec::new();
    for locked in [false, true] {
        for (engines, workers) in [(1usize, 1usize), (1, 4), (2, 2)] {
            let mode = if locked { "pessimistic" } else { "optimistic" };
            let id = format!("hot-{mode}-{engines}x{workers}");
            let rate = run_process(url, messages, (engines, workers), &id, locked).await;
            println!(
                "process manager, one instance, {mode}, {engines} engine(s) x {workers} worker(s): {rate:.0} messages/s ({messages} messages)"
            );
            rates.push(rate);
        }
    }
    println!(
        "hot instance / 1 worker: optimistic 4 workers {:.2}, 2 engines x 2 {:.2}; pessimistic 4 workers {:.2}, 2 engines x 2 {:.2}",
        rates[1] / rates[0],
        rates[2] / rates[0],
        rates[4] / rates[3],
        rates[5] / rates[3],
    );
    // The two modes side by side, with the same workers.
    let ratio = |i: usize| rates[i].min(rates[i + 3]) / rates[i].max(rates[i + 3]);
    println!(
        "hot instance, slower concurrency mode / faster: 1 worker {:.2}, 4 workers {:.2}, 2 engines x 2 {:.2}",
        ratio(0),
        ratio(1),
        ratio(2),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let peer = args
        .iter()
        .position(|a| a == "--peer")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let tasks: u64 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(3000);
    let level = args
        .iter()
        .position(|a| a == "--durability")
        .map(|i| args.get(i + 1).map(String::as_str).unwrap_or(""));
    let timeout = Duration::from_secs(1);
    let level = match level {
        None | Some("primary") => Durability::Primary,
        Some("replicated") => Durability::Replicated {
            replicas: 1,
            timeout,
        },
        Some("fsynced") => Durability::Fsynced {
            replicas: 0,
            timeout,
        },
        Some(other) => panic!("--durability primary|replicated|fsynced, not `{other}`"),
    };
    let _ = DURABILITY.set(level);
    let redis =
        redis_server::TestRedis::start_with_aof(matches!(level, Durability::Fsynced { .. }));
    let url = redis.url();
    let port = redis.port();
    // `--durability replicated`: a local replica, in sync before the runs.
    let _replica = matches!(level, Durability::Replicated { .. }).then(|| {
        let replica = redis_server::TestRedis::start_with_aof(false);
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(port)
            .query(&mut replica.conn())
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut redis.conn())
                .unwrap();
            if info.contains("state=online") {
                break;
            }
            assert!(Instant::now() < deadline, "the replica did not sync");
            std::thread::sleep(Duration::from_millis(50));
        }
        replica
    });
    if level != Durability::Primary {
        println!("durability: {level:?}");
    }
    // `--only WxC`: one throughput run (W workers of concurrency C), for
    // a profiler.
    if let Some(only) = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
    {
        let (workers, batch) = only
            .split_once('x')
            .and_then(|(w, c)| Some((w.parse().ok()?, c.parse().ok()?)))
            .expect("--only WxC, for example --only 4x16");
        let t = run(&url, port, tasks, workers, batch).await;
        println!(
            "{workers} worker(s), read batch {batch}: {:.0} steps/s; Redis CPU {:.1} us/step, engine CPU {:.1} us/step",
            t.steps_per_s, t.redis_us_per_step, t.engine_us_per_step
        );
        return;
    }
    if args.iter().any(|a| a == "--limits") {
        limits::limits(&redis, tasks).await;
        return;
    }
    if args.iter().any(|a| a == "--process-only") {
        hot_instance(&url, (tasks / 2).max(200)).await;
        return;
    }

    // Round trips: every command the worker sends while it runs the
    // sample (MONITOR; those a script runs inside Redis are not counted).
    let done = Arc::new(AtomicU64::new(0));
    let client = engine(&url, &done, 0).await;
    let sample = 300u64;
    for n in 0..sample {
        client.start::<NoOp>(n).await.unwrap();
    }
    let monitor = redis.monitor();
    let mark = Instant::now();
    let pool = engine(&url, &done, 1).await;
    while done.load(Ordering::Relaxed) < sample {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let processing = mark.elapsed();
    // The last commit lands after the last step returned.
    tokio::time::sleep(Duration::from_millis(100)).await;
    pool.shutdown().await;
    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    for (cmd, _) in monitor.stop() {
        *counts.entry(cmd).or_default() += 1;
    }
    drop(client);
    let total: u64 = counts.values().sum::<u64>();
    println!("round trips (MONITOR, {sample} tasks x 3 steps, 1 worker, {processing:.2?} of processing):");
    for (cmd, n) in &counts {
        println!("  {cmd:<12} {n}");
    }
    println!(
        "  => {:.2} round trips per step (total {total}, the worker's start-up and idle polling included)",
        total as f64 / (sample * 3) as f64
    );

    let set = set_rps(port);
    println!("\nredis-benchmark -t set -c 50: {set:.0} requests/s");
    let mut by_workers = Vec::new();
    for batch in [1usize, 16] {
        for workers in [1usize, 2, 4, 8] {
            let t = run(&url, port, tasks, workers, batch).await;
            println!(
                "{workers} worker(s), read batch {batch:>2}: {:.0} steps/s ({tasks} tasks x 3 steps) = {:.4} x SET rps; \
                 Redis CPU {:.1} us/step, engine CPU {:.1} us/step",
                t.steps_per_s,
                t.steps_per_s / set,
                t.redis_us_per_step,
                t.engine_us_per_step,
            );
            by_workers.push((workers, batch, t.steps_per_s));
        }
    }
    let one = by_workers[0].2;
    let best = by_workers
        .iter()
        .max_by(|a, b| a.2.total_cmp(&b.2))
        .unwrap();
    println!(
        "scaling: best ({} workers, batch {}) / 1 worker = {:.2}",
        best.0,
        best.1,
        best.2 / one
    );

    let ping = ping_p50_ms(port);
    let (p50, p99) = latency(&url, 300, 1, 4).await;
    println!(
        "\nlatency of a 3-step task, start to wait, 1 at a time, 4 workers: p50 {p50:.2?}, p99 {p99:.2?} \
         (= {:.1} x one client's PING round trip, p50 {ping:.3} ms)",
        p50.as_secs_f64() * 1e3 / ping
    );
    let (p50, p99) = latency(&url, 1280, 32, 4).await;
    println!("latency of a 3-step task, start to wait, 32 callers at once, 4 workers: p50 {p50:.2?}, p99 {p99:.2?}");

    let memory = run_memory(tasks * 10).await;
    let hand = run_handwritten(tasks * 10);
    println!(
        "\nin-memory engine, 1 worker: {memory:.0} steps/s; hand-written loop with the same serde_json bookkeeping: {hand:.0} steps/s; ratio {:.2}",
        memory / hand
    );

    hot_instance(&url, (tasks / 2).max(200)).await;

    if let Some(peer) = peer {
        println!();
        run_peer(&peer, port, tasks);
    }
}
