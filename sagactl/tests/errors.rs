//! `sagactl`'s errors about the store: each names the URL (password
//! masked) and says what to change, an unresponsive server is reported in
//! seconds, a misspelt saga is told as one, and a command that changes
//! something names the deployment before it acts. Against private
//! redis-servers, a private cluster and a private PostgreSQL.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

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

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ops_sagas::{Fine, Stuck};
use redis_server::{free_port, TestRedis};
use saga_runtime::backend::Backend;
use saga_runtime::prelude::*;

/// Runs `sagactl --redis url args`: (exit code, stdout, stderr).
fn sagactl(url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sagactl"))
        .arg("--redis")
        .arg(url)
        .args(args)
        .env_remove("SAGA_URL")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const FORMS: [&str; 5] = [
    "redis://",
    "rediss://",
    "redis+cluster://",
    "redis+sentinel://",
    "postgres://",
];

#[test]
fn a_malformed_url_lists_the_accepted_forms() {
    for url in ["http://127.0.0.1:6379", "127.0.0.1:6379", "redis://h:1:2:3"] {
        let (code, _, err) = sagactl(url, &["dead-letters"]);
        assert_eq!(code, Some(1));
        assert!(err.contains(url), "the URL: {err}");
        for form in FORMS {
            assert!(err.contains(form), "{form} in {err}");
        }
    }
}

/// A refused connection names the URL, with its password masked, and a
/// mutating command names the deployment (from `SAGA_URL` here) before
/// trying.
#[test]
fn connection_errors_name_the_url_without_its_password() {
    let url = format!("redis://:hunter2@127.0.0.1:{}/", free_port());
    let masked = url.replace("hunter2", "***");
    let (code, _, err) = sagactl(&url, &["dead-letters"]);
    assert_eq!(code, Some(1));
    assert!(err.contains(&format!("cannot reach {masked}")), "{err}");
    assert!(!err.contains("hunter2"), "{err}");

    // A closed PostgreSQL port: the server's "no", at once (the pool
    // retried it into "pool timed out" after 5 s, or sagactl's own
    // timeout said "no answer").
    let port = free_port();
    let started = std::time::Instant::now();
    let (code, _, err) = sagactl(
        &format!("postgres://ana:hunter2@127.0.0.1:{port}/postgres"),
        &["dead-letters"],
    );
    assert_eq!(code, Some(1));
    assert!(
        err.contains(&format!(
            "cannot connect to PostgreSQL at 127.0.0.1:{port}: connection refused"
        )),
        "{err}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(!err.contains("hunter2"), "{err}");

    let out = Command::new(env!("CARGO_BIN_EXE_sagactl"))
        .args([
            "--prefix", "shop", "purge", "--saga", "s", "--by", "ana", "--note", "n", "--yes",
        ])
        .env("SAGA_URL", &url)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let banner = err.lines().next().unwrap();
    assert_eq!(
        banner,
        format!("sagactl: purge on {masked} (prefix `shop`) (from SAGA_URL)"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}

/// Runs `sagactl args` with `env` and none of its own variables else set:
/// (exit code, stdout, stderr).
fn sagactl_bare(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sagactl"))
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

/// No `--url` and no `SAGA_URL`: a usage error (exit code 2) that says
/// how to name the store and shows the URL forms, before anything is
/// tried; sagactl no longer falls back on a Redis on localhost.
#[test]
fn without_a_url_it_says_how_to_name_the_store() {
    let commands: [&[&str]; 2] = [
        &["dead-letters"],
        &[
            "purge", "--saga", "s", "--by", "ana", "--note", "n", "--yes",
        ],
    ];
    for args in commands {
        let (code, out, err) = sagactl_bare(args, &[]);
        assert_eq!(code, Some(2), "{args:?}: {out}{err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains("no store given"), "{err}");
        assert!(err.contains("--url") && err.contains("SAGA_URL"), "{err}");
        for form in ["redis://", "postgres://"] {
            assert!(err.contains(form), "{form} in {err}");
        }
        assert!(!err.contains("purge on"), "nothing is tried: {err}");
        assert!(!err.contains("127.0.0.1:6379"), "no default: {err}");
    }
    // `--redis` is still a name of `--url`, and `--help` says there is
    // no default.
    let (code, _, err) = sagactl_bare(&["--redis", "redis://127.0.0.1:1", "dead-letters"], &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot reach redis://127.0.0.1:1"), "{err}");
    let (code, out, _) = sagactl_bare(&["--help"], &[]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("--url <URL>") && out.contains("no default"),
        "{out}"
    );
    assert!(!out.contains("[default: redis"), "{out}");
}

/// A PostgreSQL URL with a password, to a port nothing listens on: what
/// sagactl prints names the URL with the password masked, whatever the
/// password holds (a `/` or a `?` typed unencoded, a `%40`), wherever it
/// is (the URL's user info, its `password=` parameter), and whichever
/// message carries it (the deployment named before a change, the
/// connection's failure). `--help` does not show `SAGA_URL`'s value, and
/// a URL typed where no URL goes is masked in clap's complaint.
#[test]
fn a_password_is_never_printed() {
    let port = free_port();
    let cases = [
        (
            format!("postgres://ana:hunter2@127.0.0.1:{port}/shop"),
            vec!["hunter2"],
        ),
        (
            format!("postgres://ana:hun/ter2@127.0.0.1:{port}/shop"),
            vec!["ter2"],
        ),
        (
            format!("postgres://ana:hun?ter2@127.0.0.1:{port}/shop"),
            vec!["ter2"],
        ),
        (
            format!("postgres://ana:hunter%402@127.0.0.1:{port}/shop"),
            vec!["hunter%402", "hunter@2"],
        ),
        (
            format!("postgres://ana@127.0.0.1:{port}/shop?sslmode=disable&password=hunter3"),
            vec!["hunter3"],
        ),
        (format!("redis://:hun/ter2@127.0.0.1:{port}"), vec!["ter2"]),
    ];
    for (url, secrets) in &cases {
        let commands: [&[&str]; 2] = [
            &["dead-letters"],
            &["requeue", "1-0", "--by", "ana", "--note", "n"],
        ];
        for args in commands {
            let args = [&["--timeout", "2", "--url", url.as_str()][..], args].concat();
            let (code, out, err) = sagactl_bare(&args, &[]);
            assert_eq!(code, Some(1), "{url}: {out}{err}");
            assert!(err.contains(&format!("127.0.0.1:{port}")), "the URL: {err}");
            for secret in secrets {
                assert!(
                    !out.contains(secret) && !err.contains(secret),
                    "{url}: {out}{err}"
                );
            }
        }
        let (_, out, err) = sagactl_bare(&["--help"], &[("SAGA_URL", url)]);
        assert!(out.contains("SAGA_URL"), "{out}");
        for secret in secrets {
            assert!(!out.contains(secret) && !err.contains(secret), "{out}{err}");
        }
        let (code, out, err) = sagactl_bare(&["dead-letters", url], &[("SAGA_URL", url)]);
        assert_eq!(code, Some(2), "{out}{err}");
        assert!(err.contains("unexpected argument"), "{err}");
        for secret in secrets {
            assert!(!out.contains(secret) && !err.contains(secret), "{out}{err}");
        }
    }
}

/// A socket that accepts and never answers, and a redis-server stopped
/// with SIGSTOP: reported within the timeout (5 s by default), not after
/// the client's retries (21 s).
#[test]
fn an_unresponsive_server_is_reported_in_seconds() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://127.0.0.1:{}", silent.local_addr().unwrap().port());
    let started = Instant::now();
    let (code, _, err) = sagactl(&url, &["dead-letters"]);
    let took = started.elapsed();
    assert_eq!(code, Some(1));
    assert!(
        err.contains(&format!("no answer from {url} within 5 s")),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");

    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let mut server = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    let client = redis::Client::open(url.as_str()).unwrap();
    let ready = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(25));
        client.get_connection().is_ok()
    });
    assert!(ready, "redis-server on {port} did not start");
    let signal = |sig: &str| {
        let pid = server.id().to_string();
        assert!(Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success());
    };
    signal("-STOP");
    let started = Instant::now();
    let (code, _, err) = sagactl(&url, &["--timeout", "1", "dead-letters"]);
    let took = started.elapsed();
    signal("-CONT");
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(code, Some(1));
    assert!(
        err.contains(&format!("no answer from {url} within 1 s")),
        "{err}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// `list --saga` with a name the store holds no task of: an error that
/// lists the sagas it does hold.
async fn unknown_saga_is_told(url: &str, backend: Arc<dyn Backend>) {
    let engine = Engine::builder()
        .saga(Stuck)
        .saga(Fine)
        .backend_arc(backend)
        .build()
        .await
        .unwrap();
    for n in 0..4 {
        engine
            .wait(engine.start::<Stuck>(n).await.unwrap())
            .await
            .unwrap();
        engine
            .wait(engine.start::<Fine>(n).await.unwrap())
            .await
            .unwrap();
    }
    let (code, out, err) = sagactl(url, &["list", "--saga", "stukc"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("no saga `stukc`"), "{err}");
    assert!(err.contains("`fine`, `stuck`"), "the sagas there: {err}");
    // A saga with tasks, none in the status asked for: an empty list.
    let (code, out, err) = sagactl(url, &["list", "--saga", "fine", "--status", "Failed"]);
    assert_eq!((code, out.as_str()), (Some(0), ""), "{err}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_saga_on_redis() {
    let redis = TestRedis::start();
    unknown_saga_is_told(&redis.url(), Arc::new(redis.backend().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_saga_on_postgres() {
    let pg = postgres_server::TestPostgres::start();
    let backend = saga_runtime::backend::postgres::PostgresBackend::connect_url(
        &pg.url(),
        Default::default(),
    )
    .await
    .unwrap();
    unknown_saga_is_told(&pg.url(), Arc::new(backend)).await;
}

/// On a cluster: the names come from every shard; a node's own
/// `redis://` URL is told to be a cluster node's (whichever node: the one
/// that holds the deployment's layout key too); a single server given a
/// `redis+cluster://` URL is told it is none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_urls() {
    let cluster = redis_cluster::TestCluster::start_with(3, 0);
    let backend = cluster.backend(Default::default()).await;
    unknown_saga_is_told(&cluster.url(), Arc::new(backend)).await;
    for node in cluster.urls() {
        let (code, _, err) = sagactl(&node, &["dead-letters"]);
        assert_eq!(code, Some(1));
        assert!(err.contains("is a Redis Cluster node"), "{node}: {err}");
        assert!(err.contains("use `redis+cluster://"), "{node}: {err}");
    }
    let single = TestRedis::start();
    let url = single.url().replace("redis://", "redis+cluster://");
    let (code, _, err) = sagactl(&url, &["dead-letters"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("is not a Redis Cluster node"), "{err}");
    assert!(err.contains("use `redis://"), "{err}");
}
