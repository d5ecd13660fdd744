//! `sagactl` against a private redis-server (and PostgreSQL) that an
//! engine wrote to: list, show, resolve, cancel, requeue (one and by
//! filter, with who and why audited), purge.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The workspace's private redis-server helper; this test uses part of it.
#[allow(dead_code)]
#[path = "../../testsuite/tests/common/ops_sagas.rs"]
mod ops_sagas;
#[allow(dead_code)]
#[path = "../../testsuite/tests/common/postgres_server.rs"]
mod postgres_server;
#[allow(dead_code)]
#[path = "../../testsuite/tests/common/redis_cluster.rs"]
mod redis_cluster;
#[allow(dead_code)]
#[path = "../../testsuite/tests/common/redis_server.rs"]
mod redis_server;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ops_sagas::{Gate, Stuck};
use redis_server::TestRedis;
use saga_runtime::prelude::*;
use saga_runtime::DeadLetterFilter;

/// Runs `sagactl` on `redis`: (success, stdout, stderr).
fn sagactl(redis: &TestRedis, args: &[&str]) -> (bool, String, String) {
    sagactl_at(&redis.url(), args)
}

/// Runs `sagactl` on the deployment at `url`.
fn sagactl_at(url: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sagactl"))
        .arg("--redis")
        .arg(url)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_actions_from_the_command_line() {
    let redis = TestRedis::start();
    let open = Arc::new(AtomicBool::new(false));
    let engine = Engine::builder()
        .saga(Stuck)
        .saga(Gate { open: open.clone() })
        .backend(redis.backend().await)
        .build()
        .await
        .unwrap();
    let stuck = engine.start::<Stuck>(1).await.unwrap();
    let gated = [
        engine.start::<Gate>(1).await.unwrap(),
        engine.start::<Gate>(2).await.unwrap(),
    ];
    for id in gated.iter().chain([&stuck]) {
        engine.wait(*id).await.unwrap();
    }

    let (ok, out, err) = sagactl(
        &redis,
        &["list", "--saga", "stuck", "--status", "CompensationFailed"],
    );
    assert!(ok, "{err}");
    assert!(out.contains(&stuck.to_string()), "{out}");
    let (ok, _, err) = sagactl(&redis, &["list", "--saga", "stuck", "--status", "Stuk"]);
    assert!(!ok);
    assert!(err.contains("CompensationFailed"), "the valid names: {err}");

    let (ok, out, _) = sagactl(&redis, &["show", &stuck.to_string()]);
    assert!(ok);
    assert!(out.contains("timeline"), "{out}");
    assert!(out.contains("the warehouse API refuses"), "{out}");

    let resolve = [
        "resolve",
        &stuck.to_string(),
        "--by",
        "ana",
        "--note",
        "released by hand",
    ];
    let (ok, out, err) = sagactl(&redis, &resolve);
    assert!(ok, "{err}");
    assert!(out.contains("Resolved"), "{out}");
    assert_eq!(
        engine.task(stuck).await.unwrap().unwrap().status,
        TaskStatus::Resolved
    );
    let (ok, _, err) = sagactl(&redis, &resolve);
    assert!(!ok, "a resolved task is not resolved twice");
    assert!(err.contains("Resolved"), "{err}");

    let (ok, out, _) = sagactl(&redis, &["--json", "dead-letters"]);
    assert!(ok);
    let letters: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(letters["letters"].as_array().unwrap().len(), 2, "{out}");

    let who = ["--by", "ana", "--note", "gate fixed"];
    let (ok, _, err) = sagactl(&redis, &[&["requeue"][..], &who].concat());
    assert!(!ok);
    assert!(err.contains("--saga"), "{err}");
    let code = Command::new(env!("CARGO_BIN_EXE_sagactl"))
        .args(["--redis", "redis://127.0.0.1:1", "requeue"])
        .args(who)
        .output()
        .unwrap()
        .status
        .code();
    assert_eq!(code, Some(2), "a usage mistake, told before connecting");
    open.store(true, Ordering::SeqCst);
    let one = letters["letters"][0]["id"].as_str().unwrap();
    let (ok, _, err) = sagactl(&redis, &[&["requeue", one][..], &who].concat());
    assert!(ok, "{err}");
    let (ok, out, err) = sagactl(&redis, &[&["requeue", "--saga", "gate"][..], &who].concat());
    assert!(ok, "{err}");
    assert!(out.starts_with("requeued 1 of 1"), "{out}");
    for id in gated {
        assert_eq!(engine.wait(id).await.unwrap().status, TaskStatus::Completed);
    }

    // Purge needs filters and a confirmation.
    open.store(false, Ordering::SeqCst);
    let parked = engine.start::<Gate>(3).await.unwrap();
    engine.wait(parked).await.unwrap();
    let purge = [
        "purge",
        "--saga",
        "gate",
        "--by",
        "ana",
        "--note",
        "withdrawn",
    ];
    let (ok, _, err) = sagactl(&redis, &purge);
    assert!(!ok);
    assert!(err.contains("--yes"), "{err}");
    let (ok, out, err) = sagactl(&redis, &[&purge[..], &["--yes"]].concat());
    assert!(ok, "{err}");
    assert!(out.starts_with("discarded 1"), "{out}");
    let left = engine.dead_letters(DeadLetterFilter::new()).await.unwrap();
    assert!(left.letters.is_empty(), "{left:?}");

    // A prefix with no deployment is an error, and leaves no key behind.
    let keys = redis.keys().len();
    let (ok, _, err) = sagactl(&redis, &["--prefix", "sgaa", "dead-letters"]);
    assert!(!ok);
    assert!(err.contains("no deployment under prefix `sgaa`"), "{err}");
    assert_eq!(redis.keys().len(), keys);
    engine.shutdown().await;
}

/// On a Redis Cluster, through its URL (`redis+cluster://...`): the tool
/// finds the deployment's layout and the tasks on every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_actions_on_a_cluster() {
    let cluster = redis_cluster::TestCluster::start_with(3, 0);
    let backend = saga_runtime::backend::redis::RedisBackend::connect(&cluster.url())
        .await
        .unwrap();
    let engine = Engine::builder()
        .saga(Stuck)
        .backend(backend)
        .build()
        .await
        .unwrap();
    let mut stuck = Vec::new();
    for n in 0..6 {
        stuck.push(engine.start::<Stuck>(n).await.unwrap());
    }
    for id in &stuck {
        engine.wait(*id).await.unwrap();
    }
    let (ok, out, err) = sagactl_at(
        &cluster.url(),
        &["list", "--saga", "stuck", "--status", "CompensationFailed"],
    );
    assert!(ok, "{err}");
    for id in &stuck {
        assert!(out.contains(&id.to_string()), "{id} in {out}");
    }
    let (ok, out, err) = sagactl_at(&cluster.url(), &["show", &stuck[0].to_string()]);
    assert!(ok, "{err}");
    assert!(out.contains("the warehouse API refuses"), "{out}");
    engine.shutdown().await;
}

