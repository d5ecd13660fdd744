//! Faults only PostgreSQL has (a private server per test); the faults
//! every store has (a worker SIGKILLed mid-step, a server crash, cut
//! connections, a poison message, an unreadable record, ...) are engine
//! scenarios, written once for every store (`tests/engine_scenarios.rs`):
//!
//! - a statement stuck behind a row lock another session holds: the
//!   engine's write gives up within `lock_timeout` (or `statement_timeout`),
//!   the worker goes on with other work, and the task completes once the
//!   lock is released;
//! - the listening connection comes back after a crash and after it is
//!   terminated.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::postgres_server::TestPostgres;
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::prelude::*;
use sagas_tests::double::{finish, Double};
use sqlx::Connection;

fn config(visibility: Duration) -> PostgresConfig {
    PostgresConfig {
        visibility_timeout: visibility,
        poll_interval: Duration::from_millis(50),
        ..PostgresConfig::default()
    }
}

async fn backend(pg: &TestPostgres, config: PostgresConfig) -> PostgresBackend {
    PostgresBackend::connect_url(&pg.url(), config)
        .await
        .unwrap()
}

/// A saga whose one step waits at a gate the test opens, counting calls.
struct Gated {
    calls: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::Semaphore>,
}

#[saga(name = "gated")]
impl Gated {
    #[saga_step(1)]
    #[retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 10)]
    async fn pass(&self, n: u32) -> Result<u32, StepError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let _ = self.gate.acquire().await;
        Ok(n)
    }
}

