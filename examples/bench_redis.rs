//! Benchmark: a 3-step saga with no-op steps on a private loopback
//! redis-server (no AOF), next to `redis-benchmark -t set -c 50` on the same
//! server in the same run, and optionally next to the peer (apalis-redis).
//!
//! ```text
//! cargo run --features redis --release --example bench_redis [-- TASKS] [--runs N] [--peer PATH]
//! cargo run --features redis --release --example bench_redis -- TASKS --only 4x16 [--runs 1]   # one configuration
//! cargo run --features redis --release --example bench_redis -- TASKS --only 4x16 --durability replicated
//! cargo run --features redis --release --example bench_redis -- TASKS --limits   # a limited step next to an unlimited one
//! cargo run --features redis --release --example bench_redis -- --instructions [TASKS]   # callgrind, twice
//! ```
//!
//! TASKS defaults to 30,000 (3 steps each): on a shared 2-core machine a
//! smaller run measures start-up and noise more than the steady state.
//! The headline (4 workers of read batch 16, or `--only WxC`) runs `--runs`
//! times (default 3), each run printed and then the median of each figure.
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
//! - steps per second, with the Redis server's and this process's CPU
//!   microseconds per step: 4 workers x read batch 16 three times (median),
//!   then 1x1, 4x1, 1x16, 2x16 and 8x16 once each on a third of the tasks;
//! - end-to-end latency (p50, p99) of a 3-step task, `start` to `wait`
//!   returning, one task at a time and with 32 callers at once;
//! - the in-memory engine next to a hand-written loop that does the same
//!   serde_json bookkeeping;
//! - the messages per second one process-manager instance sustains;
//! - engine instructions per step (callgrind, when `valgrind` is on PATH);
//! - with `--peer PATH` (the `peer-apalis` binary built from
//!   `../shared/peer-apalis`), the peer's chained jobs on the same server
//!   right after, favourable settings at concurrency 4 and 16, three runs
//!   each; then a summary of both medians and their ratio.

#[path = "../testsuite/tests/common/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

/// `--limits`: a limited step next to an unlimited one.
#[path = "bench_redis/limits.rs"]
mod limits;

/// The process-manager section (and `--process-only`).
#[path = "bench_redis/process.rs"]
mod process;

/// `--peer PATH`: apalis-redis on the same server.
#[path = "bench_redis/peer.rs"]
mod peer;

/// Engine instructions per step, under callgrind.
#[path = "bench_redis/instructions.rs"]
mod instructions;

/// Tasks per throughput run unless the command line gives a number.
const DEFAULT_TASKS: u64 = 30_000;

/// Runs of the headline configuration (and of `--only`), for a median.
const RUNS: usize = 3;

/// The configuration the headline figure is measured with: workers, read
/// batch (`worker_concurrency`).
const HEADLINE: (usize, usize) = (4, 16);

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use saga_runtime::backend::redis::{Durability, RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use saga_runtime::{StepStatus, TaskInstance};
use sagas::NoOp;

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

/// One throughput run's figures (or the medians of several).
#[derive(Clone, Copy)]
struct Throughput {
    steps_per_s: f64,
    redis_us_per_step: f64,
    engine_us_per_step: f64,
}

/// Starts `tasks` tasks with no worker running, then runs `workers` workers
/// until all are done. The database is flushed first, so that runs do not
/// pile up finished tasks in the server's memory.
async fn run(url: &str, port: u16, tasks: u64, workers: usize, batch: usize) -> Throughput {
    let _ = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "flushall"])
        .output();
    let done = Arc::new(AtomicU64::new(0));
    let client = engine(url, &done, 0).await;
    start_all(&client, tasks).await;
    let _ = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "config", "resetstat"])
        .output();
    let (redis0, cpu0) = (redis_cpu(port), process_cpu());
    instructions::bench_steady_start(tasks);
    let started = Instant::now();
    let pool = engine_batched(url, &done, workers, batch).await;
    while done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    instructions::bench_steady_end(tasks * 3);
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

