//! Benchmark: a 3-step saga with no-op steps on a private PostgreSQL server
//! with durable commits (`fsync` and `synchronous_commit` on), next to
//! `pgbench -N` on the same server in the same run, and optionally next to
//! the peers (apalis-postgres and underway, `../shared/peer-pg`).
//!
//! ```text
//! cargo run --features postgres --release --example bench_postgres [-- TASKS] [--peer PATH]
//! cargo run --features postgres --release --example bench_postgres -- --statements [TASKS]
//! ```
//!
//! `--pool N` gives each engine a pool of N connections (default: the
//! library's, `PostgresConfig::max_connections`).
//!
//! Prints, in one run:
//! - `pgbench -N` transactions per second with 1 and 16 clients;
//! - steps per second with 1, 4 and 8 workers (one message at a time each)
//!   and 4 workers taking up to 16 messages at once, with the server's
//!   committed transactions and the statements sent per step (counted by
//!   `pg_stat_database` and `pg_stat_statements`);
//! - end-to-end latency (p50, p99) of a 3-step task, `start` to `wait`
//!   returning, one task at a time;
//! - the statements per second an idle engine sends;
//! - with `--peer PATH` (the `peer-pg` binary: build it with
//!   `cd ../shared/peer-pg && SQLX_OFFLINE=true cargo build --release`),
//!   the peers' chained jobs on the same server right after, and the ratio
//!   of our best figure to the best peer's.
//!
//! `--statements` is for finding where the server's time goes: it runs
//! only 4 workers x 16, and prints the statements the server spent most
//! time in, those inside the protocol's functions included
//! (`pg_stat_statements.track = all`).

#[path = "../testsuite/tests/common/postgres_server.rs"]
#[allow(dead_code)]
mod postgres_server;

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use postgres_server::TestPostgres;
use saga_runtime::backend::postgres::sqlx::{self, PgPool};
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::prelude::*;
use sagas::NoOp;

/// The engines' pool size (`--pool N`); the library's default otherwise.
static POOL: OnceLock<u32> = OnceLock::new();

async fn engine(
    url: &str,
    schema: &str,
    done: &Arc<AtomicU64>,
    workers: usize,
    batch: usize,
) -> Engine {
    let config = PostgresConfig {
        schema: schema.to_owned(),
        max_connections: POOL
            .get()
            .copied()
            .unwrap_or(PostgresConfig::default().max_connections),
        ..PostgresConfig::default()
    };
    Engine::builder()
        .backend(
            PostgresBackend::connect_url(url, config)
                .await
                .expect("connect"),
        )
        .saga(NoOp { done: done.clone() })
        .workers(workers)
        .worker_concurrency(batch)
        .build()
        .await
        .expect("engine")
}

/// The server's committed transactions in database `bench` and the
/// statements sent so far, read on a connection of its own once the
/// counters are flushed (a backend reports them at most once a second).
async fn counters(admin: &PgPool) -> (i64, i64) {
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let xact: i64 =
        sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = 'bench'")
            .fetch_one(admin)
            .await
            .unwrap_or(0);
    let statements: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements s \
         JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = 'bench'",
    )
    .fetch_one(admin)
    .await
    .unwrap_or(0);
    (xact, statements)
}

struct Throughput {
    steps_per_s: f64,
    xact_per_step: f64,
    statements_per_step: f64,
}

/// Starts `tasks` tasks with no worker running, then runs `workers`
/// workers (each taking up to `batch` messages at once) until all are done.
async fn run(
    server: &TestPostgres,
    admin: &PgPool,
    tasks: u64,
    workers: usize,
    batch: usize,
) -> Throughput {
    let url = bench_url(server);
    let schema = format!("run_{workers}x{batch}");
    let done = Arc::new(AtomicU64::new(0));
    let starter = engine(&url, &schema, &done, 0, 1).await;
    for n in 0..tasks {
        starter.start::<NoOp>(n).await.expect("start");
    }
    starter.shutdown().await;
    drop(starter);
    let before = counters(admin).await;
    let started = Instant::now();
    let pool = engine(&url, &schema, &done, workers, batch).await;
    while done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    pool.shutdown().await;
    drop(pool);
    let after = counters(admin).await;
    let steps = (tasks * 3) as f64;
    Throughput {
        steps_per_s: steps / elapsed.as_secs_f64(),
        // The counter read's own transaction is in `after`.
        xact_per_step: (after.0 - before.0 - 1) as f64 / steps,
        statements_per_step: (after.1 - before.1) as f64 / steps,
    }
}