/// Samples `pg_stat_activity` until `stop`: the longest wait for a lock of
/// each statement of the engines (by backend and start), in seconds, on
/// their own pools and on the application's.
fn watch_lock_waits(
    url: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<BTreeMap<(i32, String), f64>> {
    tokio::spawn(async move {
        let mut conn = sqlx::postgres::PgConnection::connect(&url).await.unwrap();
        let mut waits = BTreeMap::<(i32, String), f64>::new();
        while !stop.load(Ordering::SeqCst) {
            let rows: Vec<(i32, String, f64)> = sqlx::query_as(
                "SELECT pid, query_start::text, \
                        extract(epoch FROM clock_timestamp() - query_start)::float8 \
                 FROM pg_stat_activity \
                 WHERE application_name IN ('saga-runtime', 'application') \
                   AND wait_event_type = 'Lock'",
            )
            .fetch_all(&mut conn)
            .await
            .unwrap();
            for (pid, start, waited) in rows {
                let longest = waits.entry((pid, start)).or_default();
                *longest = longest.max(waited);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        waits
    })
}

/// Which pool the engine's backend uses.
#[derive(Clone, Copy, PartialEq)]
enum Pooled {
    /// Its own (`connect_url`): the timeouts set on each connection.
    Own,
    /// An application's (`connect_with`), its sessions as PostgreSQL
    /// makes them: the timeouts cannot be set on them.
    Application,
    /// An application's whose sessions start with the timeouts
    /// (`PostgresConfig::session_options`).
    ApplicationStartingBounded,
}

/// (c) Another session holds the task's row lock (`SELECT .. FOR UPDATE`
/// in an open transaction) when the step returns: the engine's write waits
/// at most `timeout` (the server cancels it), the only worker goes on with
/// other work meanwhile, and the task completes once the lock is released
/// (its step run again: its completion never landed). On an application's
/// pool too, whose own sessions keep their settings.
async fn a_write_behind_a_row_lock_gives_up(
    config: PostgresConfig,
    timeout: Duration,
    pooled: Pooled,
) {
    let pg = TestPostgres::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut options: sqlx::postgres::PgConnectOptions = pg.url().parse().unwrap();
    if pooled == Pooled::ApplicationStartingBounded {
        options = config.session_options(options);
    }
    let expected = match pooled {
        Pooled::ApplicationStartingBounded => (
            config.statement_timeout.as_millis().to_string(),
            config.lock_timeout.as_millis().to_string(),
        ),
        _ => ("0".to_owned(), "0".to_owned()),
    };
    let application = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.application_name("application"))
        .await
        .unwrap();
    let store = match pooled {
        Pooled::Own => backend(&pg, config).await,
        Pooled::Application | Pooled::ApplicationStartingBounded => {
            PostgresBackend::connect_with(application.clone(), config)
                .await
                .unwrap()
        }
    };
    let engine = Engine::builder()
        .backend(store)
        .saga(Gated {
            calls: calls.clone(),
            gate: gate.clone(),
        })
        .saga(Double)
        .lock_retry_delay(Duration::from_millis(50))
        .workers(1)
        .build()
        .await
        .unwrap();
    let id = engine.start::<Gated>(5).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the step never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_lock_waits(pg.url(), stop.clone());
    let mut blocker = sqlx::postgres::PgConnection::connect(&pg.url())
        .await
        .unwrap();
    let mut held = blocker.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM saga.tasks WHERE id = $1 FOR UPDATE")
        .bind(id.0)
        .execute(&mut *held)
        .await
        .unwrap();
    let locked_at = Instant::now();
    gate.add_permits(1000);
    // The only worker is not stuck behind the lock: it tries the write 7
    // times (the engine rides out a dropped connection so) and the lease's
    // release once, each try cut off at `timeout`, with 910 ms of pauses
    // between the tries; then it takes the other task. Held longer than
    // that, so that the write cannot land before the release.
    let other = engine.start::<Double>(21).await.unwrap();
    let hold = timeout * 8 + Duration::from_millis(910 + 2500);
    let doubled = finish(
        &engine,
        other,
        hold.saturating_sub(Duration::from_millis(300)),
    )
    .await;
    assert_eq!(doubled.output_as::<u32>().unwrap().unwrap(), 42);
    let other_took = locked_at.elapsed();
    tokio::time::sleep(hold.saturating_sub(locked_at.elapsed())).await;
    let before = engine.task(id).await.unwrap().unwrap();
    assert!(
        !before.status.is_terminal(),
        "nothing was written behind the lock: {before:#?}"
    );
    held.rollback().await.unwrap();
    let released = Instant::now();
    stop.store(true, Ordering::SeqCst);
    let waits = watcher.await.unwrap();

    let task = finish(&engine, id, Duration::from_secs(10)).await;
    assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
    assert_eq!(task.output_as::<u32>().unwrap().unwrap(), 5);
    assert_eq!(
        (calls.load(Ordering::SeqCst), task.steps[0].attempt_count),
        (2, 2),
        "the write that gave up recorded nothing: the step ran again"
    );
    let longest = waits.values().copied().fold(0.0, f64::max);
    println!(
        "{} lock waits while the row was held for {hold:?}, the longest {longest:.3} s \
         (timeout {timeout:?}); the other task finished {other_took:?} into the hold, \
         the held one {:?} after the release",
        waits.len(),
        released.elapsed()
    );
    assert!(
        waits.len() >= 2,
        "the engine met the lock and tried again: {waits:?}"
    );
    assert!(
        longest < (timeout + Duration::from_millis(1200)).as_secs_f64(),
        "a statement waited {longest:.3} s for the lock (timeout {timeout:?}): {waits:?}"
    );
    // The application's sessions are as PostgreSQL made them (the
    // engine's statements ran on them too; its listener keeps one).
    engine.shutdown().await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(application.acquire().await.unwrap());
    }
    for conn in &mut held {
        let settings: (String, String) = sqlx::query_as(
            "SELECT (SELECT setting FROM pg_settings WHERE name = 'statement_timeout'), \
             (SELECT setting FROM pg_settings WHERE name = 'lock_timeout')",
        )
        .fetch_one(&mut **conn)
        .await
        .unwrap();
        assert_eq!(settings, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_behind_a_row_lock_gives_up_after_lock_timeout() {
    let timeout = Duration::from_millis(300);
    let config = PostgresConfig {
        lock_timeout: timeout,
        ..config(Duration::from_secs(1))
    };
    a_write_behind_a_row_lock_gives_up(config, timeout, Pooled::Own).await;
}

/// Issue 39, finding 7: on a pool passed to `connect_with` the timeouts
/// were not set at all, and the engine's write waited for as long as the
/// lock was held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_behind_a_row_lock_gives_up_after_lock_timeout_on_an_application_pool() {
    let timeout = Duration::from_millis(300);
    let config = PostgresConfig {
        lock_timeout: timeout,
        ..config(Duration::from_secs(1))
    };
    a_write_behind_a_row_lock_gives_up(config, timeout, Pooled::Application).await;
}

/// The same on a pool whose sessions start with the timeouts: its
/// statements run as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_behind_a_row_lock_gives_up_on_a_pool_whose_sessions_start_bounded() {
    let timeout = Duration::from_millis(300);
    let config = PostgresConfig {
        lock_timeout: timeout,
        ..config(Duration::from_secs(1))
    };
    a_write_behind_a_row_lock_gives_up(config, timeout, Pooled::ApplicationStartingBounded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_behind_a_row_lock_gives_up_after_statement_timeout() {
    // No lock timeout (0 turns it off): the statement timeout bounds it.
    let timeout = Duration::from_millis(500);
    let config = PostgresConfig {
        lock_timeout: Duration::ZERO,
        statement_timeout: timeout,
        ..config(Duration::from_secs(1))
    };
    a_write_behind_a_row_lock_gives_up(config, timeout, Pooled::Own).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_behind_a_row_lock_gives_up_after_statement_timeout_on_an_application_pool() {
    let timeout = Duration::from_millis(500);
    let config = PostgresConfig {
        lock_timeout: Duration::ZERO,
        statement_timeout: timeout,
        ..config(Duration::from_secs(1))
    };
    a_write_behind_a_row_lock_gives_up(config, timeout, Pooled::Application).await;
}

/// Whether a connection of an engine is listening: its last statement
/// was the `LISTEN` of the schema's channels, and nothing came after.
fn listening(pg: &TestPostgres) -> bool {
    pg.try_psql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'saga-runtime' \
         AND state = 'idle' AND query LIKE 'LISTEN %saga_work%'",
    )
    .is_ok_and(|n| n != "0")
}

/// (e) The listening connection comes back after the server restarts and
/// after it is terminated: idle workers are woken by notifications again,
/// not only by their own polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_comes_back_after_a_crash_and_after_it_is_terminated() {
    let mut pg = TestPostgres::start();
    let engine = Engine::builder()
        .backend(backend(&pg, config(Duration::from_secs(1))).await)
        .saga(Double)
        .workers(1)
        .build()
        .await
        .unwrap();
    let mut back_after = Vec::new();
    for fault in ["none", "crash", "terminate"] {
        let faulted = Instant::now();
        match fault {
            "crash" => tokio::task::block_in_place(|| {
                pg.crash();
                std::thread::sleep(Duration::from_millis(500));
                pg.restart();
            }),
            "terminate" => {
                pg.psql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE application_name = 'saga-runtime' AND pid <> pg_backend_pid()",
                );
            }
            _ => {}
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !tokio::task::block_in_place(|| listening(&pg)) {
            assert!(
                Instant::now() < deadline,
                "nobody listens after the {fault} (a worker would only find work by polling)"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        back_after.push((fault, faulted.elapsed()));
        let id = engine.start::<Double>(4).await.unwrap();
        let task = finish(&engine, id, Duration::from_secs(10)).await;
        assert_eq!(task.output_as::<u32>().unwrap().unwrap(), 8);
    }
    println!("listening again after: {back_after:?}");
}
