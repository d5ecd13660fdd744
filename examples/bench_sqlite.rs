//! Benchmark: a 3-step saga with no-op steps on a SQLite file with durable
//! commits (WAL, `synchronous = FULL`), next to the disk's raw durable
//! commit rate measured on the same disk in the same run (one row inserted
//! per transaction, with the same sqlx and SQLite), and, with `--peer`,
//! apalis-sqlite chaining the same three steps right after.
//!
//! ```text
//! cargo run --release --example bench_sqlite [-- TASKS] [--peer PATH]
//! ```
//!
//! Prints, in one run, steps per second with 1, 4, 8 and 16 workers (the
//! median of three runs each), the
//! writes per step and the commits per step (each commit one WAL sync to
//! the disk, shared by the writes of every worker that wrote meanwhile),
//! and the ratio of steps per second to the raw one-commit-per-step
//! baseline. With `--peer PATH` (the `peer-sqlite` binary: build it with
//! `cd ../shared/peer-sqlite && SQLX_OFFLINE=true cargo build --release`),
//! the peer at its README setting and its favourable one, at 1, 4 and 16
//! workers, on the same disk, and the ratio of our best figure to its
//! best.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use saga_runtime::backend::sqlite::{SqliteBackend, SqliteConfig};
use saga_runtime::prelude::*;
use sagas::NoOp;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::ConnectOptions;

/// Durable commits per second on the disk that holds `dir`: one row per
/// transaction, `n` of them.
async fn baseline(dir: &std::path::Path, n: u64) -> Result<f64, Box<dyn std::error::Error>> {
    let mut conn = SqliteConnectOptions::new()
        .filename(dir.join("baseline.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .connect()
        .await?;
    sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
        .execute(&mut conn)
        .await?;
    let started = Instant::now();
    for i in 0..n {
        sqlx::query("BEGIN IMMEDIATE").execute(&mut conn).await?;
        sqlx::query("INSERT INTO t (id, v) VALUES (?, zeroblob(200))")
            .bind(i64::try_from(i)?)
            .execute(&mut conn)
            .await?;
        sqlx::query("COMMIT").execute(&mut conn).await?;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// What one run measured.
struct Figures {
    steps_per_s: f64,
    writes_per_step: f64,
    commits_per_step: f64,
}

/// Steps per second, writes and commits per step of `tasks` tasks on
/// `workers` workers, on a fresh file.
async fn run(
    dir: &std::path::Path,
    tasks: u64,
    workers: usize,
) -> Result<Figures, Box<dyn std::error::Error>> {
    let path = dir.join(format!("bench-{workers}.db"));
    let store = SqliteBackend::open_with(&path, SqliteConfig::default()).await?;
    let done = Arc::new(AtomicU64::new(0));
    let engine = Engine::builder()
        .backend(store.clone())
        .saga(NoOp { done: done.clone() })
        .workers(0)
        .build()
        .await?;
    for n in 0..tasks {
        engine.start::<NoOp>(n).await?;
    }
    let (writes, commits) = (store.writes(), store.commits());
    let started = Instant::now();
    let running = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.run_workers(workers).await })
    };
    while done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let (writes, commits) = (store.writes() - writes, store.commits() - commits);
    running.abort();
    engine.shutdown().await;
    let steps = (3 * tasks) as f64;
    Ok(Figures {
        steps_per_s: steps / seconds,
        writes_per_step: writes as f64 / steps,
        commits_per_step: commits as f64 / steps,
    })
}

/// The peer's steps per second at `args`, at 1, 4 and 16 workers, with
/// its `RESULT` lines printed.
fn peer(path: &str, dir: &std::path::Path, tasks: u64, args: &[&str]) -> Vec<(String, f64)> {
    let mut results = Vec::new();
    for concurrency in ["1", "4", "16"] {
        let db = dir.join("peer.db");
        let out = std::process::Command::new(path)
            .args(["--jobs", &tasks.to_string(), "--concurrency", concurrency])
            .arg("--db")
            .arg(&db)
            .args(["--timeout-s", "300"])
            .args(args)
            .output()
            .expect("run the peer");
        for r in sagas::peer::results(&out.stdout) {
            println!("  peer {} c={concurrency}: {}", args.join(" "), r.fields);
            if !r.finished {
                println!("  (did not finish in time: no figure)");
                continue;
            }
            results.push((format!("{} c={concurrency}", args.join(" ")), r.steps_per_s));
        }
    }
    results
}

/// The peer's raw baseline (one single-row UPDATE per transaction).
fn peer_baseline(path: &str, dir: &std::path::Path, tasks: u64) {
    let out = std::process::Command::new(path)
        .args(["--baseline", "--jobs", &tasks.to_string()])
        .arg("--db")
        .arg(dir.join("peer-baseline.db"))
        .output()
        .expect("run the peer's baseline");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        println!("  peer baseline: {line}");
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut tasks = 1000u64;
    let mut peer_path = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--peer" => peer_path = Some(args.next().ok_or("--peer takes the peer's binary")?),
            n => tasks = n.parse()?,
        }
    }
    // A directory of its own under the system's temp dir (the peer takes
    // only files there), removed after.
    let dir = std::env::temp_dir().join(format!("bench-sqlite-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = bench(&dir, tasks, peer_path.as_deref()).await;
    std::fs::remove_dir_all(&dir)?;
    result
}

async fn bench(
    dir: &std::path::Path,
    tasks: u64,
    peer_path: Option<&str>,
) -> Result<(), Box<dyn std::error::Error>> {
    let raw = baseline(dir, 3 * tasks).await?;
    println!("raw durable commits/s (one row per transaction): {raw:.0}");
    let mut best: f64 = 0.0;
    for workers in [1, 4, 8, 16] {
        // The median of three runs (the figure of one run moves by a fifth
        // on a 2-core machine).
        let mut runs = Vec::new();
        for _ in 0..3 {
            runs.push(run(dir, tasks, workers).await?);
        }
        runs.sort_by(|a, b| a.steps_per_s.total_cmp(&b.steps_per_s));
        let f = runs.swap_remove(1);
        best = best.max(f.steps_per_s);
        println!(
            "workers={workers}: {:.0} steps/s, {:.2} writes/step, {:.3} commits/step, {:.2}x the \
             raw commit rate",
            f.steps_per_s,
            f.writes_per_step,
            f.commits_per_step,
            f.steps_per_s / raw
        );
    }
    println!(
        "best: {best:.0} steps/s = {:.2}x the raw commit rate",
        best / raw
    );
    if let Some(path) = peer_path {
        peer_baseline(path, dir, tasks);
        let mut results = peer(path, dir, tasks, &["--wake", "readme", "--batch", "5"]);
        results.extend(peer(
            path,
            dir,
            tasks,
            &["--wake", "tick:1", "--batch", "50", "--lean"],
        ));
        if let Some((label, peer_best)) = results.into_iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
            println!(
                "best peer (apalis-sqlite {label}): {peer_best:.0} steps/s; ours {best:.0}: {:.2}x",
                best / peer_best
            );
        }
    }
    Ok(())
}
