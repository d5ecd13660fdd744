//! Faults in the operator features, each found by an adversarial review
//! and fixed (HTTP API, dead-letter bulk actions, watch, client-only
//! engines as sagactl uses them): each test failed while its bug was
//! there. Redis tests run a private redis-server each.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::http_client::Client;
use common::ops_sagas::{Parked, Reminders};
use common::redis_server::TestRedis;
use futures::StreamExt;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::engine::ProgressEvent;
use saga_runtime::http::Api;
use saga_runtime::prelude::*;
use saga_runtime::{DeadLetterFilter, DeadLetterSelection, Intervention};
use serde_json::{json, Value};

/// NOT `#[cancellable]`: its one step takes a while.
struct Slow;

#[saga(name = "slow")]
impl Slow {
    #[saga_step(1)]
    async fn work(&self, n: u32) -> Result<u32, StepError> {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Ok(n)
    }
}

/// Attempt 1 is slow and fails, attempt 2 fails at once, attempt 3
/// succeeds; retries are immediate.
struct Thrice {
    calls: Arc<AtomicUsize>,
}

#[saga(name = "thrice")]
impl Thrice {
    #[saga_step(1)]
    #[retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 0)]
    async fn call(&self, n: u32) -> Result<u32, StepError> {
        match self.calls.fetch_add(1, Ordering::SeqCst) {
            0 => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Err(StepError::transient("flaky 1"))
            }
            1 => Err(StepError::transient("flaky 2")),
            _ => Ok(n),
        }
    }
}

const TOKEN: &str = "s3cret";

async fn serve(engine: &Engine) -> Client {
    Client::serve(Api::new(engine.clone()).token(TOKEN).router())
        .await
        .with("Authorization", &format!("Bearer {TOKEN}"))
        .with("X-Operator", "reviewer")
}

async fn all_letters(engine: &Engine) -> Vec<saga_runtime::DeadLetter> {
    let mut all = Vec::new();
    let mut filter = DeadLetterFilter::new().limit(1000);
    loop {
        let page = engine.dead_letters(filter.clone()).await.unwrap();
        all.extend(page.letters);
        match page.next {
            Some(next) => filter = filter.after(next),
            None => return all,
        }
    }
}

/// Was (memory backend): a dead-letter cursor is the id of the page's last
/// letter, and a page after a letter that is gone is empty with no `next`.
/// A bulk action removes the letters it pages through, so it stops after
/// its first page of 200 and reports success for those only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_discard_on_memory_goes_past_the_first_page() {
    let engine = Engine::builder().saga(Parked).build().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..205 {
        ids.push(engine.start::<Parked>(n).await.unwrap());
    }
    for id in &ids {
        assert_eq!(
            engine.wait(*id).await.unwrap().status,
            TaskStatus::DeadLettered
        );
    }
    assert_eq!(all_letters(&engine).await.len(), 205);
    let selection = DeadLetterSelection {
        saga: Some("parked".into()),
        ..Default::default()
    };
    let bulk = engine
        .discard_where(selection, Intervention::new("reviewer", "purge"))
        .await
        .unwrap();
    let left = all_letters(&engine).await.len();
    assert_eq!(
        (bulk.done.len(), bulk.failed.len(), left),
        (205, 0, 0),
        "bulk discard stopped early: scanned {}",
        bulk.scanned
    );
    engine.shutdown().await;
}

/// Was (memory backend): paging the dead-letter list while someone acts
/// on the letter the cursor names ends the listing silently.
#[tokio::test]
async fn dead_letter_paging_on_memory_survives_the_cursor_letter_leaving() {
    let engine = Engine::builder().saga(Parked).build().await.unwrap();
    for n in 0..4 {
        let id = engine.start::<Parked>(n).await.unwrap();
        engine.wait(id).await.unwrap();
    }
    let first = engine
        .dead_letters(DeadLetterFilter::new().limit(2))
        .await
        .unwrap();
    let cursor = first.next.clone().expect("a second page");
    // Another operator discards the last letter of page one meanwhile.
    let last = first.letters.last().unwrap().id.clone();
    engine
        .discard(&last, Intervention::new("other", "dup"))
        .await
        .unwrap();
    let second = engine
        .dead_letters(DeadLetterFilter::new().limit(2).after(cursor))
        .await
        .unwrap();
    assert_eq!(
        second.letters.len(),
        2,
        "the two older letters vanished from the listing"
    );
    engine.shutdown().await;
}

