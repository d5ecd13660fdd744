//! Benchmark: how one saga's work, and one process manager's, spreads over
//! the shards of a Redis Cluster. A private loopback cluster (three primaries, no replicas:
//! replicas would only add replication traffic to the two cores this runs
//! on), a 3-step saga with no-op steps, and per primary the share of the
//! commands it ran (`INFO commandstats`, commands run by scripts included)
//! and of its CPU time; next to it, the round trips per step (counted with
//! `MONITOR` on every primary, commands run by scripts excluded) and the
//! same saga on one server in the same run.
//!
//! ```text
//! cargo run --features redis --release --example bench_cluster [-- TASKS] [--primaries N]
//! ```
//!
//! Absolute throughput cannot grow with shards here: every primary shares
//! the same two cores. What the run shows is that no shard carries more
//! than its share, which is what lets throughput grow with shards on
//! machines of their own.

#[path = "../testsuite/tests/common/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

#[path = "../testsuite/tests/common/redis_cluster.rs"]
#[allow(dead_code)]
mod redis_cluster;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use sagas::NoOp;

#[derive(Message, serde::Serialize, serde::Deserialize)]
struct Tick {
    #[correlation_id]
    id: String,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Ticks {
    n: u64,
}

/// A process manager whose instances each take one message.
struct Counter {
    done: Arc<AtomicU64>,
}

#[process_manager(name = "counter", state = Ticks)]
impl Counter {
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

async fn engine(url: &str, done: &Arc<AtomicU64>, workers: usize, concurrency: usize) -> Engine {
    let config = RedisConfig {
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    };
    Engine::builder()
        .backend(RedisBackend::connect_with(url, config).await.unwrap())
        .saga(NoOp { done: done.clone() })
        .process_manager(Counter { done: done.clone() })
        .workers(workers)
        .worker_concurrency(concurrency)
        .build()
        .await
        .unwrap()
}

/// CPU time a server has used (user + system), from `INFO cpu`.
fn redis_cpu(port: u16) -> Duration {
    let text = cli(port, &["info", "cpu"]);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Duration::from_secs_f64(field("used_cpu_user:") + field("used_cpu_sys:"))
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("redis-cli must be on PATH");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Run {
    steps_per_s: f64,
    /// Per primary: (commands, CPU).
    per_primary: BTreeMap<u16, (u64, Duration)>,
    round_trips_per_step: Option<f64>,
}

/// Starts `tasks` tasks (or, `messages`, sends as many messages to as
/// many process-manager instances) with no worker running, then runs
/// `workers` x `concurrency` until all are done.
async fn run(
    url: &str,
    primaries: &[u16],
    tasks: u64,
    workers: usize,
    concurrency: usize,
    monitor: Option<&redis_cluster::TestCluster>,
    messages: bool,
) -> Run {
    let done = Arc::new(AtomicU64::new(0));
    let client = engine(url, &done, 0, 1).await;
    for n in 0..tasks {
        match messages {
            false => drop(client.start::<NoOp>(n).await.unwrap()),
            true => drop(
                client
                    .publish(Tick {
                        id: format!("i-{n}"),
                    })
                    .await
                    .unwrap(),
            ),
        }
    }
    for &port in primaries {
        cli(port, &["config", "resetstat"]);
    }
    let cpu0: Vec<Duration> = primaries.iter().map(|p| redis_cpu(*p)).collect();
    let monitors = monitor.map(|cluster| (cluster, cluster.monitor()));
    let started = Instant::now();
    let pool = engine(url, &done, workers, concurrency).await;
    while done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    pool.shutdown().await;
    let steps = match messages {
        true => tasks as f64,
        false => (tasks * 3) as f64,
    };
    let sent = monitors.map(|(cluster, m)| m.stop(cluster).len());
    let per_primary = primaries
        .iter()
        .zip(cpu0)
        .map(|(&port, cpu0)| {
            let calls = cli(port, &["info", "commandstats"])
                .lines()
                .filter_map(|l| l.split("calls=").nth(1))
                .filter_map(|rest| rest.split(',').next())
                .filter_map(|n| n.parse::<u64>().ok())
                .sum();
            (port, (calls, redis_cpu(port).saturating_sub(cpu0)))
        })
        .collect();
    Run {
        steps_per_s: steps / elapsed.as_secs_f64(),
        per_primary,
        round_trips_per_step: sent.map(|sent| sent as f64 / steps),
    }
}

fn print_spread(run: &Run) {
    let calls: u64 = run.per_primary.values().map(|(c, _)| c).sum();
    let cpu: Duration = run.per_primary.values().map(|(_, c)| *c).sum();
    for (port, (c, t)) in &run.per_primary {
        println!(
            "    primary :{port}  {:>5.1}% of commands  {:>5.1}% of Redis CPU",
            100.0 * *c as f64 / calls.max(1) as f64,
            100.0 * t.as_secs_f64() / cpu.as_secs_f64().max(1e-9),
        );
    }
    let most = run
        .per_primary
        .values()
        .map(|(c, _)| *c as f64 / calls.max(1) as f64)
        .fold(0.0, f64::max);
    println!("    busiest shard: {:.1}% of commands", most * 100.0);
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tasks: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(3000);
    let primaries: usize = args
        .iter()
        .position(|a| a == "--primaries")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let cluster = redis_cluster::TestCluster::start_with(primaries, 0);
    let ports = cluster.primaries();
    println!(
        "Redis Cluster of {} primaries (no replicas) on loopback; {tasks} tasks of 3 no-op steps, \
         24 partitions",
        ports.len()
    );
    let counted = run(
        &cluster.url(),
        &ports,
        tasks.min(1000),
        4,
        16,
        Some(&cluster),
        false,
    )
    .await;
    println!(
        "  round trips per step (MONITOR on every primary, 4 workers x 16): {:.2}",
        counted.round_trips_per_step.unwrap_or(0.0)
    );
    for (workers, concurrency) in [(1, 1), (4, 16)] {
        let run = run(
            &cluster.url(),
            &ports,
            tasks,
            workers,
            concurrency,
            None,
            false,
        )
        .await;
        println!(
            "  {workers} workers x {concurrency}: {:>8.0} steps/s",
            run.steps_per_s
        );
        print_spread(&run);
    }
    let pm = run(&cluster.url(), &ports, tasks, 4, 16, None, true).await;
    println!(
        "  process manager, {tasks} instances one message each, 4 workers x 16: {:>8.0} messages/s",
        pm.steps_per_s
    );
    print_spread(&pm);
    drop(cluster);
    let single = redis_server::TestRedis::start_with_aof(false);
    let run = run(&single.url(), &[single.port()], tasks, 4, 16, None, false).await;
    println!(
        "one server, same machine, 4 workers x 16: {:>8.0} steps/s",
        run.steps_per_s
    );
}
