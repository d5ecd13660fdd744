//! Counts the transactions and statements a step costs on PostgreSQL, as
//! `tests/round_trips.rs` counts Redis round trips, so that a change that
//! adds one fails here rather than show up later as a slower benchmark.
//!
//! Against a private server with `pg_stat_statements` preloaded (and
//! autovacuum off: its workers' transactions would count too):
//!
//! - statements: `pg_stat_statements` calls (top-level statements only: a
//!   protocol function's inner statements are not round trips), reset
//!   when the count begins;
//! - transactions: the deltas of `pg_stat_database.xact_commit` and
//!   `xact_rollback` for the test database. The test reads them (and
//!   everything else it looks at while counting) on short-lived
//!   connections to another database, so its own reads are not in the
//!   count; that they are not is checked on the idle server. A backend
//!   reports its counters when it goes idle, at most once a second, or
//!   when it exits: the count ends once every connection of the engine has
//!   closed.
//!
//! The engine's writes do not notify in their transactions; it sends the
//! notifications for many of them in one statement afterwards (a task's
//! end wakes its waiters), and its `LISTEN`ing connection runs a
//! transaction of its own each time it reads notifications. Neither is
//! per step: both are left out of the bound of 2 per step, which counts
//! the engine's statements in the steady state (each its own
//! transaction), and shown apart (the listener's with the transactions of
//! connections starting, as those no statement accounts for).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::postgres_server::TestPostgres;
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::prelude::*;
use sagas::NoOp;
use sqlx::Connection;

/// A backend whose idle reader looks for work only every 10 s: once the
/// queue is empty the count is over, and its polls are not the steps'.
async fn backend(pg: &TestPostgres) -> PostgresBackend {
    let config = PostgresConfig {
        poll_interval: Duration::from_secs(10),
        ..PostgresConfig::default()
    };
    PostgresBackend::connect_url(&pg.url(), config)
        .await
        .unwrap()
}

async fn engine(backend: PostgresBackend, done: &Arc<AtomicU64>) -> Engine {
    Engine::builder()
        .backend(backend)
        .saga(NoOp { done: done.clone() })
        // The timer poller and the janitor run on their own clocks, not
        // per step: out of the way of the count.
        .timeout_poll_interval(Duration::from_secs(600))
        .housekeeping_interval(Duration::from_secs(600))
        .workers(0)
        .build()
        .await
        .unwrap()
}

/// A connection to the `observer` database of `pg`: what the test reads
/// while it counts is not in the test database's counters.
async fn observe(pg: &TestPostgres) -> sqlx::postgres::PgConnection {
    let url = format!("postgres://postgres@127.0.0.1:{}/observer", pg.port());
    sqlx::postgres::PgConnection::connect(&url).await.unwrap()
}

/// Transactions committed and rolled back in the test database so far.
async fn transactions(pg: &TestPostgres) -> i64 {
    let mut conn = observe(pg).await;
    let n: i64 = sqlx::query_scalar(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
         WHERE datname = 'postgres'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    n
}

/// Waits until no connection of an engine is left (each reported its
/// counters as it exited), then a moment for the last reports to land.
async fn engines_gone(pg: &TestPostgres) {
    let mut conn = observe(pg).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'saga-runtime'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} connections stayed open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    conn.close().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
}

/// Every statement run in the test database since the last reset, by
/// text: how often, and how many rows it returned in all.
async fn statements(pg: &TestPostgres) -> BTreeMap<String, (i64, i64)> {
    let mut conn = observe(pg).await;
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT regexp_replace(s.query, '\\s+', ' ', 'g'), s.calls, s.rows \
         FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
         WHERE d.datname = 'postgres'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    rows.into_iter()
        .fold(BTreeMap::new(), |mut by_query, (query, calls, rows)| {
            let entry = by_query.entry(query).or_insert((0, 0));
            *entry = (entry.0 + calls, entry.1 + rows);
            by_query
        })
}

/// Statements an engine runs once, or on its own beat, not per step:
/// connecting (each new connection sets its timeouts), the migration check,
/// `LISTEN`, `UNLISTEN` as the listener closes, its announcements and its
/// named leases.
fn once(query: &str) -> bool {
    ["SET ", "LISTEN ", "UNLISTEN ", "BEGIN", "COMMIT", "CREATE "]
        .iter()
        .any(|start| query.starts_with(start))
        || query.contains("schema_version")
        || query.contains("pg_advisory_xact_lock")
        // The engine's own beat, not a step's: announcing what it runs
        // (process managers and saga versions, at start, every heartbeat,
        // withdrawn at shutdown) and letting its named leases go.
        || query.contains(".announce_processes(")
        || query.contains(".release_named_lease(")
}

/// Forgets every statement counted so far.
async fn reset_statements(pg: &TestPostgres) {
    let mut conn = observe(pg).await;
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
}

