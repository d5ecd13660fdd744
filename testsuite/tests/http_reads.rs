//! Reads of business data need the API's credential once one is set
//! (issue 39, finding 5): a task's input, step outputs, errors and audit
//! log are customer data, and with a token set `GET /api/tasks/{id}`
//! served them to whoever reached the port. Now every read route needs
//! the token (or what `Api::authorize` accepts) unless the application
//! opens reads with `Api::public_reads(true)`; open reads cost the store a
//! page of `Api::public_read_limit` records at most per anonymous
//! request; and an API with no credential at all warns once when it is
//! reached from beyond loopback. Against a private redis-server, the
//! store's work counted in the bytes it sends.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::http_client::Client;
use common::ops_sagas::{Fine, Parked, Remind, Reminders};
use common::redis_server::TestRedis;
use saga_runtime::http::Api;
use saga_runtime::prelude::*;
use saga_runtime::DeadLetterFilter;
use serde_json::{json, Value};

const TOKEN: &str = "s3cret";

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

/// What the store sent while `f` ran, less the `INFO` reply that the
/// second count itself adds.
async fn sent_during<T>(redis: &TestRedis, f: impl AsyncFnOnce() -> T) -> (u64, T) {
    let before = bytes_sent(redis);
    let info = bytes_sent(redis) - before;
    let before = bytes_sent(redis);
    let out = f().await;
    let sent = (bytes_sent(redis) - before).saturating_sub(info);
    (sent, out)
}

/// A store holding finished tasks, dead letters and process instances,
/// and an engine that runs no workers over it: once the data is made,
/// nothing but the API's requests reads the store.
struct Seeded {
    engine: Engine,
    task: TaskId,
    letter: String,
    instance: String,
}

fn builder(backend: saga_runtime::backend::redis::RedisBackend) -> saga_runtime::EngineBuilder {
    Engine::builder()
        .backend(backend)
        .saga(Fine)
        .saga(Parked)
        .process_manager(Reminders)
}

async fn seed(redis: &TestRedis, fine: u32, parked: u32, reminders: u64) -> Seeded {
    let deployment = builder(redis.backend().await).build().await.unwrap();
    let mut ids = Vec::new();
    for chunk in (0..fine).collect::<Vec<_>>().chunks(100) {
        let starts = chunk.iter().map(|n| deployment.start::<Fine>(*n));
        ids.extend(futures::future::join_all(starts).await);
    }
    let parked = (0..parked).map(|n| deployment.start::<Parked>(n));
    ids.extend(futures::future::join_all(parked).await);
    for id in &ids {
        deployment.wait(*id.as_ref().unwrap()).await.unwrap();
    }
    for id in 0..reminders {
        deployment.publish(Remind { id }).await.unwrap();
    }
    common::until("every reminder has its instance", async || {
        deployment.process_count("reminders").await.unwrap() as u64 == reminders
    })
    .await;
    deployment.shutdown().await;
    let engine = builder(redis.backend().await)
        .workers(0)
        .build()
        .await
        .unwrap();
    let letter = engine
        .dead_letters(DeadLetterFilter::new().limit(1))
        .await
        .unwrap()
        .letters
        .remove(0)
        .id;
    let instance = engine
        .process_instances_page("reminders", None, 1)
        .await
        .unwrap()
        .instances
        .remove(0)
        .id;
    Seeded {
        task: *ids[0].as_ref().unwrap(),
        engine,
        letter,
        instance,
    }
}

/// Every route that reads, with a real id where it takes one.
fn read_routes(s: &Seeded) -> Vec<String> {
    let routes = vec![
        "/api/overview".to_owned(),
        "/api/sagas".to_owned(),
        "/api/tasks".to_owned(),
        "/api/tasks?error=no-such-error&limit=1".to_owned(),
        format!("/api/tasks/{}", s.task),
        format!("/api/tasks/{}/events", s.task),
        "/api/dead-letters".to_owned(),
        format!("/api/dead-letters/{}", s.letter),
        "/api/limits".to_owned(),
        "/api/processes".to_owned(),
        "/api/processes/reminders/instances".to_owned(),
        format!("/api/processes/reminders/instances/{}", s.instance),
        format!("/sagas/fine/{}", s.task),
        "/metrics".to_owned(),
    ];
    assert_every_get_route_is_listed(&routes);
    routes
}