/// Holds its task in step 2 until it is cancelled, unless its input is 0.
struct Hold;

#[cancellable]
#[saga(name = "hold")]
impl Hold {
    #[saga_step(1)]
    async fn book(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[compensate(book)]
    async fn unbook(&self, _n: u32) -> Result<(), StepError> {
        Ok(())
    }

    #[saga_step(2, timeout_ms = 600_000)]
    async fn hold(&self, n: u32, ctx: &StepContext) -> Result<u32, StepError> {
        if n == 0 {
            return Ok(0);
        }
        tokio::select! {
            _ = ctx.cancelled() => Err(StepError::permanent("cancelled while holding")),
            _ = tokio::time::sleep(Duration::from_secs(600)) => Ok(n),
        }
    }
}

/// Stores a file and a large manifest, then fails to charge, and cannot
/// delete the file again: ends `CompensationFailed` with outputs an
/// operator must clean up by hand.
struct Upload;

#[saga(name = "upload")]
impl Upload {
    #[saga_step(1)]
    #[compensation_retry_policy(max_retries = 0, backoff = constant, base_delay_ms = 0)]
    async fn store(&self, n: u32) -> Result<String, StepError> {
        Ok(format!("s3://zips/order-{n}.zip"))
    }

    #[compensate(store)]
    async fn unstore(&self, _key: String) -> Result<(), StepError> {
        Err(StepError::permanent("S3 refuses the delete"))
    }

