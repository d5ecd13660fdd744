//! The engine's operator API: an operator's cancellation
//! (`Engine::cancel_by_operator`) records who asked and why, from the
//! deployment or from an engine that runs no saga (what `sagactl`
//! builds); every operator action answers the task with its whole audit
//! log; process managers' instances are counted without reading them.
//! On the in-memory backend, a real redis-server and a real PostgreSQL.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::ops_sagas::{Hold, Remind, Reminders, Stuck};
use common::postgres_server::TestPostgres;
use common::redis_server::TestRedis;
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::prelude::*;
use saga_runtime::{AuditAction, Error, Intervention};
use serde_json::Value;

/// Not `#[cancellable]`: runs until `open` is set.
struct Plain {
    open: Arc<AtomicBool>,
}

#[saga(name = "plain")]
impl Plain {
    #[saga_step(1)]
    async fn wait(&self, n: u32) -> Result<u32, StepError> {
        while !self.open.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(n)
    }
}

async fn running(engine: &Engine, id: TaskId) {
    common::until("the task runs", async || {
        engine.task(id).await.unwrap().unwrap().status == TaskStatus::Running
    })
    .await;
}

/// The entries that record an operator's cancellation: `(by, note)`.
fn asked(task: &TaskInstance) -> Vec<(String, String)> {
    task.audit_log
        .iter()
        .filter(|e| e.action == AuditAction::CancellationRequested)
        .filter_map(|e| e.details.as_deref())
        .map(|d| {
            let d: Value = serde_json::from_str(d).unwrap();
            (
                d["by"].as_str().unwrap().into(),
                d["note"].as_str().unwrap().into(),
            )
        })
        .collect()
}

/// `deployment` runs the sagas; `client` (the same engine, or one that
/// runs none on the same store) cancels. `forget` removes from a task's
/// stored record whether it may be cancelled, as a record written before
/// that was kept.
async fn cancelling(
    deployment: &Engine,
    client: &Engine,
    open: &AtomicBool,
    forget: impl AsyncFn(TaskId),
) {
    let id = deployment.start::<Hold>(1).await.unwrap();
    running(deployment, id).await;
    let ana = Intervention::new("ana", "the customer withdrew the order");
    let result = client.cancel_by_operator(id, ana.clone()).await.unwrap();
    assert_eq!(result, CancelResult::Cancelled);
    // A second request changes nothing and records nothing.
    let again = client
        .cancel_by_operator(id, Intervention::new("bo", "again"))
        .await
        .unwrap();
    assert_eq!(again, CancelResult::AlreadyCancelled);
    let task = deployment.wait(id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Cancelled);
    assert_eq!(
        asked(&task),
        [("ana".to_owned(), ana.note.clone())],
        "{:#?}",
        task.audit_log
    );
    // Recorded before the worker acted on it.
    let first = |action: &AuditAction| task.audit_log.iter().position(|e| &e.action == action);
    let applied = task
        .audit_log
        .iter()
        .position(|e| e.action == AuditAction::CancellationRequested && e.details.is_none());
    assert!(
        first(&AuditAction::CancellationRequested) < applied,
        "{:#?}",
        task.audit_log
    );

    // Not cancellable: refused (and nothing recorded) by any engine.
    let plain = deployment.start::<Plain>(2).await.unwrap();
    running(deployment, plain).await;
    let refused = client
        .cancel_by_operator(plain, Intervention::new("ana", "x"))
        .await
        .unwrap();
    assert_eq!(refused, CancelResult::NotCancellable(TaskStatus::Running));
    assert!(asked(&deployment.task(plain).await.unwrap().unwrap()).is_empty());
    open.store(true, Ordering::SeqCst);
    assert_eq!(
        deployment.wait(plain).await.unwrap().status,
        TaskStatus::Completed
    );

    assert_eq!(
        client
            .cancel_by_operator(TaskId::new(), Intervention::new("ana", "x"))
            .await
            .unwrap(),
        CancelResult::NotFound
    );

    // A task started before its record said whether it may be cancelled.
    let old = deployment.start::<Hold>(3).await.unwrap();
    running(deployment, old).await;
    forget(old).await;
    let answer = client
        .cancel_by_operator(old, Intervention::new("ana", "x"))
        .await;
    let runs_hold = client.sagas().iter().any(|d| d.name == "hold");
    if runs_hold {
        assert_eq!(answer.unwrap(), CancelResult::Cancelled);
    } else {
        let error = answer.unwrap_err();
        assert!(
            matches!(error, Error::UnknownSaga(ref s) if s == "hold"),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.contains("HTTP API or console"), "{message}");
        deployment
            .cancel_by_operator(old, Intervention::new("ana", "x"))
            .await
            .unwrap();
    }
    deployment.wait(old).await.unwrap();
}

