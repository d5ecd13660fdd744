//! `sagactl` against a private redis-server that an engine wrote to:
//! list, show, resolve, requeue (one and by filter), purge.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The workspace's private redis-server helper; this test uses part of it.
#[allow(dead_code)]
#[path = "../../tests/common/ops_sagas.rs"]
mod ops_sagas;
#[allow(dead_code)]
#[path = "../../tests/common/redis_cluster.rs"]
mod redis_cluster;
#[allow(dead_code)]
#[path = "../../tests/common/redis_server.rs"]
mod redis_server;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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

    let (ok, _, err) = sagactl(&redis, &["requeue"]);
    assert!(!ok);
    assert!(err.contains("--saga"), "{err}");
    let code = Command::new(env!("CARGO_BIN_EXE_sagactl"))
        .args(["--redis", "redis://127.0.0.1:1", "requeue"])
        .output()
        .unwrap()
        .status
        .code();
    assert_eq!(code, Some(2), "a usage mistake, told before connecting");
    open.store(true, Ordering::SeqCst);
    let one = letters["letters"][0]["id"].as_str().unwrap();
    let (ok, _, err) = sagactl(&redis, &["requeue", one]);
    assert!(ok, "{err}");
    let (ok, out, err) = sagactl(&redis, &["requeue", "--saga", "gate"]);
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