    #[saga_step(2)]
    async fn manifest(&self, key: String) -> Result<String, StepError> {
        Ok(format!("{key}:{}", "m".repeat(1000)))
    }

    #[saga_step(3)]
    async fn charge(&self, _manifest: String) -> Result<u32, StepError> {
        Err(StepError::permanent("card declined"))
    }
}

/// Runs `sagactl` at `url` with `args`: (exit code, stdout, stderr).
fn sagactl_code(url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sagactl"))
        .arg("--redis")
        .arg(url)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits until the task runs its second step.
async fn holding(engine: &Engine, id: TaskId) {
    for _ in 0..500 {
        let task = engine.task(id).await.unwrap().unwrap();
        if task.status == TaskStatus::Running
            && task
                .steps
                .iter()
                .any(|s| s.name == "hold" && s.attempt_count > 0)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("task {id} never reached its second step");
}

/// `sagactl cancel`: from an engine that does not run the saga, with who
/// and why recorded, each answer printed as its machine value, and the
/// deployment named on stderr first. Run on Redis and on PostgreSQL, whose
/// cancellations are written by different code.
async fn cancel_from_the_command_line(url: &str, backend: Arc<dyn saga_runtime::backend::Backend>) {
    let engine = Engine::builder()
        .saga(Hold)
        .saga(Stuck)
        .backend_arc(backend)
        .build()
        .await
        .unwrap();
    let held = engine.start::<Hold>(7).await.unwrap();
    let done = engine.start::<Hold>(0).await.unwrap();
    let stuck = engine.start::<Stuck>(1).await.unwrap();
    engine.wait(done).await.unwrap();
    engine.wait(stuck).await.unwrap();
    holding(&engine, held).await;

    let cancel = |id: TaskId| {
        let id = id.to_string();
        let args = ["cancel", &id, "--by", "ana", "--note", "customer withdrew"];
        sagactl_code(url, &args)
    };
    let (code, out, err) = cancel(held);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.starts_with("Cancelled"), "{out}");
    assert!(
        err.contains("cancel on ") && err.contains("saga`)"),
        "the deployment, first: {err}"
    );
    let task = engine.wait(held).await.unwrap();
    assert_eq!(task.status, TaskStatus::Cancelled);
    let asked = task.audit_log.iter().find_map(|e| {
        e.details
            .as_deref()
            .filter(|d| d.contains("customer withdrew"))
    });
    assert!(
        asked.is_some_and(|d| d.contains("ana")),
        "who and why: {:?}",
        task.audit_log
    );

    let json = |id: TaskId| {
        let id = id.to_string();
        let args = ["--json", "cancel", &id, "--by", "ana", "--note", "again"];
        let (code, out, err) = sagactl_code(url, &args);
        let answer: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
        (code, answer)
    };
    let (code, answer) = json(held);
    assert_eq!(
        (code, answer["result"].as_str()),
        (Some(0), Some("AlreadyCancelled")),
        "{answer}"
    );
    let (code, answer) = json(done);
    assert_eq!(
        (code, answer["result"].as_str()),
        (Some(0), Some("AlreadyCompleted")),
        "{answer}"
    );
    let (code, answer) = json(stuck);
    assert_eq!(answer["result"], "NotCancellable", "{answer}");
    assert_eq!(answer["status"], "CompensationFailed", "{answer}");
    assert_eq!(code, Some(0));
    let (code, out, _) = cancel(TaskId::new());
    assert_eq!(code, Some(1), "a task that does not exist: {out}");
    assert!(out.starts_with("NotFound"), "{out}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_on_redis() {
    let redis = TestRedis::start();
    cancel_from_the_command_line(&redis.url(), Arc::new(redis.backend().await)).await;
}

/// An engine's backend on `pg`, polling often (the scenarios wait on it).
async fn postgres_backend(
    pg: &postgres_server::TestPostgres,
) -> Arc<dyn saga_runtime::backend::Backend> {
    let config = saga_runtime::backend::postgres::PostgresConfig {
        poll_interval: Duration::from_millis(50),
        ..Default::default()
    };
    Arc::new(
        saga_runtime::backend::postgres::PostgresBackend::connect_url(&pg.url(), config)
            .await
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_on_postgres() {
    let pg = postgres_server::TestPostgres::start();
    // A deploy job's migration, before any engine: creates the schema,
    // then finds it current.
    let now = saga_runtime::backend::postgres::SCHEMA_VERSION;
    let (code, out, err) = sagactl_code(&pg.url(), &["migrate"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out.trim(),
        format!("schema `saga` created at version {now}")
    );
    let (code, out, err) = sagactl_code(&pg.url(), &["migrate"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out.trim(),
        format!("schema `saga` is at version {now} already")
    );
    cancel_from_the_command_line(&pg.url(), postgres_backend(&pg).await).await;
}

/// Runs `sagactl --redis url args` with none of its variables but `env`
/// set: (exit code, stdout, stderr).
fn sagactl_env(url: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sagactl"))
        .arg("--redis")
        .arg(url)
        .args(args)
        .env_remove("SAGA_URL")
        .env_remove("SAGACTL_OPERATOR")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `(by, note)` of each `Requeued` entry of `task`'s audit log.
fn requeued_by(task: &TaskInstance) -> Vec<(String, String)> {
    task.audit_log
        .iter()
        .filter(|e| e.action == saga_runtime::AuditAction::Requeued)
        .map(|e| {
            let details: serde_json::Value =
                serde_json::from_str(e.details.as_deref().unwrap_or("null")).unwrap();
            (
                details["by"].as_str().unwrap_or("").to_owned(),
                details["note"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// `sagactl requeue`, one letter and by filter: refused without who and
/// why (as every action that changes a task is), and each requeued task's
/// audit log records them (`--by`, or `SAGACTL_OPERATOR`, and `--note`).
/// Run on Redis and on PostgreSQL, whose requeues are written by
/// different code.
async fn requeue_from_the_command_line(
    url: &str,
    backend: Arc<dyn saga_runtime::backend::Backend>,
) {
    let open = Arc::new(AtomicBool::new(false));
    let engine = Engine::builder()
        .saga(Gate { open: open.clone() })
        .backend_arc(backend)
        .build()
        .await
        .unwrap();
    let mut gated = Vec::new();
    for n in 0..3 {
        let id = engine.start::<Gate>(n).await.unwrap();
        assert_eq!(
            engine.wait(id).await.unwrap().status,
            TaskStatus::DeadLettered
        );
        gated.push(id);
    }
    let letters = engine.dead_letters(DeadLetterFilter::new()).await.unwrap();
    let first = letters
        .letters
        .iter()
        .find(|l| l.task_id == Some(gated[0]))
        .unwrap()
        .id
        .clone();

    // Without who and why: a usage mistake, and nothing requeued.
    for args in [vec!["requeue", &first], vec!["requeue", "--saga", "gate"]] {
        let (code, out, err) = sagactl_env(url, &args, &[]);
        assert_eq!(code, Some(2), "{out}{err}");
        assert!(err.contains("--by") && err.contains("--note"), "{err}");
    }
    let (code, out, err) = sagactl_env(url, &["requeue", &first, "--note", "x"], &[]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("--by"), "{err}");
    let left = engine.dead_letters(DeadLetterFilter::new()).await.unwrap();
    assert_eq!(left.letters.len(), 3, "{left:?}");

    open.store(true, Ordering::SeqCst);
    let one = ["requeue", &first, "--by", "ana", "--note", "gate fixed"];
    let (code, out, err) = sagactl_env(url, &one, &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(out.trim(), format!("requeued {first}"));
    assert!(err.contains("requeue on "), "the deployment, first: {err}");
    let task = engine.wait(gated[0]).await.unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(
        requeued_by(&task),
        [("ana".to_owned(), "gate fixed".to_owned())],
        "{:#?}",
        task.audit_log
    );

    let bulk = ["requeue", "--saga", "gate", "--note", "all gates open"];
    let (code, out, err) = sagactl_env(url, &bulk, &[("SAGACTL_OPERATOR", "bo")]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.starts_with("requeued 2 of 2"), "{out}");
    for id in &gated[1..] {
        let task = engine.wait(*id).await.unwrap();
        assert_eq!(task.status, TaskStatus::Completed);
        assert_eq!(
            requeued_by(&task),
            [("bo".to_owned(), "all gates open".to_owned())],
            "{:#?}",
            task.audit_log
        );
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_on_redis() {
    let redis = TestRedis::start();
    requeue_from_the_command_line(&redis.url(), Arc::new(redis.backend().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_on_postgres() {
    let pg = postgres_server::TestPostgres::start();
    requeue_from_the_command_line(&pg.url(), postgres_backend(&pg).await).await;
}

/// `show` (text) prints each completed step's output next to the errors,
/// capped, so that the operator of a `CompensationFailed` task sees what
/// to clean up by hand; `--json` has all of it. `resolve` prints the
/// whole record: the timeline from the task's start, not only the two
/// entries it added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_prints_outputs_and_resolve_the_whole_record() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .saga(Upload)
        .backend(redis.backend().await)
        .build()
        .await
        .unwrap();
    let id = engine.start::<Upload>(7).await.unwrap();
    assert_eq!(
        engine.wait(id).await.unwrap().status,
        TaskStatus::CompensationFailed
    );
    let (ok, out, err) = sagactl(&redis, &["show", &id.to_string()]);
    assert!(ok, "{err}");
    let store = out
        .lines()
        .position(|l| l.trim_start().starts_with("1 store"))
        .unwrap();
    assert!(
        out.lines()
            .nth(store + 1)
            .unwrap()
            .contains(r#"output: "s3://zips/order-7.zip""#),
        "the output under its step: {out}"
    );
    assert!(out.contains("S3 refuses the delete"), "{out}");
    let manifest = out
        .lines()
        .find(|l| l.contains("output: \"s3://zips/order-7.zip:m"))
        .unwrap();
    assert!(
        manifest.ends_with("… (1024 bytes; --json for all)") && manifest.len() < 300,
        "capped: {manifest}"
    );
    let (ok, out, _) = sagactl(&redis, &["--json", "show", &id.to_string()]);
    assert!(ok);
    let task: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(task["steps"][1]["output"].as_str().unwrap().len(), 1022);

    let (ok, out, err) = sagactl(
        &redis,
        &[
            "resolve",
            &id.to_string(),
            "--by",
            "ana",
            "--note",
            "deleted the zip by hand",
        ],
    );
    assert!(ok, "{err}");
    let stored = engine.task(id).await.unwrap().unwrap().audit_log.len();
    let timeline = out.split("\ntimeline\n").nth(1).unwrap();
    assert_eq!(
        timeline.lines().count(),
        stored,
        "the whole audit log: {out}"
    );
    assert!(stored > 4, "{stored}");
    engine.shutdown().await;
}

/// A task id that is not one (the 8 characters a console shows): the
/// runtime's own words about what a task id is, as a usage error, before
/// connecting, with no parser's jargon around them.
#[test]
fn a_short_task_id_is_explained() {
    let (code, out, err) = sagactl_code("redis://127.0.0.1:1", &["show", "4b6c1a2e"]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("full UUID"), "{err}");
    assert!(
        !err.contains("invalid value") && !err.contains("<TASK>"),
        "{err}"
    );
    assert!(
        !err.contains("127.0.0.1:1"),
        "told before connecting: {err}"
    );
}

/// `record-layout` tells which record layout a deployment writes, and
/// switches a deployment that ran before layout 2 (its key layout
/// recorded, no record layout) once asked; a fresh one writes layout 2.
#[test]
fn record_layout_is_shown_and_switched() {
    let redis = TestRedis::start();
    let _: () = redis::cmd("SET")
        .arg("saga:layout")
        .arg("1")
        .query(&mut redis.conn())
        .unwrap();
    let (ok, out, err) = sagactl(&redis, &["record-layout"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "1");
    let (ok, out, err) = sagactl(&redis, &["record-layout", "--write-steps-apart"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "2");
    assert!(
        err.contains("record-layout --write-steps-apart on"),
        "{err}"
    );
    let (_, out, _) = sagactl(&redis, &["record-layout"]);
    assert_eq!(out.trim(), "2", "the switch stays");
}