/// Resolving a task with a long history answers the whole audit log as
/// stored, not only the entries the resolve wrote.
async fn resolving(engine: &Engine) {
    let id = engine.start::<Stuck>(1).await.unwrap();
    let before = engine.wait(id).await.unwrap();
    assert_eq!(before.status, TaskStatus::CompensationFailed);
    assert!(before.audit_log.len() > 4, "{:#?}", before.audit_log);
    let resolved = engine
        .resolve(id, Intervention::new("ana", "released by hand"))
        .await
        .unwrap();
    let stored = engine.task(id).await.unwrap().unwrap();
    assert_eq!(resolved.audit_log, stored.audit_log);
    assert_eq!(
        resolved.audit_log[..before.audit_log.len()],
        before.audit_log[..]
    );
    assert_eq!(
        resolved.audit_log.last().map(|e| &e.action),
        Some(&AuditAction::StatusChanged {
            from: TaskStatus::CompensationFailed,
            to: TaskStatus::Resolved
        })
    );
    assert_eq!(resolved.version, stored.version);
}

/// Instances are counted (any status), as many as are listed.
async fn counting(engine: &Engine) {
    assert_eq!(engine.process_count("reminders").await.unwrap(), 0);
    for id in 0..3 {
        engine.publish(Remind { id }).await.unwrap();
    }
    common::until("three instances", async || {
        engine.process_count("reminders").await.unwrap() == 3
    })
    .await;
    let listed = engine.process_instances::<Reminders>().await.unwrap();
    assert_eq!(listed.len(), 3);
    let unknown = engine.process_count("nope").await;
    assert!(
        matches!(unknown, Err(Error::UnknownProcess(_))),
        "{unknown:?}"
    );
}

/// The deployment's sagas, and what lets its `Plain` tasks finish.
fn sagas(builder: saga_runtime::EngineBuilder) -> (saga_runtime::EngineBuilder, Arc<AtomicBool>) {
    let open = Arc::new(AtomicBool::new(false));
    let builder = builder
        .saga(Hold)
        .saga(Stuck)
        .saga(Plain { open: open.clone() })
        .process_manager(Reminders);
    (builder, open)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory() {
    let (builder, open) = sagas(Engine::builder());
    let engine = builder.build().await.unwrap();
    resolving(&engine).await;
    counting(&engine).await;
    // The memory store is the engine's own: its own deployment cancels.
    cancelling(&engine, &engine, &open, async |_| {}).await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let redis = TestRedis::start();
    let (builder, open) = sagas(Engine::builder());
    let deployment = builder
        .backend(redis.backend().await)
        .build()
        .await
        .unwrap();
    resolving(&deployment).await;
    counting(&deployment).await;
    // What sagactl builds: no sagas, no workers.
    let client = Engine::builder()
        .backend(redis.backend().await)
        .workers(0)
        .build()
        .await
        .unwrap();
    let forget = async |id: TaskId| {
        let key = redis
            .keys()
            .into_iter()
            .find(|k| k.ends_with(&format!(":task:{id}")))
            .unwrap();
        // What is fixed at the start: field `h` in record layout 2 (a
        // fresh deployment's), else the whole record in `doc`.
        let fixed: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg("h")
            .query(&mut redis.conn())
            .unwrap();
        let field = if fixed.is_some() { "h" } else { "doc" };
        let doc: String = redis::cmd("HGET")
            .arg(&key)
            .arg(field)
            .query(&mut redis.conn())
            .unwrap();
        let mut doc: Value = serde_json::from_str(&doc).unwrap();
        assert_eq!(doc["cancellable"], Value::Bool(true), "{doc}");
        doc.as_object_mut().unwrap().remove("cancellable");
        let _: () = redis::cmd("HSET")
            .arg(&key)
            .arg(field)
            .arg(doc.to_string())
            .query(&mut redis.conn())
            .unwrap();
    };
    cancelling(&deployment, &client, &open, forget).await;
    client.shutdown().await;
    deployment.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres() {
    let pg = TestPostgres::start();
    let backend = || async {
        let config = PostgresConfig {
            poll_interval: Duration::from_millis(50),
            ..PostgresConfig::default()
        };
        PostgresBackend::connect_url(&pg.url(), config)
            .await
            .unwrap()
    };
    let (builder, open) = sagas(Engine::builder());
    let deployment = builder.backend(backend().await).build().await.unwrap();
    resolving(&deployment).await;
    counting(&deployment).await;
    let client = Engine::builder()
        .backend(backend().await)
        .workers(0)
        .build()
        .await
        .unwrap();
    let forget = async |id: TaskId| {
        pg.psql(&format!(
            "UPDATE saga.tasks SET head = head - 'cancellable' WHERE id = '{id}'"
        ));
    };
    cancelling(&deployment, &client, &open, forget).await;
    client.shutdown().await;
    deployment.shutdown().await;
}
