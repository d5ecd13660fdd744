//! What only the SQLite store has: one process per file (a second opener
//! is refused), files that are not this library's store refused at open
//! with a message saying what to do, and a worker process SIGKILLed
//! mid-run whose tasks all resume from the file when it starts again. The
//! store's operations are held to the protocol by the conformance suite
//! (`tests/conformance.rs`, module `sqlite`).

mod common;

use std::path::Path;
use std::time::Duration;

use saga_runtime::backend::sqlite::{SqliteBackend, SqliteConfig};
use saga_runtime::backend::BackendError;
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

/// A `chaos-worker` process owns the file and runs 60 tasks; it is
/// SIGKILLed mid-run, started again and SIGKILLed again once every step
/// ran (perhaps between a step and its commit), and an engine in this
/// process finishes what is left: every task completes, from the file
/// alone, and no step whose completion was recorded ran again. While the
/// worker holds the file, this process cannot open it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_sigkilled_twice_leaves_every_task_to_resume_from_the_file() {
    use common::redis_server::TestRedis;
    use saga_runtime::prelude::*;
    use sagas_tests::chaos::{check_task, Chaos, ChaosConfig};

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
            .env("MAX_WORK_MS", "30")
            .env("WORKERS", "4")
            .env("RUST_LOG", "off")
            .spawn()
            .unwrap()
    };
    let mut redis = recorder().await;
    let mut worker = spawn();
    let before = steps_ran_at_least(&mut redis, &ids, 40).await;
    assert!(
        SqliteBackend::open(&path).await.is_err(),
        "the worker holds the file"
    );
    worker.kill().unwrap();
    worker.wait().unwrap();
    assert!(before < 180, "killed mid-run ({before} of 180 steps ran)");

    let mut worker = spawn();
    steps_ran_at_least(&mut redis, &ids, 180).await;
    worker.kill().unwrap();
    worker.wait().unwrap();

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

/// What a step costs on SQLite, counted: write transactions committed per
/// step of the 3-step no-op saga (each one a WAL sync under `synchronous =
/// FULL`). The benchmark (`examples/bench_sqlite.rs`) reports the same
/// figure; this fails when it regresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_costs_two_commits() {
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
    let tasks = 100;
    for n in 0..tasks {
        engine.start::<NoOp>(n).await.unwrap();
    }
    let before = store.commits();
    let running = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.run_workers(1).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while done.load(Ordering::Relaxed) < tasks {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tasks did not finish"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let per_step = (store.commits() - before) as f64 / (3 * tasks) as f64;
    running.abort();
    engine.shutdown().await;
    println!("{per_step:.3} commits per step");
    // At least one: a step's completion is a write (a counter that counts
    // nothing must not pass for a cheap store).
    assert!(
        per_step >= 1.0,
        "{per_step:.3} commits per step: the count is broken"
    );
    assert!(
        per_step <= 2.01,
        "{per_step:.3} commits per step (was 2.00)"
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