/// Was (memory backend): a garbage dead-letter cursor is a 200 with an
/// empty page, not a 400 like a garbage task cursor.
#[tokio::test]
async fn memory_garbage_dead_letter_cursor_is_a_400() {
    let engine = Engine::builder().saga(Parked).build().await.unwrap();
    let id = engine.start::<Parked>(1).await.unwrap();
    engine.wait(id).await.unwrap();
    let api = serve(&engine).await;
    let (status, body) = api.get("/api/dead-letters?cursor=garbage").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    engine.shutdown().await;
}

/// Was (Redis): a bad cursor is the caller's mistake, but the dead-letter
/// listing and the process-instance listing answer 503 `unavailable`
/// (which monitors alarm on and clients retry) instead of 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_bad_cursors_answer_400() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .process_manager(Reminders)
        .saga(Parked)
        .build()
        .await
        .unwrap();
    let api = serve(&engine).await;
    let mut seen = Vec::new();
    for path in [
        "/api/dead-letters?cursor=garbage",
        "/api/processes/reminders/instances?cursor=garbage",
        "/api/tasks?cursor=garbage",
    ] {
        let (status, body) = api.get(path).await;
        seen.push((path, status, body["code"].clone()));
    }
    for (path, status, code) in &seen {
        assert_eq!(
            (*status, code.as_str()),
            (400, Some("bad_request")),
            "{path}: all: {seen:?}"
        );
    }
    // The first possible id is a valid cursor with nothing after it.
    let (status, body) = api.get("/api/dead-letters?cursor=0:0-0").await;
    assert_eq!(
        (status, &body["letters"]),
        (200, &serde_json::json!([])),
        "{body}"
    );
    engine.shutdown().await;
}

/// Was (Redis): a malformed dead-letter id reaches Redis unchecked
/// (`split_id` checks only the partition): `0:abc` makes XRANGE fail and
/// answers 503 `unavailable` instead of 404, and `0:<ms>` (no sequence)
/// is a range that returns the letter `0:<ms>-0` under the id asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_malformed_dead_letter_ids_are_404() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .saga(Parked)
        .build()
        .await
        .unwrap();
    let api = serve(&engine).await;
    let id = engine.start::<Parked>(1).await.unwrap();
    engine.wait(id).await.unwrap();
    let real = all_letters(&engine).await;
    assert_eq!(real.len(), 1);
    // "0:<ms>-<seq>" -> "0:<ms>"
    let ms_only = real[0].id.rsplit_once('-').unwrap().0.to_owned();
    let mut seen = Vec::new();
    for letter in ["0:abc", "0:1-2-3", ms_only.as_str()] {
        let (status, body) = api.get(&format!("/api/dead-letters/{letter}")).await;
        seen.push((letter.to_owned(), status, body));
        let (status, body) = api
            .post(
                &format!("/api/dead-letters/{letter}/discard"),
                json!({"note": "x"}),
            )
            .await;
        seen.push((format!("{letter} discard"), status, body));
    }
    for (what, status, body) in &seen {
        assert_eq!(
            (*status, body["code"].as_str()),
            (404, Some("not_found")),
            "{what}: {body}; all: {seen:?}"
        );
    }
    engine.shutdown().await;
}

