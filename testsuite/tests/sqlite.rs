//! What only the SQLite store has: one process per file (a second opener
//! is refused), files that are not this library's store refused at open
//! with a message saying what to do, and a worker process SIGKILLed
//! mid-run whose tasks all resume from the file when it starts again. The
//! store's operations are held to the protocol by the conformance suite
//! (`tests/conformance.rs`, module `sqlite`).

mod common;
#[macro_use]
mod scenarios;

use std::path::Path;
use std::time::Duration;

use saga_runtime::backend::sqlite::{SqliteBackend, SqliteConfig};
use saga_runtime::backend::{BackendError, BackendErrorKind};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

/// The text of an open that must fail.
async fn refused(path: &Path) -> String {
    match SqliteBackend::open(path).await {
        Ok(_) => panic!("`{}` opened", path.display()),
        Err(BackendError::Misconfigured(text)) => text,
        Err(other) => panic!("expected a refusal saying what to do, got {other:?}"),
    }
}

/// Opens `path` again, waiting for the connection of a store just dropped
/// to close (sqlx closes it on its own thread).
async fn reopened(path: &Path) -> SqliteBackend {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match SqliteBackend::open(path).await {
            Ok(store) => return store,
            Err(e) if tokio::time::Instant::now() > deadline => panic!("{e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Runs `sql` on the file at `path` with a plain connection.
async fn raw(path: &Path, sql: &str) {
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .connect()
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
}

/// The store holds the file's exclusive lock: a second opener (another
/// connection, as another process would be) is refused with a message
/// that says why, and gets the file once the first is gone.
#[tokio::test]
async fn a_second_opener_is_refused_while_the_store_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("saga.db");
    let first = SqliteBackend::open(&path).await.unwrap();
    let text = refused(&path).await;
    assert!(text.contains("open in another process"), "{text}");
    assert!(text.contains("one process"), "{text}");
    // The refused opener let go of nothing of the first's: another process
    // is refused too. (Closing any descriptor of the file would have
    // dropped the process's locks on it.)
    let other = std::process::Command::new(env!("CARGO_BIN_EXE_chaos-worker"))
        .env("BACKEND_URL", format!("sqlite://{}", path.display()))
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&other.stderr);
    assert!(said.contains("open in another process"), "{said}");
    drop(first);
    reopened(&path).await;
}

/// A file that is not a database, a database of another program's, one
/// written by a newer version of this library and one whose recorded
/// migration differs from this build's are each refused, untouched, with
/// what to do.
#[tokio::test]
async fn files_that_are_not_this_librarys_store_are_refused() {
    let dir = tempfile::tempdir().unwrap();

    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![0x5a; 8192]).unwrap();
    let text = refused(&garbage).await;
    assert!(text.contains("is not a SQLite database"), "{text}");
    assert_eq!(
        std::fs::read(&garbage).unwrap(),
        vec![0x5a; 8192],
        "untouched"
    );

    let foreign = dir.path().join("foreign.db");
    raw(&foreign, "CREATE TABLE invoices (id INTEGER PRIMARY KEY)").await;
    let before = std::fs::read(&foreign).unwrap();
    let text = refused(&foreign).await;
    assert!(text.contains("not this library's (invoices)"), "{text}");
    assert_eq!(
        std::fs::read(&foreign).unwrap(),
        before,
        "another program's database is left as it was (not even put in WAL mode)"
    );

    let newer = dir.path().join("newer.db");
    drop(SqliteBackend::open(&newer).await.unwrap());
    let store = reopened(&newer).await;
    drop(store);
    tokio::time::sleep(Duration::from_millis(200)).await;
    raw(
        &newer,
        "INSERT INTO saga_schema_history VALUES (99, 'future', 'x', 0)",
    )
    .await;
    let text = refused(&newer).await;
    assert!(text.contains("schema version 99"), "{text}");
    assert!(text.contains("upgrade this program"), "{text}");

    let edited = dir.path().join("edited.db");
    drop(SqliteBackend::open(&edited).await.unwrap());
    tokio::time::sleep(Duration::from_millis(200)).await;
    raw(
        &edited,
        "UPDATE saga_schema_history SET checksum = 'edited' WHERE version = 1",
    )
    .await;
    let text = refused(&edited).await;
    assert!(text.contains("checksum"), "{text}");
}