/// A short name for a statement: the protocol function it calls.
fn short(query: &str) -> String {
    match query.split_once("FROM \"saga\".") {
        Some((_, rest)) => rest.split('(').next().unwrap_or(rest).to_owned(),
        None => query.chars().take(60).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_steps_costs_at_most_two_transactions_per_step() {
    let pg = TestPostgres::start_with(&[
        ("shared_preload_libraries", "pg_stat_statements"),
        ("autovacuum", "off"),
    ]);
    pg.psql("CREATE DATABASE observer");
    let observer = format!("postgres://postgres@127.0.0.1:{}/observer", pg.port());
    let out = std::process::Command::new("psql")
        .args([
            observer.as_str(),
            "-c",
            "CREATE EXTENSION pg_stat_statements",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let done = Arc::new(AtomicU64::new(0));
    let tasks = 200u64;
    // The tasks are started by an engine that is gone before the count
    // begins (its listener would count).
    let client = backend(&pg).await;
    let starter = engine(client.clone(), &done).await;
    for n in 0..tasks {
        starter.start::<NoOp>(n).await.unwrap();
    }
    starter.shutdown().await;
    drop(starter);
    client.pool().close().await;
    drop(client);
    engines_gone(&pg).await;

    // The test's reads are not in the count: two on the idle server.
    let idle = transactions(&pg).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = transactions(&pg).await;
    assert_eq!(before, idle, "the test's reads count no transaction");
    reset_statements(&pg).await;

    let workers = backend(&pg).await;
    let pool = workers.pool().clone();
    let worker = engine(workers, &done).await;
    let run = {
        let worker = worker.clone();
        tokio::spawn(async move { worker.run_workers(1).await })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while done.load(Ordering::Relaxed) < tasks {
        assert!(Instant::now() < deadline, "the tasks did not finish");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The last commit lands before the shutdown returns.
    worker.shutdown().await;
    let _ = run.await;
    drop(worker);
    pool.close().await;
    engines_gone(&pg).await;
    let total = transactions(&pg).await - before;
    let by_query = statements(&pg).await;

    let completed = pg.psql("SELECT count(*) FROM saga.tasks WHERE status = 'Completed'");
    assert_eq!(completed, tasks.to_string(), "every task completed");
    let steps = (tasks * 3) as f64;
    let calls = |starts: &str| -> i64 {
        by_query
            .iter()
            .filter(|(q, _)| q.starts_with(starts))
            .map(|(_, (n, _))| n)
            .sum()
    };
    for (query, (n, rows)) in &by_query {
        println!("{n:>6} calls {rows:>6} rows  {}", short(query));
    }
    let statements: i64 = by_query.values().map(|(n, _)| n).sum();
    let setup: i64 = by_query
        .iter()
        .filter(|(q, _)| once(q))
        .map(|(_, (n, _))| n)
        .sum();
    // The reads that found nothing: before the first message, once the
    // queue was empty (each asks for one message), with what an idle
    // reader asks next (when the next delayed message is due, if the
    // backend asks).
    let empty_reads: i64 = by_query
        .iter()
        .filter(|(q, _)| q.contains(".take("))
        .map(|(_, (n, rows))| n - rows)
        .sum::<i64>()
        + by_query
            .iter()
            .filter(|(q, _)| q.contains(".next_visible("))
            .map(|(_, (n, _))| n)
            .sum::<i64>();
    // The steady state: every statement but those. Each is a transaction
    // of its own (autocommit): no explicit transaction but the migration
    // check's.
    assert!(
        calls("BEGIN") <= 1,
        "an explicit transaction per step: {by_query:#?}"
    );
    // The notifications the engine sends after its writes (its own
    // writes do not notify in their transactions): at most one a few
    // milliseconds, whatever the number of steps.
    let notifications = calls("SELECT count(pg_notify");
    let steady = statements - setup - empty_reads - notifications;
    // The set-up's transactions: one per connection (its two `SET`s in one
    // query), the migration check's, the `LISTEN`s (one query), `UNLISTEN`.
    let setup_transactions = calls("SET lock_timeout")
        + calls("BEGIN")
        + calls("LISTEN \"saga_work")
        + calls("UNLISTEN");
    let unaccounted = total - steady - empty_reads - setup_transactions - notifications;
    println!(
        "{tasks} tasks x 3 no-op steps, 1 worker: {statements} statements and {total} transactions \
         in all ({:.2} and {:.2} per step); in the steady state {steady} statements, each its own \
         transaction: {:.2} per step; once: {setup} set-up statements ({setup_transactions} \
         transactions), {empty_reads} idle reads (found nothing), {notifications} notifications \
         sent; {unaccounted} transactions of no \
         statement ({:.2} per step): the listener reading notifications, and connections starting",
        statements as f64 / steps,
        total as f64 / steps,
        steady as f64 / steps,
        unaccounted as f64 / steps,
    );
    // A task of 3 steps: its message taken with its lease (1), each
    // attempt recorded with the last one's outcome (3), the commit (1):
    // 5 for 3 steps. The bound is 2; this one catches a regression.
    assert!(
        steady as f64 / steps <= 5.0 / 3.0 + 0.01,
        "{:.2} transactions per step in the steady state (budget 5/3): {by_query:#?}",
        steady as f64 / steps
    );
    // Notifications go out after the writes, for all those of the last
    // few milliseconds at once: at most one per task (its final commit;
    // the writes of its steps before it share its statement or need
    // none), never one per step. Fewer when tasks end closer together
    // than the waker's spacing, which is the machine's speed, not a
    // count to hold it to.
    assert!(
        notifications <= tasks as i64,
        "{notifications} notifications sent for {tasks} tasks of 3 steps"
    );
    // The listener reads each notification once; a few connections start
    // (how many depends on the pool's timing: 1 to 41 here). Notifications
    // sent per step would make it three per task.
    assert!(
        unaccounted <= tasks as i64 * 3 / 2,
        "{unaccounted} transactions of no statement of the engine's for {tasks} tasks"
    );
}

/// A read of the queue reads the index entries of the messages it takes,
/// not the backlog: with 5,000 messages due, taking 10 for a worker that
/// takes every kind returns a bounded number of index entries and heap
/// rows. One scan for `kind = ANY(..)` cannot read the index in
/// `visible_at` order across kinds, so it sorted every due message on
/// every take (a read cost 4 ms at a backlog of 12,000 and grew with it).
/// Counted in the taking transaction itself (`pg_stat_get_xact_*`), so no
/// other connection's reads are in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_reads_what_it_takes_not_the_backlog() {
    let pg = TestPostgres::start();
    let backend = PostgresBackend::connect_url(&pg.url(), PostgresConfig::default())
        .await
        .unwrap();
    // Messages of each kind, due in the order they were written (not
    // decodable: the take does not look inside them).
    pg.psql(
        "INSERT INTO saga.queue (kind, payload, visible_at) \
         SELECT n % 3, 'backlog', clock_timestamp() - interval '1 hour' + n * interval '1 ms' \
         FROM generate_series(1, 5000) AS n",
    );
    let counts = pg.psql(
        "SELECT count(*) FROM saga.take_leased('reader', ARRAY[2, 0, 1]::smallint[], 10, 30000); \
         SELECT pg_stat_get_xact_tuples_returned('saga.queue_visible'::regclass) \
             || ' ' || pg_stat_get_xact_tuples_fetched('saga.queue'::regclass)",
    );
    // psql prints each statement's result: the counts are the last line.
    let (index, heap) = counts.lines().last().unwrap().split_once(' ').unwrap();
    let (index, heap): (u64, u64) = (index.parse().unwrap(), heap.parse().unwrap());
    // Up to 10 per kind locked, the first 10 of them taken, each fetched
    // again to be updated.
    assert!(
        index <= 40,
        "index entries read for one take: {index} (of 5,000 due)"
    );
    assert!(
        heap <= 60,
        "rows fetched for one take: {heap} (of 5,000 due)"
    );
    let taken: i64 = sqlx::query_scalar("SELECT count(*) FROM saga.queue WHERE claim IS NOT NULL")
        .fetch_one(backend.pool())
        .await
        .unwrap();
    assert_eq!(taken, 10, "a take takes what it is asked for");
    // The oldest due messages, whatever their kind (written in the order
    // they are due, so the first ten ids).
    let span: i64 = sqlx::query_scalar(
        "SELECT max(id) - (SELECT min(id) FROM saga.queue) FROM saga.queue WHERE claim IS NOT NULL",
    )
    .fetch_one(backend.pool())
    .await
    .unwrap();
    assert_eq!(span, 9, "the ten oldest are taken");
}

/// The engine's commits do not notify in their transactions; its waker
/// tells other engines afterwards. A listener of its own (as another
/// engine's is) hears every task's end by id. Without the waker's sends
/// nothing arrives here (checked: the test times out): the running engine
/// would wake only its own waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_engines_hear_of_every_end_after_the_commit() {
    let pg = TestPostgres::start();
    let done = Arc::new(AtomicU64::new(0));
    let worker = engine(backend(&pg).await, &done).await;
    let mut listener = sqlx::postgres::PgListener::connect(&pg.url())
        .await
        .unwrap();
    listener.listen("saga_finished").await.unwrap();
    let mut ids = std::collections::BTreeSet::new();
    for n in 0..5u64 {
        ids.insert(worker.start::<NoOp>(n).await.unwrap().0.to_string());
    }
    let run = {
        let worker = worker.clone();
        tokio::spawn(async move { worker.run_workers(1).await })
    };
    let mut heard = std::collections::BTreeSet::new();
    while heard.len() < ids.len() {
        let note = tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .expect("every end is notified within 10 s")
            .unwrap();
        heard.extend(note.payload().split(',').map(str::to_owned));
    }
    assert_eq!(heard, ids, "each ended task named once it ended");
    worker.shutdown().await;
    let _ = run.await;
}