/// Was: `cancel_by_id` treats a saga this engine does not register as
/// cancellable. sagactl (and any console-only engine) registers no sagas,
/// so `sagactl cancel <id>` cancels a task of a saga that is not
/// `#[cancellable]`, and the deployment's worker honours it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_engine_does_not_cancel_a_saga_it_does_not_run() {
    let redis = TestRedis::start();
    let deployment = Engine::builder()
        .backend(redis.backend().await)
        .saga(Slow)
        .build()
        .await
        .unwrap();
    // What sagactl builds.
    let cli = Engine::builder()
        .backend(redis.backend().await)
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = deployment.start::<Slow>(1).await.unwrap();
    for _ in 0..100 {
        if deployment.task(id).await.unwrap().unwrap().status == TaskStatus::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The task recorded at its start that its version is not
    // cancellable: refused. (A task too old to say is refused with
    // `Error::UnknownSaga`: tests/operator_cancel.rs.)
    let result = cli.cancel_by_id(id).await;
    assert!(
        matches!(
            result,
            Ok(CancelResult::NotCancellable(TaskStatus::Running))
        ),
        "{result:?}"
    );
    let end = deployment.wait(id).await.unwrap().status;
    assert_eq!(end, TaskStatus::Completed);
    cli.shutdown().await;
    deployment.shutdown().await;
}

/// Was (sagactl footgun): connecting a client-only engine (sagactl's
/// default `--partitions 1`) to a prefix with no data yet records the
/// layout with `SET NX`, so the real deployment (4 partitions) then
/// refuses to start. A read-only CLI call must not fix the layout. (Also:
/// a mistyped `--prefix` lists nothing, exit 0, and leaves keys behind.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attaching_to_a_fresh_prefix_writes_nothing() {
    let redis = TestRedis::start();
    let cli_config = RedisConfig {
        prefix: "shop".into(),
        partitions: Some(1),
        ..RedisConfig::default()
    };
    // What sagactl does: attach, which refuses a prefix with no deployment
    // and writes nothing.
    let attached = RedisBackend::attach(&redis.url(), cli_config).await;
    assert!(attached.is_err(), "no deployment there yet");
    let written = redis.keys();
    assert!(written.is_empty(), "{written:?}");

    let deployment_config = RedisConfig {
        prefix: "shop".into(),
        partitions: Some(4),
        ..RedisConfig::default()
    };
    let deployment = RedisBackend::connect_with(&redis.url(), deployment_config).await;
    assert!(
        deployment.is_ok(),
        "the deployment cannot start after a sagactl call: {:?}; keys the CLI wrote: {written:?}",
        deployment.err()
    );
}

/// Was: watch() reads the store only when its consumer polls, and turns
/// attempt-count deltas into ONE `step_started` (the newest attempt),
/// placed before everything that look saw for the step. A consumer slower
/// than the task (a slow SSE client) misses attempt starts and gets
/// `step_started{3}` before `attempt_failed{1}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reports_every_attempt_start_to_a_slow_consumer() {
    let engine = Engine::builder()
        .saga(Thrice {
            calls: Arc::default(),
        })
        .build()
        .await
        .unwrap();
    let id = engine.start::<Thrice>(7).await.unwrap();
    let mut stream = engine.watch(id);
    let first = stream.next().await.unwrap().unwrap();
    // The consumer is busy for a moment (a slow network, a full buffer).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut events = vec![first.event];
    while let Some(item) = stream.next().await {
        events.push(item.unwrap().event);
    }
    let started: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            ProgressEvent::StepStarted { attempt, .. } => Some(*attempt),
            _ => None,
        })
        .collect();
    assert_eq!(started, [1, 2, 3], "events: {events:#?}");
    // Every attempt starts after the previous one failed.
    let pos = |pred: &dyn Fn(&ProgressEvent) -> bool| events.iter().position(pred);
    let started_3 = pos(&|e| matches!(e, ProgressEvent::StepStarted { attempt: 3, .. }));
    let failed_2 = pos(&|e| {
        matches!(
            e,
            ProgressEvent::AttemptFailed {
                attempt: Some(2),
                ..
            }
        )
    });
    assert!(started_3 > failed_2, "events: {events:#?}");
    engine.shutdown().await;
}

