//! Benchmark: a 3-step saga with no-op steps on a SQLite file with durable
//! commits (WAL, `synchronous = FULL`), next to the disk's raw durable
//! commit rate measured on the same disk in the same run (one row inserted
//! per transaction, with the same sqlx and SQLite).
//!
//! ```text
//! cargo run --release --example bench_sqlite [-- TASKS]
//! ```
//!
//! Prints, in one run, steps per second with 1, 4 and 8 workers, the write
//! transactions committed per step (each a WAL sync to the disk), and the
//! ratio of steps per second to the raw one-commit-per-step baseline. The
//! peer (apalis-sqlite, `../shared/peer-sqlite`) runs with its own
//! `bench.sh` on the same machine; its `RESULT` lines report steps per
//! second and commits per step in the same terms.

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

/// Steps per second and commits per step of `tasks` tasks on `workers`
/// workers, on a fresh file.
async fn run(
    dir: &std::path::Path,
    tasks: u64,
    workers: usize,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
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
    let before = store.commits();
    let started = Instant::now();
    let running = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.run_workers(workers).await })
    };
    while done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let commits = store.commits() - before;
    running.abort();
    engine.shutdown().await;
    let steps = (3 * tasks) as f64;
    Ok((steps / seconds, commits as f64 / steps))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tasks: u64 = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(1000);
    // A directory of its own under the system's temp dir, removed after.
    let dir = std::env::temp_dir().join(format!("bench-sqlite-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = bench(&dir, tasks).await;
    std::fs::remove_dir_all(&dir)?;
    result
}

async fn bench(dir: &std::path::Path, tasks: u64) -> Result<(), Box<dyn std::error::Error>> {
    let raw = baseline(dir, 3 * tasks).await?;
    println!("raw durable commits/s (one row per transaction): {raw:.0}");
    let mut best: f64 = 0.0;
    for workers in [1, 4, 8] {
        let (steps, commits) = run(dir, tasks, workers).await?;
        best = best.max(steps);
        println!(
            "workers={workers}: {steps:.0} steps/s, {commits:.2} commits/step, {:.2}x the raw commit rate",
            steps / raw
        );
    }
    println!(
        "best: {best:.0} steps/s = {:.2}x the raw commit rate",
        best / raw
    );
    Ok(())
}