/// `start` to `wait` of `n` tasks one at a time: (p50, p99).
async fn latency(server: &TestPostgres, n: usize) -> (Duration, Duration) {
    let done = Arc::new(AtomicU64::new(0));
    let engine = engine(&bench_url(server), "latency", &done, 2, 1).await;
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let id = engine.start::<NoOp>(i as u64).await.expect("start");
        engine.wait(id).await.expect("wait");
        took.push(t.elapsed());
    }
    engine.shutdown().await;
    took.sort();
    (took[n / 2], took[(n * 99 / 100).min(n - 1)])
}

/// Statements per second an idle engine (4 workers, the background duties)
/// sends, over `secs` seconds.
async fn idle_rate(server: &TestPostgres, admin: &PgPool, secs: u64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let engine = engine(&bench_url(server), "idle", &done, 4, 1).await;
    // Past the start-up (migrations, first reads).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = counters(admin).await;
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let after = counters(admin).await;
    engine.shutdown().await;
    // Each counter read waits 1.1 s for the flush: the window is longer.
    (after.1 - before.1) as f64 / (secs as f64 + 1.1)
}

fn bench_url(server: &TestPostgres) -> String {
    format!("postgres://postgres@127.0.0.1:{}/bench", server.port())
}

/// `pgbench -N` TPS with `clients` clients for 5 s.
fn pgbench(server: &TestPostgres, clients: u32) -> f64 {
    let url = format!("postgres://postgres@127.0.0.1:{}/pgb", server.port());
    let out = Command::new("pgbench")
        .args(["-N", "-T", "5", "-j", "2", "-c", &clients.to_string(), &url])
        .output()
        .expect("pgbench must be on PATH");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("tps"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The peer's `RESULT` lines for one setting.
fn peer(path: &str, server: &TestPostgres, tasks: u64, args: &[&str]) -> Vec<(String, f64)> {
    let url = format!("postgres://postgres@127.0.0.1:{}/peer", server.port());
    let mut results = Vec::new();
    for concurrency in ["4", "16"] {
        let out = Command::new(path)
            .args(["--jobs", &tasks.to_string(), "--concurrency", concurrency])
            // The slowest peer (underway) makes about 300 steps a second.
            .args([
                "--url",
                &url,
                "--timeout-s",
                &(120 + tasks / 30).to_string(),
            ])
            .args(args)
            .output()
            .expect("run the peer");
        for r in sagas::peer::results(&out.stdout) {
            println!("  peer {} : {}", args.join(" "), r.fields);
            if !r.finished {
                println!("  (did not finish in time: no figure)");
            }
            results.push((format!("{} c={concurrency}", args.join(" ")), r.steps_per_s));
        }
    }
    results
}

/// Runs 4 workers x 16 and prints where the server spent its time.
async fn statements_profile(server: &TestPostgres, admin: &PgPool, tasks: u64) {
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(admin)
        .await
        .expect("reset");
    let t = run(server, admin, tasks, 4, 16).await;
    println!("4 workers x 16: {:.0} steps/s", t.steps_per_s);
    let steps = (tasks * 3) as f64;
    let rows: Vec<(String, i64, f64)> = sqlx::query_as(
        "SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls, total_exec_time \
         FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 25",
    )
    .fetch_all(admin)
    .await
    .expect("pg_stat_statements");
    let tables: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
         WHERE schemaname = 'run_4x16' AND n_tup_upd > 0 ORDER BY relname",
    )
    .fetch_all(admin)
    .await
    .expect("pg_stat_user_tables");
    for (table, updates, hot) in tables {
        println!(
            "  {table}: {:.2} updates/step, {:.0}% HOT (no index written)",
            updates as f64 / steps,
            hot as f64 * 100.0 / updates.max(1) as f64
        );
    }
    println!("  us/step   calls/step  statement (nested ones included)");
    for (query, calls, ms) in rows {
        let text: String = query.chars().take(110).collect();
        println!(
            "  {:>7.1}   {:>10.2}  {text}",
            ms * 1000.0 / steps,
            calls as f64 / steps
        );
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mut tasks = 3000u64;
    let mut peer_path = None;
    let mut profile = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--peer" => peer_path = args.next(),
            "--statements" => profile = true,
            "--pool" => {
                let n = args.next().and_then(|n| n.parse().ok());
                let _ = POOL.set(n.expect("--pool takes a number of connections"));
            }
            n => tasks = n.parse().expect("TASKS is a number"),
        }
    }
    let server = TestPostgres::start_with(&[
        ("fsync", "on"),
        ("synchronous_commit", "on"),
        ("full_page_writes", "on"),
        ("shared_preload_libraries", "pg_stat_statements"),
        ("autovacuum", "off"),
        (
            "pg_stat_statements.track",
            if profile { "all" } else { "top" },
        ),
    ]);
    server.psql("CREATE DATABASE bench");
    server.psql("CREATE DATABASE pgb");
    server.psql("CREATE DATABASE peer");
    let admin = PgPool::connect(&format!(
        "postgres://postgres@127.0.0.1:{}/bench",
        server.port()
    ))
    .await
    .expect("connect");
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&admin)
        .await
        .expect("pg_stat_statements");
    let status = Command::new("pgbench")
        .args(["-i", "-s", "1", "-q"])
        .arg(format!(
            "postgres://postgres@127.0.0.1:{}/pgb",
            server.port()
        ))
        .output()
        .expect("pgbench -i");
    assert!(status.status.success(), "pgbench -i failed");

    println!(
        "PostgreSQL on 127.0.0.1:{} (fsync on, synchronous_commit on)",
        server.port()
    );
    if profile {
        return statements_profile(&server, &admin, tasks).await;
    }
    let pgb1 = pgbench(&server, 1);
    let pgb16 = pgbench(&server, 16);
    println!("pgbench -N: {pgb1:.0} TPS with 1 client, {pgb16:.0} with 16");
    println!("{tasks} tasks of 3 no-op steps:");
    let mut best = 0.0f64;
    for (workers, batch) in [(1, 1), (4, 1), (8, 1), (4, 16), (8, 8)] {
        let t = run(&server, &admin, tasks, workers, batch).await;
        best = best.max(t.steps_per_s);
        println!(
            "  {workers} workers x {batch:>2}: {:>7.0} steps/s  ({:.2}x pgbench -c16)  {:.2} transactions/step  {:.2} statements/step",
            t.steps_per_s,
            t.steps_per_s / pgb16,
            t.xact_per_step,
            t.statements_per_step,
        );
    }
    let (p50, p99) = latency(&server, 200).await;
    println!("one task at a time, start to wait: p50 {p50:.1?}, p99 {p99:.1?}");
    let idle = idle_rate(&server, &admin, 10).await;
    println!("an idle engine (4 workers): {idle:.1} statements/s");
    if let Some(path) = peer_path {
        let mut results = peer(
            &path,
            &server,
            tasks,
            &[
                "--lib", "apalis", "--wake", "tick:1", "--batch", "50", "--lean",
            ],
        );
        results.extend(peer(
            &path,
            &server,
            tasks,
            &["--lib", "apalis", "--wake", "100"],
        ));
        results.extend(peer(&path, &server, tasks, &["--lib", "underway"]));
        if let Some((label, peer_best)) = results.into_iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
            println!(
                "best peer ({label}): {peer_best:.0} steps/s; ours {best:.0}: {:.2}x",
                best / peer_best
            );
        }
    }
}