/// Was (error shape): "Errors are JSON everywhere" does not hold for a
/// wrong method on an existing route (405, empty body) nor for a path
/// parameter that does not percent-decode (400, text/plain).
#[tokio::test]
async fn http_errors_are_json_for_wrong_method_and_bad_path() {
    let engine = Engine::builder().saga(Parked).build().await.unwrap();
    let api = serve(&engine).await;
    let id = TaskId::new();
    let mut seen: Vec<(String, u16, Value)> = Vec::new();
    for (method, path) in [
        ("GET", format!("/api/tasks/{id}/cancel")),
        ("DELETE", format!("/api/tasks/{id}")),
        ("GET", "/api/tasks/%FF".to_owned()),
        ("GET", "/api/dead-letters/%FF".to_owned()),
    ] {
        let (status, body) = api.send(method, &path, None).await;
        seen.push((format!("{method} {path}"), status, body));
    }
    for (what, status, body) in &seen {
        assert!(
            *status >= 400 && body["code"].is_string(),
            "{what}: {status} {body}; all: {seen:?}"
        );
    }
    // A change sent without its JSON body says what to send.
    let (status, body) = api
        .send("POST", &format!("/api/tasks/{id}/resolve"), None)
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (415, Some("unsupported_media_type")),
        "{body}"
    );
    assert!(
        body["error"].as_str().unwrap().contains("\"note\""),
        "{body}"
    );
    engine.shutdown().await;
}

/// Was (Redis; HIGH): `requeue` checks that the letter exists and that
/// the task is `DeadLettered` before taking the task's lease, and the
/// commit's `XDEL` of the letter does not have to remove anything. Two
/// requeues of one letter at once (a double click, two operators, two
/// bulk runs) both succeed: the second waits out the worker's lease, finds
/// the task parked AGAIN by the first requeue's run, and runs the step a
/// second time, leaving that run's letter orphaned on the queue. A later
/// bulk requeue then acts on the task once per letter. (A race: it
/// shows in roughly half of the tries, so the test makes twelve.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_concurrent_requeues_of_one_letter_run_the_task_once() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .saga(Parked)
        .build()
        .await
        .unwrap();
    let mut outcomes = Vec::new();
    for n in 0..12 {
        let id = engine.start::<Parked>(n).await.unwrap();
        engine.wait(id).await.unwrap();
        let letter = all_letters(&engine)
            .await
            .into_iter()
            .find(|l| l.task_id == Some(id))
            .unwrap();
        let (a, b) = tokio::join!(engine.requeue(&letter.id), engine.requeue(&letter.id));
        // Let the task's runs end (each ends DeadLettered again).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let task = engine.wait(id).await.unwrap();
        let requeued = task
            .audit_log
            .iter()
            .filter(|e| matches!(e.action, saga_runtime::AuditAction::Requeued))
            .count();
        let letters = all_letters(&engine)
            .await
            .into_iter()
            .filter(|l| l.task_id == Some(id))
            .count();
        outcomes.push((a.is_ok() as u8 + b.is_ok() as u8, requeued, letters));
    }
    assert!(
        outcomes.iter().all(|o| *o == (1, 1, 1)),
        "(requeues that succeeded, times requeued, letters of the task) per try: {outcomes:?}"
    );
    engine.shutdown().await;
}