/// Starts tasks `0..tasks` from 16 callers at once: outside the timed
/// window, but one at a time 30,000 starts take longer than the run.
async fn start_all(client: &Engine, tasks: u64) {
    const CALLERS: u64 = 16;
    let mut handles = Vec::new();
    for first in 0..CALLERS {
        let client = client.clone();
        handles.push(tokio::spawn(async move {
            for n in (first..tasks).step_by(CALLERS as usize) {
                client.start::<NoOp>(n).await.unwrap();
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
}

/// `runs` runs of one configuration, each printed, then the medians.
async fn repeated(
    url: &str,
    port: u16,
    tasks: u64,
    (workers, batch): (usize, usize),
    runs: usize,
) -> Throughput {
    let mut all = Vec::new();
    let label = format!("{workers} worker(s) x read batch {batch:>2}");
    for i in 1..=runs {
        let t = run(url, port, tasks, workers, batch).await;
        println!(
            "{label}, run {i}/{runs} ({tasks} tasks x 3 steps): {:.0} steps/s; Redis CPU {:.1} us/step, engine CPU {:.1} us/step",
            t.steps_per_s, t.redis_us_per_step, t.engine_us_per_step
        );
        all.push(t);
    }
    let m = median_of(&all);
    println!(
        "{label}, median of {runs}: {:.0} steps/s; Redis CPU {:.1} us/step, engine CPU {:.1} us/step",
        m.steps_per_s, m.redis_us_per_step, m.engine_us_per_step
    );
    m
}

/// The median of each figure over `runs` (figure by figure: the median
/// steps/s and the median Redis CPU may come from different runs).
fn median_of(runs: &[Throughput]) -> Throughput {
    let median = |figure: fn(&Throughput) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(figure).collect();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    };
    Throughput {
        steps_per_s: median(|t| t.steps_per_s),
        redis_us_per_step: median(|t| t.redis_us_per_step),
        engine_us_per_step: median(|t| t.engine_us_per_step),
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

/// The command line (see the module docs).
struct Options {
    /// The first positional number, if any.
    tasks_arg: Option<u64>,
    tasks: u64,
    runs: usize,
    peer: Option<String>,
    level: Durability,
    /// `--durability LEVEL` as given, passed on to the callgrind run.
    level_args: Vec<String>,
    only: Option<(usize, usize)>,
    limits: bool,
    process_only: bool,
    instructions: bool,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .map(|i| args.get(i + 1).cloned().unwrap_or_default())
    };
    let has = |flag: &str| args.iter().any(|a| a == flag);
    // The first number that is not the value of `--runs`.
    let tasks_arg = args
        .iter()
        .enumerate()
        .filter(|(i, _)| *i == 0 || args[i - 1] != "--runs")
        .find_map(|(_, a)| a.parse().ok());
    let timeout = Duration::from_secs(1);
    let level_arg = value("--durability");
    let level = match level_arg.as_deref() {
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
    let only = value("--only").map(|only| {
        only.split_once('x')
            .and_then(|(w, c)| Some((w.parse().ok()?, c.parse().ok()?)))
            .expect("--only WxC, for example --only 4x16")
    });
    Options {
        tasks_arg,
        tasks: tasks_arg.unwrap_or(DEFAULT_TASKS),
        runs: value("--runs").map_or(RUNS, |r| r.parse().expect("--runs N")),
        peer: value("--peer"),
        level,
        level_args: level_arg.map_or(Vec::new(), |l| vec!["--durability".into(), l]),
        only,
        limits: has("--limits"),
        process_only: has("--process-only"),
        instructions: has("--instructions"),
    }
}

/// The private server, and with `--durability replicated` a local replica
/// in sync before the runs.
fn servers(level: Durability) -> (redis_server::TestRedis, Option<redis_server::TestRedis>) {
    let redis =
        redis_server::TestRedis::start_with_aof(matches!(level, Durability::Fsynced { .. }));
    let port = redis.port();
    let replica = matches!(level, Durability::Replicated { .. }).then(|| {
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
    (redis, replica)
}

/// Round trips: every command the worker sends while it runs a sample
/// (MONITOR; those a script runs inside Redis are not counted).
async fn round_trips(redis: &redis_server::TestRedis) {
    let url = redis.url();
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
    let total: u64 = counts.values().sum::<u64>();
    println!("round trips (MONITOR, {sample} tasks x 3 steps, 1 worker, {processing:.2?} of processing):");
    for (cmd, n) in &counts {
        println!("  {cmd:<12} {n}");
    }
    println!(
        "  => {:.2} round trips per step (total {total}, the worker's start-up and idle polling included)",
        total as f64 / (sample * 3) as f64
    );
}

/// Steps per second: the headline configuration (4 workers of read batch
/// 16) `runs` times at `tasks`, then the others once each at a third of
/// that (enough for a rate; they show scaling, not the headline). Returns
/// the headline's medians.
async fn throughput(url: &str, port: u16, tasks: u64, runs: usize, set: f64) -> Throughput {
    let best = repeated(url, port, tasks, HEADLINE, runs).await;
    println!("  = {:.4} x SET rps", best.steps_per_s / set);
    let side = (tasks / 3).max(300);
    let mut one = best.steps_per_s;
    for (workers, batch) in [(1usize, 1usize), (4, 1), (1, 16), (2, 16), (8, 16)] {
        let t = run(url, port, side, workers, batch).await;
        println!(
            "{workers} worker(s) x read batch {batch:>2}, one run of {side} tasks: {:.0} steps/s = {:.4} x SET rps; \
             Redis CPU {:.1} us/step, engine CPU {:.1} us/step",
            t.steps_per_s,
            t.steps_per_s / set,
            t.redis_us_per_step,
            t.engine_us_per_step,
        );
        if (workers, batch) == (1, 1) {
            one = t.steps_per_s;
        }
    }
    println!(
        "scaling: {} workers x read batch {} (median) / 1 worker x read batch 1 = {:.2}",
        HEADLINE.0,
        HEADLINE.1,
        best.steps_per_s / one
    );
    best
}

/// `--instructions`: the callgrind figure, twice (it should repeat within
/// about 1%).
fn instructions_twice(opts: &Options) {
    let tasks = opts.tasks_arg.unwrap_or(instructions::TASKS);
    let mut counts = Vec::new();
    for _ in 0..2 {
        match instructions::per_step(tasks, &opts.level_args) {
            Ok(n) => {
                println!(
                    "engine instructions per step: {n:.0} (callgrind, {tasks} tasks, --only 4x16)"
                );
                counts.push(n);
            }
            Err(e) => println!("engine instructions per step: not measured: {e}"),
        }
    }
    if let [a, b] = counts[..] {
        println!(
            "repeatability: the two runs differ by {:.2}%",
            (a - b).abs() * 100.0 / a.min(b)
        );
    }
}

/// One callgrind run in the default run, when valgrind is on PATH.
fn instructions_once(opts: &Options) -> Option<f64> {
    if !instructions::valgrind_on_path() {
        println!("engine instructions per step: not measured (valgrind is not on PATH)");
        return None;
    }
    let tasks = instructions::TASKS;
    match instructions::per_step(tasks, &opts.level_args) {
        Ok(n) => {
            println!("engine instructions per step: {n:.0} (callgrind, {tasks} tasks, --only 4x16, steady state only)");
            Some(n)
        }
        Err(e) => {
            println!("engine instructions per step: not measured: {e}");
            None
        }
    }
}

/// Where a peer binary may have been built; used only to say how to
/// include it, never run without `--peer`.
fn peer_hint() {
    let found = std::env::var_os("PEER_APALIS")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain([std::path::PathBuf::from(
            "/work/target-peer/release/peer-apalis",
        )])
        .find(|p| p.exists());
    if let Some(path) = found {
        println!(
            "\npeer not run: add `--peer {}` to run apalis-redis on the same server",
            path.display()
        );
    }
}

/// The headline next to the peer's best median.
fn summary(
    tasks: u64,
    runs: usize,
    ours: &Throughput,
    peer: Option<&(usize, Throughput)>,
    instr: Option<f64>,
) {
    println!("\nsummary ({tasks} tasks x 3 steps per run, medians of {runs} runs):");
    println!(
        "  {:<34} {:>9} {:>17} {:>27}",
        "", "steps/s", "Redis CPU us/step", "engine/client CPU us/step"
    );
    let row = |label: &str, t: &Throughput| {
        println!(
            "  {label:<34} {:>9.0} {:>17.1} {:>27.1}",
            t.steps_per_s, t.redis_us_per_step, t.engine_us_per_step
        )
    };
    row(
        &format!("ours, {} workers x read batch {}", HEADLINE.0, HEADLINE.1),
        ours,
    );
    if let Some((c, p)) = peer {
        row(&format!("apalis-redis favourable, c={c}"), p);
        println!(
            "  {:<34} {:>9.2} {:>17.2} {:>27.2}",
            "ours / apalis",
            ours.steps_per_s / p.steps_per_s,
            ours.redis_us_per_step / p.redis_us_per_step,
            ours.engine_us_per_step / p.engine_us_per_step,
        );
    }
    if let Some(n) = instr {
        println!("  engine instructions per step: {n:.0}");
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let opts = options();
    let _ = DURABILITY.set(opts.level);
    if opts.instructions {
        instructions_twice(&opts);
        return;
    }
    let (redis, _replica) = servers(opts.level);
    let (url, port, tasks) = (redis.url(), redis.port(), opts.tasks);
    if opts.level != Durability::Primary {
        println!("durability: {:?}", opts.level);
    }
    if let Some(only) = opts.only {
        repeated(&url, port, tasks, only, opts.runs).await;
        return;
    }
    if opts.limits {
        limits::limits(&redis, tasks).await;
        return;
    }
    // The secondary sections keep the sizes of the old default (3,000).
    let secondary = tasks.min(3000);
    if opts.process_only {
        process::hot_instance(&url, (secondary / 2).max(200)).await;
        return;
    }

    round_trips(&redis).await;
    let set = set_rps(port);
    println!("\nredis-benchmark -t set -c 50: {set:.0} requests/s");
    let ours = throughput(&url, port, tasks, opts.runs, set).await;

    let ping = ping_p50_ms(port);
    let (p50, p99) = latency(&url, 300, 1, 4).await;
    println!(
        "\nlatency of a 3-step task, start to wait, 1 at a time, 4 workers: p50 {p50:.2?}, p99 {p99:.2?} \
         (= {:.1} x one client's PING round trip, p50 {ping:.3} ms)",
        p50.as_secs_f64() * 1e3 / ping
    );
    let (p50, p99) = latency(&url, 1280, 32, 4).await;
    println!("latency of a 3-step task, start to wait, 32 callers at once, 4 workers: p50 {p50:.2?}, p99 {p99:.2?}");

    let memory = run_memory(secondary * 10).await;
    let hand = run_handwritten(secondary * 10);
    println!(
        "\nin-memory engine, 1 worker: {memory:.0} steps/s; hand-written loop with the same serde_json bookkeeping: {hand:.0} steps/s; ratio {:.2}",
        memory / hand
    );

    process::hot_instance(&url, (secondary / 2).max(200)).await;

    println!();
    let instr = instructions_once(&opts);

    let peer = match &opts.peer {
        Some(peer) => {
            println!();
            peer::run_peer(peer, port, tasks, opts.runs)
        }
        None => {
            peer_hint();
            None
        }
    };
    summary(tasks, opts.runs, &ours, peer.as_ref(), instr);
}
