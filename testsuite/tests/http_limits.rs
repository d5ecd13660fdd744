//! What one HTTP request may cost, and what an answer may say (issue 23,
//! items 4 and 5), against a private redis-server: a request rides out a
//! store that is down for a few seconds, not a minute, and its 503 says
//! what failed without the store's words; a filtered listing reads a
//! bounded number of tasks, whatever the filter; readers cannot take every
//! event stream from the operators.

mod common;

use std::time::{Duration, Instant};

use common::http_client::Client;
use common::ops_sagas::Fine;
use common::redis_server::TestRedis;
use saga_runtime::http::Api;
use saga_runtime::prelude::*;
use serde_json::json;

async fn client_engine(redis: &TestRedis) -> Engine {
    // No workers: nothing but the requests reads the store.
    Engine::builder()
        .backend(redis.backend().await)
        .saga(Fine)
        .workers(0)
        .build()
        .await
        .unwrap()
}

/// With Redis SIGKILLed, a read answers 503 within the API's retry
/// budget (it took 71.5 s, the whole client retry policy), and the body
/// says what failed, not the OS error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_answers_503_within_the_budget_when_redis_is_down() {
    let mut redis = TestRedis::start();
    let engine = client_engine(&redis).await;
    let id = engine.start::<Fine>(1).await.unwrap();
    let default = Client::serve(Api::new(engine.clone()).router()).await;
    let short = Client::serve(
        Api::new(engine.clone())
            .retry_budget(Duration::from_secs(2))
            .router(),
    )
    .await;
    let (status, _) = default.get(&format!("/api/tasks/{id}")).await;
    assert_eq!(status, 200);
    redis.kill();

    for (api, budget) in [(&short, 2), (&default, 5)] {
        for path in [format!("/api/tasks/{id}"), "/api/tasks?limit=5".to_owned()] {
            let started = Instant::now();
            let (status, body) = api.get(&path).await;
            let took = started.elapsed();
            eprintln!("{path} with a {budget} s budget: {status} after {took:?}: {body}");
            assert_eq!(status, 503, "{body}");
            assert_eq!(body["code"], json!("unavailable"), "{body}");
            assert!(
                took < Duration::from_millis(budget * 1000 + 500),
                "{path} answered after {took:?} with a {budget} s budget"
            );
            assert!(
                took >= Duration::from_millis(budget * 1000 - 1100),
                "{path} gave up after {took:?}, before its {budget} s budget"
            );
            let text = body.to_string();
            for internal in ["os error", "refused", "Connection", "127.0.0.1", "backend"] {
                assert!(!text.contains(internal), "{internal:?} in {text}");
            }
        }
    }
}

/// Bytes this redis-server has sent to its clients so far.
fn bytes_sent(redis: &TestRedis) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut redis.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// An anonymous `GET /api/tasks?error=x&limit=1` made the store send every
/// task up to 5,000 (493 kB for a 24-byte answer): a filtered page now
/// reads at most `Api::scan_limit` tasks (200) and hands back a cursor to
/// go on from. Counted in the bytes the redis-server sent. (An operator's
/// request: an anonymous one reads a quarter of that, `tests/http_reads.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_listing_reads_a_bounded_number_of_tasks() {
    let redis = TestRedis::start();
    let engine = client_engine(&redis).await;
    const TASKS: usize = 1_600;
    for chunk in 0..TASKS / 100 {
        let starts = (0..100).map(|n| engine.start::<Fine>((chunk * 100 + n) as u32));
        for id in futures::future::join_all(starts).await {
            id.unwrap();
        }
    }
    let api = Client::serve(Api::new(engine.clone()).token("t").router())
        .await
        .with("Authorization", "Bearer t");

    // What reading 100 tasks costs: an unfiltered page of 100.
    let before = bytes_sent(&redis);
    let (status, body) = api.get("/api/tasks?limit=100").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["tasks"].as_array().unwrap().len(), 100);
    let hundred = bytes_sent(&redis) - before;

    let mut cursor = String::new();
    let mut pages = 0;
    loop {
        let before = bytes_sent(&redis);
        let (status, body) = api
            .get(&format!("/api/tasks?error=no-such-error&limit=1{cursor}"))
            .await;
        let sent = bytes_sent(&redis) - before;
        pages += 1;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["tasks"], json!([]), "{body}");
        eprintln!("page {pages}: the store sent {sent} bytes (100 tasks: {hundred})");
        // 200 tasks, and the pages' own overhead.
        assert!(
            sent < hundred * 3,
            "one filtered request made the store send {sent} bytes; 100 tasks are {hundred}"
        );
        match body["next"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
        assert!(pages < 20, "the cursor does not move on");
    }
    // Every task was searched, 200 a page.
    assert!(pages >= TASKS / 200, "{pages} pages");
}

/// Opens `GET path` from `from` and reads the answer's head: its status,
/// and the connection, which holds an event stream open until dropped.
async fn open_from(
    api: std::net::SocketAddr,
    from: [u8; 4],
    path: &str,
    token: Option<&str>,
) -> (u16, tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::from((from, 0))).unwrap();
    let mut stream = socket.connect(api).await.unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n{auth}\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !String::from_utf8_lossy(&head).contains("\r\n\r\n") {
        let mut buf = [0u8; 512];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&head));
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    (head.split(' ').nth(1).unwrap().parse().unwrap(), stream)
}

/// Any reader could hold all 64 event streams, and operators then got
/// 503: where reads are open to anyone (`public_reads`), a peer address
/// holds at most 4 (429 past them), and readers without the API's token
/// share at most three quarters of the places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_cannot_take_every_event_stream() {
    let redis = TestRedis::start();
    let engine = client_engine(&redis).await;
    // Pending for good (no workers): its streams stay open.
    let id = engine.start::<Fine>(1).await.unwrap();
    let path = format!("/api/tasks/{id}/events");
    let router = Api::new(engine.clone())
        .token("t")
        .public_reads(true)
        .max_watchers(8)
        .router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        .unwrap()
    });

    let mut held = Vec::new();
    for _ in 0..4 {
        let (status, stream) = open_from(addr, [127, 0, 0, 1], &path, None).await;
        assert_eq!(status, 200);
        held.push(stream);
    }
    let (status, _) = open_from(addr, [127, 0, 0, 1], &path, None).await;
    assert_eq!(status, 429, "a fifth stream for one address");
    for _ in 0..2 {
        let (status, stream) = open_from(addr, [127, 0, 0, 2], &path, None).await;
        assert_eq!(status, 200);
        held.push(stream);
    }
    let (status, _) = open_from(addr, [127, 0, 0, 3], &path, None).await;
    assert_eq!(status, 503, "readers hold six of eight: the rest are kept");
    // The operators still get theirs.
    for _ in 0..2 {
        let (status, stream) = open_from(addr, [127, 0, 0, 1], &path, Some("t")).await;
        assert_eq!(status, 200, "an operator is locked out");
        held.push(stream);
    }
    let (status, _) = open_from(addr, [127, 0, 0, 1], &path, Some("t")).await;
    assert_eq!(status, 503, "eight in all");
    // A stream closed gives its place back.
    drop(held.remove(0));
    common::until("a closed stream's place is given back", async || {
        open_from(addr, [127, 0, 0, 1], &path, None).await.0 == 200
    })
    .await;
}