/// Was (misleading error, slow): `resolve` / `retry_compensation` of a task
/// a worker is running take the task's lease before looking at its status,
/// so they wait out the whole lease TTL (the visibility timeout, 15-30 s by
/// default; the HTTP request hangs that long) and then fail with
/// `Backend(unavailable) "stayed locked; try again"` (HTTP 503), where the
/// answer is an immediate `NotResolvable { status: Running }` (409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolving_a_running_task_is_refused_at_once() {
    let engine = Engine::builder()
        .saga(Slow)
        .lock_ttl(Duration::from_millis(900))
        .build()
        .await
        .unwrap();
    let id = engine.start::<Slow>(1).await.unwrap();
    for _ in 0..100 {
        if engine.task(id).await.unwrap().unwrap().status == TaskStatus::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let began = std::time::Instant::now();
    let result = engine
        .resolve(id, Intervention::new("reviewer", "looks stuck"))
        .await;
    let took = began.elapsed();
    assert!(
        matches!(result, Err(saga_runtime::Error::NotResolvable { .. }))
            && took < Duration::from_millis(300),
        "{result:?} after {took:?}"
    );
    engine.wait(id).await.unwrap();
    engine.shutdown().await;
}

/// Was (security, CSRF): the docs suggest `Api::authorize` "to check your
/// own session cookie", but `POST .../requeue` and `POST .../cancel` take
/// no JSON body, so a cross-site HTML form (a "simple" request: no CORS
/// preflight, cookies attached) from any page the operator visits
/// performs them. Nothing checks `Origin`/`Sec-Fetch-Site` or demands a
/// non-simple header or content type on mutating routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_authorize_refuses_cross_site_form_posts() {
    let engine = Engine::builder().saga(Parked).build().await.unwrap();
    let id = engine.start::<Parked>(1).await.unwrap();
    engine.wait(id).await.unwrap();
    let letter = all_letters(&engine).await.remove(0);
    let api = Api::new(engine.clone())
        .authorize(|headers| {
            let cookie = headers.get("cookie")?.to_str().ok()?;
            cookie.contains("session=valid").then(|| "ana".to_owned())
        })
        .router();
    // What a browser sends for <form method=post action=".../requeue">
    // auto-submitted by https://evil.example while ana is logged in.
    let browser = Client::serve(api)
        .await
        .with("Cookie", "session=valid")
        .with("Origin", "https://evil.example")
        .with("Sec-Fetch-Site", "cross-site")
        .with("Content-Type", "application/x-www-form-urlencoded");
    let (status, body) = browser
        .send(
            "POST",
            &format!("/api/dead-letters/{}/requeue", letter.id),
            None,
        )
        .await;
    assert!(
        status == 403 || status == 401,
        "a cross-site form requeued a dead letter: {status} {body}"
    );
    engine.shutdown().await;
}

/// Was (answered Ok, did nothing): requeueing the letter of a task that no
/// longer exists (its retention ran out) put the raw message back, which
/// a worker dead-lettered again as a stray. Now it is refused with what
/// to do instead (409 over HTTP), and the letter stays for a discard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeueing_the_letter_of_a_task_that_expired_is_refused() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .saga(Parked)
        .build()
        .await
        .unwrap();
    let id = engine.start::<Parked>(1).await.unwrap();
    assert_eq!(
        engine.wait(id).await.unwrap().status,
        TaskStatus::DeadLettered
    );
    let letter = all_letters(&engine)
        .await
        .into_iter()
        .find(|l| l.task_id == Some(id))
        .unwrap();
    // The task's retention runs out: its record goes.
    for key in redis.keys() {
        if key.ends_with(&format!(":task:{id}")) {
            let _: () = redis::cmd("DEL")
                .arg(&key)
                .query(&mut redis.conn())
                .unwrap();
        }
    }
    assert!(engine.task(id).await.unwrap().is_none());
    match engine.requeue(&letter.id).await {
        Err(saga_runtime::Error::TaskGone(gone)) => assert_eq!(gone, id),
        other => panic!("requeueing the letter of a task that is gone: {other:?}"),
    }
    let api = serve(&engine).await;
    let (status, body) = api
        .post(
            &format!("/api/dead-letters/{}/requeue", letter.id),
            json!({}),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("conflict")),
        "{body}"
    );
    assert!(
        all_letters(&engine).await.iter().any(|l| l.id == letter.id),
        "the letter stays, for a discard"
    );
    engine.shutdown().await;
}