/// The `GET` routes the router declares (`mod.rs`, `legacy.rs`), each
/// matched by one of `routes`: a read route added later must be listed
/// above, where its access is checked.
fn assert_every_get_route_is_listed(routes: &[String]) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../saga-runtime/src/http/");
    let source: String = ["mod.rs", "legacy.rs"]
        .iter()
        .map(|f| std::fs::read_to_string(format!("{dir}{f}")).unwrap())
        .collect::<String>()
        .split_whitespace()
        .collect();
    let mut declared = vec!["/sagas/fine/{task_id}".to_owned(), "/metrics".to_owned()];
    for route in source.split(".route(\"").skip(1) {
        let (path, rest) = route.split_once('"').unwrap();
        if rest.starts_with(",get(") && path != "/console" {
            declared.push(path.to_owned());
        }
    }
    assert!(declared.len() > 10, "{declared:?}");
    for pattern in declared {
        let matches = |path: &String| {
            let path = path.split('?').next().unwrap();
            let (a, b): (Vec<_>, Vec<_>) =
                (pattern.split('/').collect(), path.split('/').collect());
            a.len() == b.len()
                && a.iter()
                    .zip(&b)
                    .all(|(p, s)| p == s || (p.starts_with('{') && !s.is_empty()))
        };
        assert!(
            routes.iter().any(matches),
            "GET {pattern} is not checked here"
        );
    }
}

async fn serve(api: Api) -> Client {
    let handle = saga_runtime::metrics::install().unwrap();
    Client::serve(api.metrics(handle).router()).await
}

/// With a token set, every read route answers 401 without it and makes
/// the store send nothing; with it, each answers 200. `Api::authorize`
/// gates reads the same way (a cookie here), and refuses a read that
/// another site's page makes with the operator's cookie. `public_reads`
/// opens them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_needs_the_credential_once_one_is_set() {
    let redis = TestRedis::start();
    let seeded = seed(&redis, 3, 1, 1).await;
    let routes = read_routes(&seeded);
    let api = serve(Api::new(seeded.engine.clone()).token(TOKEN)).await;

    let (sent, answers) = sent_during(&redis, async || {
        let mut answers = Vec::new();
        for path in &routes {
            answers.push((path, api.get(path).await));
        }
        answers
    })
    .await;
    eprintln!("anonymous reads of every route, token set: the store sent {sent} bytes");
    for (path, (status, body)) in &answers {
        assert_eq!(
            (*status, body["code"].as_str()),
            (401, Some("unauthorized")),
            "anonymous GET {path}: {body}"
        );
    }
    assert!(sent < 200, "401s made the store send {sent} bytes");

    let operator = api.with("Authorization", &format!("Bearer {TOKEN}"));
    for wrong in [
        api.with("Authorization", "Bearer s3cre"),
        api.with("Authorization", TOKEN),
    ] {
        let (status, body) = wrong.get(&format!("/api/tasks/{}", seeded.task)).await;
        assert_eq!(status, 401, "{body}");
    }
    for path in &routes {
        let (status, body) = operator.get(path).await;
        assert_eq!(status, 200, "GET {path} with the token: {body}");
    }

    // `Api::authorize`: its check decides reads too.
    let cookie = serve(Api::new(seeded.engine.clone()).authorize(|headers| {
        let cookie = headers.get("cookie")?.to_str().ok()?;
        cookie.contains("session=valid").then(|| "ana".to_owned())
    }))
    .await;
    let task = format!("/api/tasks/{}", seeded.task);
    for path in &routes {
        assert_eq!(cookie.get(path).await.0, 401, "anonymous GET {path}");
    }
    let ana = cookie.with("Cookie", "session=valid");
    for path in &routes {
        let (status, body) = ana.get(path).await;
        assert_eq!(status, 200, "GET {path} with the cookie: {body}");
    }
    let forged = ana
        .with("Origin", "https://evil.example")
        .with("Sec-Fetch-Site", "cross-site");
    let (status, body) = forged.get(&task).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("cross_origin")),
        "another site's page read a task with the operator's cookie: {body}"
    );

    // Opened on purpose: anyone reads again, changes still need the token.
    let public = serve(
        Api::new(seeded.engine.clone())
            .token(TOKEN)
            .public_reads(true),
    )
    .await;
    for path in &routes {
        let (status, body) = public.get(path).await;
        assert_eq!(status, 200, "anonymous GET {path}, public reads: {body}");
    }
    let (status, body) = public
        .post("/api/sagas/fine/tasks", json!({"input": 1}))
        .await;
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));
    seeded.engine.shutdown().await;
}