/// `sqlite://` URLs name a file; what is not one is refused with the form
/// expected, and `backend::connect` opens one.
#[tokio::test]
async fn sqlite_urls_name_a_file() {
    for (url, says) in [
        ("sqlite://", "names no file"),
        ("sqlite://saga.db?mode=ro", "SqliteConfig"),
        ("sqlite://:memory:", "memory backend"),
    ] {
        match SqliteBackend::connect(url).await {
            Err(BackendError::Misconfigured(text)) => {
                assert!(text.contains(says), "{url}: {text}");
                assert!(text.contains("sqlite://path/to/file.db"), "{url}: {text}");
            }
            other => panic!("{url}: {other:?}"),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("by-url.db").display());
    let store = saga_runtime::backend::connect(&url).await.unwrap();
    assert!(store.clone().limits().is_some());
    assert!(
        store.processes().is_none(),
        "no process managers on SQLite yet"
    );
    assert!(dir.path().join("by-url.db").exists());

    let config = SqliteConfig {
        create: false,
        ..SqliteConfig::default()
    };
    let missing = SqliteBackend::open_with(dir.path().join("typo.db"), config).await;
    assert!(
        matches!(&missing, Err(BackendError::Misconfigured(t)) if t.contains("no store at")),
        "{missing:?}"
    );
}

/// A `chaos-worker` process (eight workers) owns the file and runs 60
/// tasks; it is SIGKILLed mid-run, started again and SIGKILLed again,
/// five times, the last once every step ran (perhaps between a step and
/// its commit, or inside a group commit), and an engine in this process
/// finishes what is left: every task completes, from the file
/// alone, and no step whose completion was recorded ran again. What each
/// killed worker held comes back as soon as the next process opens the
/// file (the workers' visibility timeout is longer than the test). While
/// the worker holds the file, this process cannot open it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_sigkilled_five_times_leaves_every_task_to_resume_from_the_file() {
    use common::redis_server::TestRedis;
    use saga_runtime::prelude::*;
    use sagas_tests::chaos::{check_task, Chaos, ChaosConfig};
    use scenarios::rig::Worker;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chaos.db");
    let record = TestRedis::start_with_aof(false);
    let recorder = || async {
        redis::Client::open(record.url())
            .unwrap()
            .get_connection_manager()
            .await
            .unwrap()
    };
    let chaos = ChaosConfig {
        max_work: Duration::from_millis(30),
        failure_rate: 0.0,
        record: true,
        poison: None,
    };
    let engine = |workers: usize| {
        let path = path.clone();
        async move {
            let config = SqliteConfig {
                visibility_timeout: Duration::from_secs(1),
                ..SqliteConfig::default()
            };
            Engine::builder()
                .backend(SqliteBackend::open_with(&path, config).await.unwrap())
                .saga(Chaos::new(recorder().await, "in-process", chaos))
                .workers(workers)
                .build()
                .await
                .unwrap()
        }
    };
    let starter = engine(0).await;
    let mut ids = Vec::new();
    for n in 0..60u64 {
        ids.push((n, starter.start::<Chaos>(n).await.unwrap()));
    }
    starter.shutdown().await;
    drop(starter);
    reopened(&path).await;

    let spawn = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_chaos-worker"))
            .env("BACKEND_URL", format!("sqlite://{}", path.display()))
            .env("RECORD_URL", record.url())
            .env("FAILURE_RATE", "0")
            .env("MAX_WORK_MS", "200")
            .env("WORKERS", "8")
            // Longer than the whole test may take: what a killed worker
            // held must come back when the next process opens the file,
            // not when its visibility runs out.
            .env("VISIBILITY_MS", "120000")
            .env("RUST_LOG", "off")
            .spawn()
            .unwrap()
    };
    let mut redis = recorder().await;
    // Killed when dropped, so a failed assertion leaves no worker behind.
    let worker = Worker(spawn());
    let before = steps_ran_at_least(&mut redis, &ids, 30).await;
    assert!(
        SqliteBackend::open(&path).await.is_err(),
        "the worker holds the file"
    );
    drop(worker);
    assert!(before < 180, "killed mid-run ({before} of 180 steps ran)");

    // Killed again and again mid-run: with eight workers writing, each
    // kill is likely to land in a group commit, with several workers'
    // writes in one transaction.
    for at_least in [70, 110, 150, 180] {
        let worker = Worker(spawn());
        steps_ran_at_least(&mut redis, &ids, at_least).await;
        drop(worker);
    }

    let engine = reopened_engine(&path, engine).await;
    for (n, id) in &ids {
        let task = sagas_tests::double::finish(&engine, *id, Duration::from_secs(30)).await;
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
        assert_eq!(task.output_as::<u64>().unwrap().unwrap(), n + 3);
        let executions = Chaos::executions(&mut redis, *id).await.unwrap();
        check_task(&task, &executions).unwrap();
    }
}

