//! Regressions in the Sentinel support and the HTTP watcher cap (the
//! process-manager announcements are an engine scenario: `runners::`):
//! each test was written to fail against the change it names.

mod common;

use std::time::Duration;

use common::http_client::Client;
use common::ops_sagas::Fine;
use common::redis_sentinel::{TestSentinel, SERVICE};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::http::Api;
use saga_runtime::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `GET path` and reads up to the end of the response head; returns
/// the status and the open connection.
async fn head(addr: std::net::SocketAddr, path: &str) -> (u16, TcpStream) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 1024];
    while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the head");
        raw.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&raw);
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    (status, stream)
}

/// A client that closes its event stream must free its place at once: a
/// browser tab reloaded (or closed) over a task that is waiting must not
/// lock everyone out of `/events` until the next keep-alive write fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_event_stream_frees_its_place_promptly() {
    // No workers: the task waits, its stream sends nothing.
    let engine = Engine::builder()
        .saga(Fine)
        .workers(0)
        .build()
        .await
        .unwrap();
    let api = Client::serve(Api::new(engine.clone()).max_watchers(1).router()).await;
    let id = engine.start::<Fine>(1).await.unwrap();
    let path = format!("/api/tasks/{id}/events");
    let (status, first) = head(api.addr, &path).await;
    assert_eq!(status, 200);
    // The client goes away.
    drop(first);
    let started = std::time::Instant::now();
    loop {
        let (status, _stream) = head(api.addr, &path).await;
        if status == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the place of a closed stream still held after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    engine.shutdown().await;
}

fn connections_received(port: u16) -> u64 {
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection()
        .unwrap();
    let info: String = redis::cmd("INFO").arg("stats").query(&mut conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// An engine on Sentinel that was shut down and dropped (with its
/// backend) must stop asking the sentinels and checking the primary: a
/// process that builds engines (tests, a CLI, a reconnect after an error)
/// would otherwise pile up pollers, each opening a connection to the
/// primary every half second, for as long as the process lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_sentinel_backend_stops_polling() {
    let deployment = TestSentinel::start();
    let urls = deployment.sentinel_urls();
    let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
    let primary = deployment.primary();
    {
        let engine = Engine::builder()
            .backend(
                RedisBackend::connect_sentinel(&sentinels, SERVICE, RedisConfig::default())
                    .await
                    .unwrap(),
            )
            .saga(Fine)
            .workers(0)
            .build()
            .await
            .unwrap();
        engine.shutdown().await;
    }
    // Whatever was in flight settles.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = connections_received(primary);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // One: this look itself.
    let opened = connections_received(primary) - before - 1;
    assert_eq!(
        opened, 0,
        "{opened} connections opened to the primary in 3 s after the engine and its backend were dropped"
    );
}

/// An idle backend on Sentinel must not open connections to the primary
/// on its own: the half-second poll asks the sentinels (each lookup of
/// the crate's `async_get_client` opens a fresh connection to the primary
/// it names to check its role), so every backend of every process churned
/// several TCP connections a second through the primary (TIME_WAIT piling
/// up on both sides), even with no traffic and no failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sentinel_backend_does_not_churn_connections_to_the_primary() {
    let deployment = TestSentinel::start();
    let urls = deployment.sentinel_urls();
    let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
    let primary = deployment.primary();
    let backend = RedisBackend::connect_sentinel(&sentinels, SERVICE, RedisConfig::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = connections_received(primary);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let opened = connections_received(primary) - before - 1;
    assert!(
        opened <= 1,
        "an idle backend opened {opened} connections to the primary in 3 s"
    );
    drop(backend);
}
