//! Ordinary production faults on PostgreSQL (a private server per test),
//! as `tests/faults_redis.rs` has them on Redis:
//!
//! - a worker process SIGKILLed mid-step: its task resumes on another
//!   worker once its lease and message expire, and the killed attempt is
//!   counted;
//! - the server crashing and restarting mid-run: an in-process engine rides
//!   it out, callers of `start` and `wait` see no error;
//! - a statement stuck behind a row lock another session holds: the
//!   engine's write gives up within `lock_timeout` (or `statement_timeout`),
//!   the worker goes on with other work, and the task completes once the
//!   lock is released;
//! - connections terminated while tasks run: nothing is lost;
//! - the listening connection comes back after a crash and after it is
//!   terminated;
//! - a message that kills its worker: dead-lettered after the cap.
//!
//! Executions of the `chaos` saga are recorded on a private Redis, out of
//! the faults' way.

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::postgres_server::TestPostgres;
use common::redis_server::TestRedis;
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::prelude::*;
use saga_runtime::TaskFilter;
use sagas_tests::chaos::{check_task, Chaos, ChaosConfig};
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

async fn recorder(record: &TestRedis) -> redis::aio::ConnectionManager {
    redis::Client::open(record.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap()
}

/// An engine running the `chaos` saga with `workers` workers in this
/// process, recording on `record`.
async fn chaos_engine(
    pg: &TestPostgres,
    record: &TestRedis,
    chaos: ChaosConfig,
    workers: usize,
) -> Engine {
    Engine::builder()
        .backend(backend(pg, config(Duration::from_secs(1))).await)
        .saga(Chaos::new(recorder(record).await, "in-process", chaos))
        .lock_retry_delay(Duration::from_millis(50))
        .workers(workers)
        .build()
        .await
        .unwrap()
}

fn quick() -> ChaosConfig {
    ChaosConfig {
        max_work: Duration::ZERO,
        failure_rate: 0.0,
        record: true,
        poison: None,
    }
}

fn spawn_worker(pg: &TestPostgres, record: &TestRedis, envs: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_chaos-worker"));
    cmd.env("BACKEND_URL", pg.url())
        .env("RECORD_URL", record.url())
        .env("RUST_LOG", "off");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn chaos-worker")
}

/// Waits for a task with a deadline, so a stalled engine fails the test
/// instead of hanging it.
async fn finish(engine: &Engine, id: TaskId, within: Duration) -> TaskInstance {
    match tokio::time::timeout(within, engine.wait(id)).await {
        Ok(task) => task.unwrap(),
        Err(_) => panic!(
            "task {id} did not finish within {within:?}: {:#?}",
            engine.task(id).await
        ),
    }
}

/// Every task completed with its output, and its executions as its record
/// says: no step whose completion was recorded ran again, none overlapped.
async fn all_completed(engine: &Engine, record: &TestRedis, ids: &[(u64, TaskId)]) {
    let mut recorder = recorder(record).await;
    for (n, id) in ids {
        let task = finish(engine, *id, Duration::from_secs(30)).await;
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
        assert_eq!(task.output_as::<u64>().unwrap().unwrap(), n + 3);
        let executions = Chaos::executions(&mut recorder, *id).await.unwrap();
        check_task(&task, &executions).unwrap();
    }
}

fn wall_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// (a) A worker process SIGKILLed in the middle of a step: nobody takes
/// the task over while its lease and message could still be the dead
/// worker's, then another worker does, the killed attempt counted, and the
/// task completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_step_hands_its_task_over_after_the_visibility_timeout() {
    let pg = TestPostgres::start();
    let record = TestRedis::start_with_aof(false);
    let client = chaos_engine(&pg, &record, quick(), 0).await;
    let mut recorder = recorder(&record).await;
    let id = client.start::<Chaos>(7).await.unwrap();
    let visibility = Duration::from_millis(1000);
    let envs = |work: &'static str| {
        [
            ("WORKERS", "1"),
            ("VISIBILITY_MS", "1000"),
            ("POLL_MS", "50"),
            ("MAX_WORK_MS", work),
            ("FAILURE_RATE", "0"),
        ]
    };
    // Its steps take up to a minute: it is killed inside the first.
    let mut slow = spawn_worker(&pg, &record, &envs("60000"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let task = client.task(id).await.unwrap().unwrap();
        if task.steps[0].attempt_count == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the step never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    slow.kill().unwrap(); // SIGKILL, mid-step
    slow.wait().unwrap();
    let (killed_at, killed_wall) = (Instant::now(), wall_us());
    assert!(
        Chaos::executions(&mut recorder, id)
            .await
            .unwrap()
            .is_empty(),
        "killed before the step's body returned"
    );
    let mut replacement = spawn_worker(&pg, &record, &envs("0"));
    let task = finish(&client, id, Duration::from_secs(20)).await;
    let took = killed_at.elapsed();
    let _ = replacement.kill();
    let _ = replacement.wait();

    assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
    let attempts: Vec<u32> = task.steps.iter().map(|s| s.attempt_count).collect();
    assert_eq!(attempts, [2, 1, 1], "the killed attempt is counted");
    let executions = Chaos::executions(&mut recorder, id).await.unwrap();
    check_task(&task, &executions).unwrap();
    let replacement_pid = format!("pid-{}", replacement.id());
    assert!(
        executions.len() == 3 && executions.iter().all(|e| e.worker == replacement_pid),
        "the other worker ran every step: {executions:?}"
    );
    // The dead worker's lease was last renewed a heartbeat (a third of the
    // lease) before the kill at the earliest: the task was not taken over
    // before that lease could have run out.
    let resumed_after =
        Duration::from_micros(executions[0].start_us.saturating_sub(killed_wall) as u64);
    assert!(
        resumed_after >= visibility / 2,
        "taken over {resumed_after:?} after the kill, while the dead worker's lease may have held"
    );
    assert!(
        took < visibility + Duration::from_secs(6),
        "the killed worker's task took {took:?} to finish"
    );
    println!("resumed {resumed_after:?} after the kill, finished after {took:?}");
}

/// Where a test that crashes the server is: before the crash, while the
/// server is down, after the restart.
const UP: u8 = 0;
const DOWN: u8 = 1;
const RESTARTED: u8 = 2;

/// Whether a call that began in `before` and returned in `after` was in
/// flight while the server was down.
fn spanned_the_outage(before: u8, after: u8) -> bool {
    before <= DOWN && after >= DOWN
}

/// What the caller of [`start_paced`] saw: the tasks they started (input,
/// id), what their calls failed with, and how many calls were in flight
/// while the server was down.
struct Called {
    ids: Vec<(u64, TaskId)>,
    errors: Vec<String>,
    spanning: usize,
}

/// Starts tasks `0..n`, one every `pace`, then waits for them; returns
/// their ids, what the calls failed with, and how many calls were in
/// flight while the server was down (`phase`).
fn start_paced(
    engine: &Engine,
    n: u64,
    pace: Duration,
    phase: &Arc<AtomicU8>,
) -> tokio::task::JoinHandle<Called> {
    let (engine, phase) = (engine.clone(), phase.clone());
    tokio::spawn(async move {
        let (mut ids, mut errors, mut spanning) = (Vec::new(), Vec::new(), 0);
        for i in 0..n {
            let before = phase.load(Ordering::SeqCst);
            let started = match i % 2 {
                0 => engine.start::<Chaos>(i).await,
                _ => engine.start_with_key::<Chaos>(&format!("k-{i}"), i).await,
            };
            spanning += usize::from(spanned_the_outage(before, phase.load(Ordering::SeqCst)));
            match started {
                Ok(id) => ids.push((i, id)),
                Err(e) => errors.push(format!("start {i}: {e}")),
            }
            tokio::time::sleep(pace).await;
        }
        for (_, id) in &ids {
            if let Err(e) = engine.wait(*id).await {
                errors.push(format!("wait {id}: {e}"));
            }
        }
        Called {
            ids,
            errors,
            spanning,
        }
    })
}

/// Waits for every task not finished yet, each in a call of its own;
/// returns what the calls failed with and how many were in flight while
/// the server was down.
async fn wait_unfinished(
    engine: &Engine,
    phase: &Arc<AtomicU8>,
) -> tokio::task::JoinHandle<(Vec<String>, usize)> {
    let mut unfinished = Vec::new();
    for status in [TaskStatus::Pending, TaskStatus::Running] {
        let filter = TaskFilter::new().saga("chaos").status(status).limit(1000);
        unfinished.extend(
            engine
                .tasks(filter)
                .await
                .unwrap()
                .tasks
                .into_iter()
                .map(|t| t.id),
        );
    }
    let waits: Vec<_> = unfinished
        .into_iter()
        .map(|id| {
            let (engine, phase) = (engine.clone(), phase.clone());
            tokio::spawn(async move {
                let before = phase.load(Ordering::SeqCst);
                let waited = engine.wait(id).await;
                let spanned = spanned_the_outage(before, phase.load(Ordering::SeqCst));
                (waited.err().map(|e| format!("wait {id}: {e}")), spanned)
            })
        })
        .collect();
    tokio::spawn(async move {
        let (mut errors, mut spanning) = (Vec::new(), 0);
        for wait in waits {
            let (error, spanned) = wait.await.unwrap();
            errors.extend(error);
            spanning += usize::from(spanned);
        }
        (errors, spanning)
    })
}

/// (b) The server crashes (`pg_ctl stop -m immediate`) and comes back a
/// second later while tasks run and callers start and wait for more: the
/// in-process engine rides it out (no call fails), and every task
/// completes as recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_rides_out_a_postgres_crash_and_restart() {
    let mut pg = TestPostgres::start();
    let record = TestRedis::start_with_aof(false);
    let chaos = ChaosConfig {
        max_work: Duration::from_millis(30),
        failure_rate: 0.1,
        ..quick()
    };
    let engine = chaos_engine(&pg, &record, chaos, 2).await;
    let phase = Arc::new(AtomicU8::new(UP));
    let caller = start_paced(&engine, 80, Duration::from_millis(25), &phase);
    // Some tasks have finished and some are in flight when it crashes.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let counts = engine.backend().count_tasks("chaos").await.unwrap();
        let count = |s: TaskStatus| counts.iter().find(|c| c.0 == s).map_or(0, |c| c.1);
        let total = counts.iter().map(|c| c.1).sum::<usize>();
        if count(TaskStatus::Completed) >= 10 && total > count(TaskStatus::Completed) {
            break;
        }
        assert!(Instant::now() < deadline, "tasks did not get going");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waiter = wait_unfinished(&engine, &phase).await;
    tokio::task::block_in_place(|| {
        pg.crash();
        phase.store(DOWN, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(1));
        pg.restart();
        phase.store(RESTARTED, Ordering::SeqCst);
    });
    let Called {
        ids,
        mut errors,
        spanning: starts_spanning,
    } = caller.await.unwrap();
    let (wait_errors, waits_spanning) = waiter.await.unwrap();
    errors.extend(wait_errors);
    assert!(errors.is_empty(), "callers saw errors: {errors:#?}");
    assert!(
        starts_spanning >= 1 && waits_spanning >= 1,
        "calls were in flight while the server was down ({starts_spanning} starts, {waits_spanning} waits)"
    );
    assert_eq!(ids.len(), 80);
    all_completed(&engine, &record, &ids).await;
    println!(
        "in flight while the server was down: {starts_spanning} starts, {waits_spanning} waits"
    );
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

struct Double;

#[saga(name = "double")]
impl Double {
    #[saga_step(1)]
    async fn double(&self, n: u32) -> Result<u32, StepError> {
        Ok(n * 2)
    }
}

/// Issue 39, finding 6: a task row whose head this version cannot read (a
/// status it does not know, as a newer version may write during a rolling
/// deploy), taken in one read with good messages. The read used to fail
/// as a whole after every row in it was claimed: the good messages waited
/// out the visibility timeout (and counted a delivery each), the bad one
/// came back every visibility timeout for ever and was never
/// dead-lettered, and listing the saga failed. Now the good ones run at
/// once, the bad one is handed back for a version that can read it and
/// dead-lettered at the cap with a reason, and listings leave it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_task_record_is_dead_lettered_alone_and_holds_nothing_up() {
    let pg = TestPostgres::start();
    let visibility = Duration::from_secs(8);
    let client = Engine::builder()
        .backend(backend(&pg, config(visibility)).await)
        .saga(Double)
        .workers(0)
        .build()
        .await
        .unwrap();
    let mut good = Vec::new();
    for n in 1..4 {
        good.push((n, client.start::<Double>(n).await.unwrap()));
    }
    let bad = client.start::<Double>(99).await.unwrap();
    for n in 4..7 {
        good.push((n, client.start::<Double>(n).await.unwrap()));
    }
    pg.psql(&format!(
        "UPDATE saga.tasks SET head = jsonb_set(head, '{{status}}', '\"Exploded\"') \
         WHERE id = '{bad}'"
    ));
    // One worker taking up to 8 at once: the first read takes all seven.
    let started = Instant::now();
    let _workers = Engine::builder()
        .backend(backend(&pg, config(visibility)).await)
        .saga(Double)
        .worker_concurrency(8)
        .max_deliveries(2)
        .lock_retry_delay(Duration::from_millis(50))
        .workers(1)
        .build()
        .await
        .unwrap();
    for (n, id) in &good {
        let task = finish(&client, *id, Duration::from_secs(20)).await;
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
        assert_eq!(task.output_as::<u32>().unwrap().unwrap(), n * 2);
        assert_eq!(task.steps[0].attempt_count, 1, "{task:#?}");
    }
    let took = started.elapsed();
    assert!(
        took < visibility / 2,
        "the good tasks waited {took:?} (visibility timeout {visibility:?})"
    );
    println!("the good tasks were done in {took:?}");

    // Handed back for a version that can read it (1 s, then 2 s), then
    // dead-lettered on its own, with the reason.
    let deadline = Instant::now() + Duration::from_secs(20);
    let letter = loop {
        let page = client.dead_letters(Default::default()).await.unwrap();
        if let Some(letter) = page.letters.into_iter().next() {
            break letter;
        }
        assert!(
            Instant::now() < deadline,
            "the unreadable task's message was never dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(letter.task_id, Some(bad), "{letter:#?}");
    assert!(
        letter.reason.contains("cannot read the record") && letter.reason.contains("Exploded"),
        "{letter:#?}"
    );
    let queued = pg.psql("SELECT count(*) FROM saga.queue");
    assert_eq!(queued.trim(), "0", "nothing left on the queue");

    // The listing leaves the unreadable task out; loading it names it.
    let listed = client.tasks_of("double").await.unwrap();
    let ids: Vec<TaskId> = listed.iter().map(|t| t.id).collect();
    assert_eq!(listed.len(), good.len(), "{ids:?}");
    assert!(!ids.contains(&bad));
    // Paged three at a time: the first page's read meets it, and reads on
    // past it rather than end the listing there.
    let mut paged = Vec::new();
    let mut filter = TaskFilter::new().saga("double").limit(3);
    loop {
        let page = client.tasks(filter.clone()).await.unwrap();
        paged.extend(page.tasks.iter().map(|t| t.id));
        match page.next {
            Some(next) => filter = filter.after(next),
            None => break,
        }
    }
    assert_eq!(paged.len(), good.len(), "{paged:?}");
    let error = client.task(bad).await.unwrap_err().to_string();
    assert!(error.contains("Exploded"), "{error}");
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

/// (d) Every connection of the engine terminated every few dozen
/// milliseconds while 100 tasks run: nothing is lost or made twice, and no
/// caller sees an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connections_lose_nothing() {
    let pg = TestPostgres::start();
    let record = TestRedis::start_with_aof(false);
    let chaos = ChaosConfig {
        max_work: Duration::from_millis(10),
        ..quick()
    };
    let engine = chaos_engine(&pg, &record, chaos, 2).await;
    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(Mutex::new(Vec::<usize>::new()));
    let killer = {
        let (stop, kills, url) = (stop.clone(), kills.clone(), pg.url());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let out = Command::new("psql")
                    .arg(&url)
                    .args(["-At", "-c"])
                    .arg(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                         WHERE application_name = 'saga-runtime' AND pid <> pg_backend_pid()",
                    )
                    .output()
                    .unwrap();
                let n = String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse()
                    .unwrap_or(0);
                kills.lock().unwrap().push(n);
                std::thread::sleep(Duration::from_millis(40));
            }
        })
    };
    while kills.lock().unwrap().len() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let kills_before = kills.lock().unwrap().len();
    let never_down = Arc::new(AtomicU8::new(UP));
    let Called { ids, errors, .. } = start_paced(&engine, 100, Duration::ZERO, &never_down)
        .await
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    killer.join().unwrap();
    assert!(errors.is_empty(), "callers saw errors: {errors:#?}");
    let kills = kills.lock().unwrap()[kills_before..].to_vec();
    let terminated: usize = kills.iter().sum();
    assert!(
        kills.len() >= 5 && terminated >= 10,
        "connections were terminated only {terminated} times in {} rounds",
        kills.len()
    );
    all_completed(&engine, &record, &ids).await;
    let listed = engine
        .tasks(TaskFilter::new().saga("chaos").limit(1000))
        .await
        .unwrap();
    assert_eq!(listed.tasks.len(), 100, "no start made a second task");
    println!(
        "{terminated} connections terminated in {} rounds while 100 tasks ran",
        kills.len()
    );
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

/// (f) A message whose handling kills its worker (abort, out of memory) is
/// dead-lettered after the cap of deliveries, with its task, and holds
/// nothing else up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_kills_its_worker_is_dead_lettered_after_the_cap() {
    let pg = TestPostgres::start();
    let record = TestRedis::start_with_aof(false);
    let client = chaos_engine(&pg, &record, quick(), 0).await;
    let mut ids = Vec::new();
    for n in 1..=4u64 {
        ids.push((n, client.start::<Chaos>(n).await.unwrap()));
    }
    let poison = client.start::<Chaos>(666).await.unwrap();
    let envs = [
        ("WORKERS", "1"),
        ("POISON", "666"),
        ("MAX_DELIVERIES", "3"),
        ("VISIBILITY_MS", "500"),
        ("POLL_MS", "50"),
        ("MAX_WORK_MS", "0"),
        ("FAILURE_RATE", "0"),
    ];
    let mut worker = spawn_worker(&pg, &record, &envs);
    let mut crashes = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let task = client.task(poison).await.unwrap().unwrap();
        if task.status.is_terminal() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the poison message was still looping after {crashes} crashes"
        );
        if worker.try_wait().unwrap().is_some() {
            crashes += 1;
            worker = spawn_worker(&pg, &record, &envs);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let task = client.task(poison).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::DeadLettered, "{task:#?}");
    let error = task.error.clone().unwrap();
    assert!(
        error.contains("delivered 3 times without completing"),
        "{error}"
    );
    assert!(crashes >= 3, "each delivery killed a worker ({crashes})");
    all_completed(&client, &record, &ids).await;
    let letters = client
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    assert!(
        letters
            .iter()
            .any(|l| l.task_id == Some(poison) && l.reason.contains("delivered 3 times")),
        "{letters:#?}"
    );
    let _ = worker.kill();
    let _ = worker.wait();
}