/// The rows of a listing answer.
fn rows(body: &Value, key: &str) -> usize {
    body[key]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .len()
}

/// The filtered listing of the finding (`?error=..&limit=1` over 300
/// tasks) costs the store nothing without the token, and with public
/// reads a page of `public_read_limit` (50) records, marked `truncated`,
/// where an operator's reads `scan_limit` (200). Every listing's page is
/// capped at 50 rows for anonymous readers, and so is the scan of a
/// filtered process-instance page; instances are not counted by status
/// for them past 50.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_reads_cost_the_store_a_page_at_most() {
    let redis = TestRedis::start();
    let seeded = seed(&redis, 300, 60, 200).await;
    let engine = &seeded.engine;
    let gated = Client::serve(Api::new(engine.clone()).token(TOKEN).router()).await;
    let public = Client::serve(
        Api::new(engine.clone())
            .token(TOKEN)
            .public_reads(true)
            .router(),
    )
    .await;
    let operator = public.with("Authorization", &format!("Bearer {TOKEN}"));

    let filtered = "/api/tasks?error=no-such-error&limit=1";
    let (gated_bytes, (status, _)) = sent_during(&redis, async || gated.get(filtered).await).await;
    eprintln!(
        "{filtered} without the token, token set: {status}, the store sent {gated_bytes} bytes"
    );
    let (page_bytes, (_, page)) =
        sent_during(&redis, async || public.get("/api/tasks?limit=50").await).await;
    let (public_bytes, (_, body)) = sent_during(&redis, async || public.get(filtered).await).await;
    eprintln!("{filtered} anonymous, public reads: the store sent {public_bytes} bytes: {body}");
    let (operator_bytes, (_, operator_body)) =
        sent_during(&redis, async || operator.get(filtered).await).await;
    eprintln!(
        "{filtered} with the token: the store sent {operator_bytes} bytes; \
         an anonymous page of 50: {page_bytes} bytes"
    );
    assert_eq!(status, 401);
    assert!(gated_bytes < 200, "{gated_bytes} bytes for a 401");
    assert_eq!(rows(&page, "tasks"), 50, "{page}");
    assert_eq!(body["tasks"], json!([]), "{body}");
    assert_eq!(body["truncated"], json!(true), "{body}");
    assert!(body["next"].is_string(), "{body}");
    assert!(
        public_bytes <= page_bytes,
        "an anonymous filtered listing made the store send {public_bytes} bytes, \
         more than a page of 50 ({page_bytes})"
    );
    assert_eq!(operator_body["truncated"], json!(true), "{operator_body}");
    assert!(
        operator_bytes > 2 * public_bytes,
        "the operator's scan ({operator_bytes} bytes) is the anonymous one's ({public_bytes})"
    );
    // Searched to the end a page at a time.
    let mut cursor = body["next"].as_str().unwrap().to_owned();
    let mut pages = 1;
    while !cursor.is_empty() {
        let (status, body) = public.get(&format!("{filtered}&cursor={cursor}")).await;
        assert_eq!(status, 200, "{body}");
        cursor = body["next"].as_str().unwrap_or_default().to_owned();
        pages += 1;
        assert!(pages <= 20, "the cursor does not move on");
    }
    assert!(pages >= 360 / 52, "{pages} pages");

    // Page sizes.
    let (_, body) = public.get("/api/tasks?limit=1000").await;
    assert_eq!(rows(&body, "tasks"), 50, "anonymous");
    assert!(body["next"].is_string());
    let (_, body) = operator.get("/api/tasks?limit=1000").await;
    assert_eq!(rows(&body, "tasks"), 360, "the operator's");
    let (_, body) = public.get("/api/dead-letters?limit=200").await;
    assert_eq!(rows(&body, "letters"), 50, "anonymous");
    assert!(body["next"].is_string());
    let (_, body) = operator.get("/api/dead-letters?limit=200").await;
    assert_eq!(rows(&body, "letters"), 60, "the operator's");
    let instances = "/api/processes/reminders/instances";
    // The store's pages of instances are about the size asked for (a
    // partition's set is read whole).
    let (_, body) = public.get(&format!("{instances}?limit=1000")).await;
    assert!(rows(&body, "instances") < 100, "anonymous: {body}");
    assert!(body["next"].is_string(), "{body}");
    let (_, body) = operator.get(&format!("{instances}?limit=1000")).await;
    assert_eq!(rows(&body, "instances"), 200, "the operator's");
    // A status no instance has: the anonymous search stops after about 50.
    let (_, body) = public
        .get(&format!("{instances}?status=Completed&limit=10"))
        .await;
    assert_eq!(
        (&body["instances"], &body["truncated"]),
        (&json!([]), &json!(true)),
        "{body}"
    );
    assert!(body["next"].is_string(), "{body}");
    let (_, body) = operator
        .get(&format!("{instances}?status=Completed&limit=10"))
        .await;
    assert_eq!(
        body,
        json!({"instances": [], "next": null, "truncated": false})
    );
    // Counting 200 instances by status reads each: not for anonymous readers.
    let (_, body) = public.get("/api/processes").await;
    assert_eq!(body["processes"][0]["total"], json!(200), "{body}");
    assert_eq!(body["processes"][0]["counts"], Value::Null, "{body}");
    let (_, body) = operator.get("/api/processes").await;
    assert_eq!(body["processes"][0]["counts"], json!({"Active": 200}));

    // The limit is the application's to set.
    let wider = Client::serve(
        Api::new(engine.clone())
            .token(TOKEN)
            .public_reads(true)
            .public_read_limit(100)
            .router(),
    )
    .await;
    let (_, body) = wider.get("/api/tasks?limit=1000").await;
    assert_eq!(rows(&body, "tasks"), 100);
    engine.shutdown().await;
}