/// `engine(4)` once the file is free (the killed worker's lock goes with
/// its process; the probe's with its connection).
async fn reopened_engine<F, Fut>(path: &Path, engine: F) -> saga_runtime::Engine
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = saga_runtime::Engine>,
{
    drop(reopened(path).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    engine(4).await
}

/// Waits until `least` of the tasks' steps ran (each at least once, as
/// recorded); how many did.
async fn steps_ran_at_least(
    redis: &mut redis::aio::ConnectionManager,
    ids: &[(u64, saga_runtime::TaskId)],
    least: usize,
) -> usize {
    use sagas_tests::chaos::Chaos;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let mut steps = 0;
        for (_, id) in ids {
            let executions = Chaos::executions(redis, *id).await.unwrap();
            let names: std::collections::BTreeSet<_> =
                executions.into_iter().map(|e| e.step).collect();
            steps += names.len();
        }
        if steps >= least {
            return steps;
        }
        assert!(tokio::time::Instant::now() < deadline, "{steps} steps ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs 3-step no-op tasks on `workers` workers of a fresh store; the
/// writes and the commits per step.
async fn per_step(workers: usize, tasks: u64) -> (f64, f64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use saga_runtime::prelude::*;
    use sagas::NoOp;

    let dir = tempfile::tempdir().unwrap();
    let store = SqliteBackend::open(dir.path().join("count.db"))
        .await
        .unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let engine = Engine::builder()
        .backend(store.clone())
        .saga(NoOp { done: done.clone() })
        .workers(0)
        .build()
        .await
        .unwrap();
    for n in 0..tasks {
        engine.start::<NoOp>(n).await.unwrap();
    }
    let (writes, commits) = (store.writes(), store.commits());
    let running = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.run_workers(workers).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while done.load(Ordering::Relaxed) < tasks {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tasks did not finish"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let steps = (3 * tasks) as f64;
    let writes = (store.writes() - writes) as f64 / steps;
    let commits = (store.commits() - commits) as f64 / steps;
    running.abort();
    engine.shutdown().await;
    println!("{workers} workers: {writes:.3} writes, {commits:.3} commits per step");
    (writes, commits)
}

/// What a step costs on SQLite, counted: writes per step of the 3-step
/// no-op saga, and commits (each one a WAL sync under `synchronous =
/// FULL`), which one worker cannot share. The benchmark
/// (`examples/bench_sqlite.rs`) reports the same figures; this fails when
/// they regress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_costs_two_writes_and_alone_two_commits() {
    let (writes, commits) = per_step(1, 100).await;
    // At least one: a step's completion is a write (a counter that counts
    // nothing must not pass for a cheap store).
    assert!(
        writes >= 1.0,
        "{writes:.3} writes per step: the count is broken"
    );
    assert!(writes <= 2.01, "{writes:.3} writes per step (was 2.00)");
    // One worker has nobody to share a commit with: each write is one.
    assert!(
        commits >= writes - 0.02 && commits <= writes,
        "{commits:.3} commits per step, {writes:.3} writes"
    );
}

/// Group commit: the writes of eight workers share their transactions, so
/// a step costs far less than one sync of the disk (each write on its own
/// would cost two a step, as one worker's do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_share_their_commits() {
    let (writes, commits) = per_step(8, 200).await;
    assert!(
        writes >= 1.0,
        "{writes:.3} writes per step: the count is broken"
    );
    assert!(writes <= 2.01, "{writes:.3} writes per step (was 2.00)");
    assert!(
        commits <= 1.0,
        "{commits:.3} commits per step for {writes:.3} writes: group commit does not group"
    );
}

/// A process manager on the SQLite store (which has none yet) is refused
/// when the engine is built, with the stores that have them.
#[tokio::test]
async fn a_process_manager_on_sqlite_is_refused_at_build() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteBackend::open(dir.path().join("pm.db")).await.unwrap();
    let built = saga_runtime::Engine::builder()
        .backend(store)
        .process_manager(sagas_tests::crashy::Crashy { poison: None })
        .build()
        .await;
    match built {
        Err(saga_runtime::Error::Config(why)) => {
            assert!(why.contains("the SQLite store has none yet"), "{why}");
            assert!(why.contains("PostgreSQL or Redis"), "{why}");
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("built"),
    }
}

/// A small file system of its own (tmpfs) the test can fill, grow and
/// make read-only, unmounted when dropped. Mounting needs root (as CI
/// runs): elsewhere the test says so and passes, unless `CI` is set.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            assert!(
                std::env::var_os("CI").is_none(),
                "cannot mount a tmpfs (the test needs root)"
            );
            eprintln!("skipped: cannot mount a tmpfs (the test needs root)");
            return None;
        }
        Some(SmallDisk { dir })
    }

    /// Remounts with `options`, waiting (up to 5 s) for files still open
    /// for writing to close (a store's connection closes on a thread of
    /// its own once dropped), which a read-only remount waits for.
    fn remount(&self, options: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let done = std::process::Command::new("mount")
                .args(["-o", &format!("remount,{options}")])
                .arg(self.dir.path())
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap();
            if done.success() {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "remount {options}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// A saga whose input takes room on the disk.
struct Blob;

#[saga_runtime::saga(name = "blob")]
impl Blob {
    #[saga_step(1)]
    async fn keep(&self, blob: String) -> Result<usize, saga_runtime::StepError> {
        Ok(blob.len())
    }
}

/// The disk fills under running workers: the start that found it full
/// fails with a transient error that says so, and nothing of it is kept;
/// once there is room again the same store goes on, without a restart.
/// Every task whose start returned completes, and the file is intact. On
/// a file system mounted read-only, the store is refused at open with a
/// message that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_or_read_only_disk_fails_writes_clearly_and_corrupts_nothing() {
    use saga_runtime::prelude::*;

    let Some(disk) = SmallDisk::mount("2m") else {
        return;
    };
    let path = disk.path("full.db");
    let store = SqliteBackend::open(&path).await.unwrap();
    // A start tries twice, not for 25 s, before it says what failed.
    let engine = Engine::builder()
        .backend(store.clone())
        .saga(Blob)
        .workers(2)
        .client_retry(saga_runtime::policy::RetryPolicy {
            max_retries: 1,
            ..saga_runtime::policy::RetryPolicy::default()
        })
        .build()
        .await
        .unwrap();
    let blob = "x".repeat(16 * 1024);
    // Four starts at a time, so that the disk fills under groups of
    // several writes: each start that returned is kept, and none that
    // failed is.
    let mut accepted = Vec::new();
    let full = loop {
        assert!(accepted.len() < 1000, "2 MiB never filled");
        let starts = (0..4).map(|_| engine.start::<Blob>(blob.clone()));
        let mut failed = None;
        for started in futures::future::join_all(starts).await {
            match started {
                Ok(id) => accepted.push(id),
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            break e;
        }
    };
    let transient = |e: &saga_runtime::Error| {
        matches!(e, saga_runtime::Error::Unavailable { source, .. }
            if source.kind() == BackendErrorKind::Unavailable)
    };
    assert!(transient(&full), "{full}");
    assert!(full.to_string().contains("disk is full"), "{full}");

    disk.remount("size=64m");
    accepted.push(engine.start::<Blob>(blob.clone()).await.unwrap());

    for id in &accepted {
        let task = sagas_tests::double::finish(&engine, *id, Duration::from_secs(60)).await;
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
    }
    engine.shutdown().await;
    drop(engine);
    drop(store);
    drop(reopened(&path).await);

    // A file system made read-only (a full disk remounted, a volume
    // mounted so): the store is refused at open, saying why.
    disk.remount("ro");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let read_only = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the file stayed locked"
        );
        match SqliteBackend::open(&path).await {
            Err(e) if e.to_string().contains("locked") => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => break e.to_string(),
            Ok(_) => panic!("opened on a read-only file system"),
        }
    };
    println!("{read_only}");
    assert!(read_only.contains("read-only"), "{read_only}");
    disk.remount("rw");

    // Every task is there once, and nothing else: the failed starts left
    // nothing behind.
    let store = reopened(&path).await;
    let engine = Engine::builder()
        .backend(store)
        .saga(Blob)
        .workers(0)
        .build()
        .await
        .unwrap();
    let kept = engine.tasks_of("blob").await.unwrap();
    assert_eq!(kept.len(), accepted.len());
    engine.shutdown().await;
    drop(engine);
    // The file reads back whole (once the store's connection closed).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let check = loop {
        let checked = async {
            let mut raw = SqliteConnectOptions::new()
                .filename(&path)
                .connect()
                .await?;
            let check: String = sqlx::query_scalar("PRAGMA integrity_check")
                .fetch_one(&mut raw)
                .await?;
            raw.close().await?;
            Ok::<_, sqlx::Error>(check)
        };
        match checked.await {
            Ok(check) => break check,
            Err(e) if tokio::time::Instant::now() > deadline => panic!("{e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    assert_eq!(check, "ok");
}

/// A delivery is named by its receipt, not by its delivery count: a
/// message handed back with its delivery not counted (the worker answered)
/// and taken again has the count it had, and the first delivery's late
/// settle must not take the second one's message off the queue.
#[tokio::test]
async fn a_late_settle_of_an_earlier_delivery_leaves_the_message() {
    use saga_runtime::backend::{Handling, Interest, WorkQueue};

    let dir = tempfile::tempdir().unwrap();
    let store = SqliteBackend::open(dir.path().join("receipts.db"))
        .await
        .unwrap();
    store.enqueue_raw(b"not a message").await.unwrap();
    let wait = Duration::from_secs(1);
    let first = store
        .receive("a", Interest::ALL, wait)
        .await
        .unwrap()
        .unwrap();
    store
        .settle_delivery(&first, Handling::Release(Duration::ZERO))
        .await
        .unwrap();
    let second = store
        .receive("b", Interest::ALL, wait)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.deliveries, second.deliveries, "the same count");
    store.settle_delivery(&first, Handling::Ack).await.unwrap();
    let depth = || async { store.queue_stats().await.unwrap().unwrap().sagas.depth };
    assert_eq!(depth().await, 1, "the late settle took the message");
    store.settle_delivery(&second, Handling::Ack).await.unwrap();
    assert_eq!(depth().await, 0);
}

/// A file of the first schema (before receipts) is migrated when a newer
/// build opens it, and its queued work goes on.
#[tokio::test]
async fn a_file_of_an_older_schema_is_migrated_at_open() {
    use saga_runtime::backend::sqlite::SCHEMA_VERSION;
    use saga_runtime::backend::{Interest, WorkQueue};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let store = SqliteBackend::open(&path).await.unwrap();
    store
        .enqueue_raw(b"queued before the upgrade")
        .await
        .unwrap();
    drop(store);
    drop(reopened(&path).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // What version 1 wrote: no receipts, and a history that ends at 1.
    raw(
        &path,
        "ALTER TABLE queue DROP COLUMN receipt; \
         DELETE FROM saga_schema_history WHERE version > 1",
    )
    .await;
    let store = reopened(&path).await;
    let taken = store
        .receive("a", Interest::ALL, Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.raw, "queued before the upgrade");
    store.ack(&taken).await.unwrap();
    drop(store);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut conn = SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .unwrap();
    let newest: i32 = sqlx::query_scalar("SELECT MAX(version) FROM saga_schema_history")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(newest, SCHEMA_VERSION);
    conn.close().await.unwrap();
}

/// The engine scenarios (`tests/scenarios/`) that engines in one process
/// can run, on SQLite as on the server stores: two engines in this process
/// stand in for two machines sharing the file. Those that need a second
/// process on the store, a server to crash or connections to cut are
/// generated for the server stores only (`tests/engine_scenarios.rs`).
mod on_sqlite {
    use crate::common::stores::TestSqlite;

    engine_scenarios!(@stores scenarios [sqlite: TestSqlite] [
        faults::hung_steps_time_out_and_every_task_still_finishes,
        faults::a_retry_backoff_holds_neither_a_worker_nor_the_lock,
        faults::a_handed_back_message_comes_back_promptly,
        faults::a_cancellation_cuts_a_retrys_wait_short_but_not_a_compensations,
        leases::a_step_longer_than_the_lock_ttl_keeps_its_lease_and_runs_once,
        leases::cancellation_requested_in_one_process_reaches_a_step_running_in_another,
        breakers::a_shared_breaker_opens_and_probes_across_engines_and_parked_tasks_finish,
        breakers::a_long_outage_behind_a_shared_waiting_breaker_compensates_nothing,
        limits::a_concurrency_of_three_holds_across_two_engines_and_is_used,
        limits::a_rate_of_fifty_a_second_starts_250_plus_the_burst_in_five_seconds,
        limits::a_rate_holds_when_the_demand_meets_engines_just_started,
        limits::a_long_wait_is_audited_once,
        limits::a_parked_task_is_cancelled_at_once_from_either_engine,
    ]);
}

/// What a read returns is on the disk: a process that saw a task finish
/// (`wait`) and exits at once, without shutting its engine down (as the
/// README's first command did), finds the task finished when it starts
/// again. The store's one connection would otherwise show a read the
/// writes of a group whose commit is still under way, which the exit
/// takes back. Ten rounds, each a runtime dropped the moment `wait`
/// returned.
#[test]
fn a_finished_task_read_back_is_on_the_disk_when_the_process_exits_at_once() {
    use saga_runtime::backend::TaskStore;
    use saga_runtime::prelude::*;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("exit.db");
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    for round in 0..10 {
        let exiting = runtime();
        let id = exiting.block_on(async {
            let engine = Engine::builder()
                .backend(reopened(&path).await)
                .saga(Blob)
                .workers(2)
                .build()
                .await
                .unwrap();
            let id = engine.start::<Blob>("x".repeat(100)).await.unwrap();
            let task = engine.wait(id).await.unwrap();
            assert_eq!(task.status, TaskStatus::Completed);
            id
        });
        // As the process exits: nothing of it runs any more.
        exiting.shutdown_background();
        runtime().block_on(async {
            let store = reopened(&path).await;
            let task = store.load_task(id).await.unwrap().unwrap();
            assert_eq!(
                task.status,
                TaskStatus::Completed,
                "round {round}: the status `wait` returned was not on the disk"
            );
        });
    }
}