/// Opens `GET path` and reads the answer's head: its status, and the
/// connection, which holds an event stream open until dropped.
async fn open(api: &Client, path: &str, token: Option<&str>) -> (u16, tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(api.addr).await.unwrap();
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

/// A task's event stream needs the token like every read: anonymous
/// requests are refused before they take a place, so the one place of
/// `max_watchers(1)` stays the operator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_event_streams_take_no_place() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .saga(Fine)
        .workers(0)
        .build()
        .await
        .unwrap();
    // Pending for good (no workers): its streams stay open.
    let id = engine.start::<Fine>(1).await.unwrap();
    let path = format!("/api/tasks/{id}/events");
    let api = Client::serve(
        Api::new(engine.clone())
            .token(TOKEN)
            .max_watchers(1)
            .router(),
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let (status, stream) = open(&api, &path, None).await;
        held.push(stream);
        assert_eq!(status, 401, "an anonymous event stream");
    }
    let (status, _stream) = open(&api, &path, Some(TOKEN)).await;
    assert_eq!(status, 200, "the operator's place is taken");
    engine.shutdown().await;
}

/// Captured log lines.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn count(&self, text: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .matches(text)
            .count()
    }
}

/// With no credential at all, reads stay open (a read-only API for local
/// use), and the first request that comes from beyond loopback (its
/// `Host` names no loopback address) logs a warning, once; not when the
/// application opened reads on purpose, nor for requests to loopback.
#[tokio::test]
async fn an_api_without_credential_warns_once_when_reached_from_beyond_loopback() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // One thread: the server's tasks log to this thread's subscriber.
    let engine = Engine::builder().saga(Fine).build().await.unwrap();
    let warning = "reached from beyond loopback";

    let local = Client::serve(Api::new(engine.clone()).router()).await;
    let local = local.with("Host", &format!("127.0.0.1:{}", local.addr.port()));
    let (status, _) = local.get("/api/overview").await;
    assert_eq!(status, 200, "reads are open without a credential");
    assert_eq!(logs.count(warning), 0, "a request to loopback");

    let open = Client::serve(Api::new(engine.clone()).router()).await;
    for host in ["ops.example.com", "10.1.2.3:8080"] {
        let (status, _) = open.with("Host", host).get("/api/overview").await;
        assert_eq!(status, 200);
    }
    assert_eq!(logs.count(warning), 1, "once per router");

    let public = Client::serve(Api::new(engine.clone()).public_reads(true).router()).await;
    let (status, _) = public
        .with("Host", "ops.example.com")
        .get("/api/overview")
        .await;
    assert_eq!(status, 200);
    assert_eq!(logs.count(warning), 1, "public reads were asked for");
    tokio::time::timeout(Duration::from_secs(10), engine.shutdown())
        .await
        .unwrap();
}
