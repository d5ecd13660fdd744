//! The HTTP API (feature `http`): every operator action over JSON, the
//! access rules, the error shape, and a task's progress as server-sent
//! events; on the in-memory backend and on a real redis-server.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::http_client::Client;
use common::ops_sagas::{Fine, Gate, Hold, Parked, Remind, Reminders, Stuck};
use common::redis_server::TestRedis;
use saga_runtime::http::{router, Api};
use saga_runtime::prelude::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Fails its first attempt (slowly, so a watcher sees it start), then
/// succeeds after a retry.
struct Once {
    calls: Arc<AtomicUsize>,
}

#[saga(name = "once")]
impl Once {
    #[saga_step(1)]
    #[retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 300)]
    async fn call(&self, n: u32) -> Result<u32, StepError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            return Err(StepError::transient("flaky"));
        }
        Ok(n)
    }
}

/// An engine whose gate is `gate`; each scenario has its own, as the
/// in-memory and Redis runs go on side by side.
async fn engine_with(redis: Option<&TestRedis>, gate: Arc<AtomicBool>) -> Engine {
    let builder = Engine::builder()
        .process_manager(Reminders)
        .saga(Fine)
        .saga(Stuck)
        .saga(Gate { open: gate })
        .saga(Parked)
        .saga(Hold)
        .saga(Once {
            calls: Arc::default(),
        });
    let builder = match redis {
        Some(redis) => builder.backend(redis.backend().await),
        None => builder,
    };
    builder.build().await.unwrap()
}

async fn engine(redis: Option<&TestRedis>) -> Engine {
    engine_with(redis, Arc::default()).await
}

const TOKEN: &str = "s3cret";

async fn serve(engine: &Engine) -> Client {
    Client::serve(Api::new(engine.clone()).token(TOKEN).router())
        .await
        .with("Authorization", &format!("Bearer {TOKEN}"))
        .with("X-Operator", "ana")
}

async fn wait_status(engine: &Engine, id: &Value) -> TaskStatus {
    let id = id.as_str().unwrap().parse().unwrap();
    engine.wait(id).await.unwrap().status
}

/// Changes need the configured access, and so do reads once it is
/// configured; without any, reads are open and changes refused.
async fn access(engine: Engine) {
    let open = Client::serve(router(engine.clone())).await;
    let start = json!({ "input": 1 });
    let (status, body) = open.post("/api/sagas/fine/tasks", start.clone()).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("read_only")),
        "{body}"
    );
    let (status, body) = open.get("/api/overview").await;
    assert_eq!((status, &body["changes_allowed"]), (200, &json!(false)));

    let api = Client::serve(Api::new(engine.clone()).token(TOKEN).router()).await;
    let (status, body) = api.post("/api/sagas/fine/tasks", start.clone()).await;
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));
    let (status, body) = api.get("/api/overview").await;
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));
    let wrong = api.with("Authorization", "Bearer s3cre");
    assert_eq!(
        wrong.post("/api/sagas/fine/tasks", start.clone()).await.0,
        401
    );
    let right = api.with("Authorization", &format!("Bearer {TOKEN}"));
    let (status, body) = right.post("/api/sagas/fine/tasks", start).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        wait_status(&engine, &body["id"]).await,
        TaskStatus::Completed
    );

    // A custom check names the operator itself.
    let custom = Api::new(engine.clone())
        .authorize(|headers| {
            let user = headers.get("x-user")?.to_str().ok()?;
            (user == "ops").then(|| "ops-team".to_owned())
        })
        .router();
    let custom = Client::serve(custom).await;
    assert_eq!(
        custom
            .post("/api/sagas/fine/tasks", json!({"input": 2}))
            .await
            .0,
        401
    );
    let ops = custom.with("X-User", "ops");
    assert_eq!(
        ops.post("/api/sagas/fine/tasks", json!({"input": 2}))
            .await
            .0,
        201
    );
    // Its workers would take the next scenario's tasks on a shared Redis.
    engine.shutdown().await;
}

/// Starting from JSON checks the input against the saga's input type,
/// and an unknown saga answers like an unknown task.
async fn starting(engine: Engine) {
    let api = serve(&engine).await;
    let (status, body) = api
        .post("/api/sagas/fine/tasks", json!({"input": 41}))
        .await;
    assert_eq!(status, 201);
    let id = body["id"].as_str().unwrap().to_owned();
    assert_eq!(
        wait_status(&engine, &body["id"]).await,
        TaskStatus::Completed
    );
    let (_, task) = api.get(&format!("/api/tasks/{id}")).await;
    assert_eq!(task["output"], json!(42));

    let (status, body) = api
        .post("/api/sagas/fine/tasks", json!({"input": "x"}))
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("invalid_input")),
        "{body}"
    );
    let (status, body) = api.post("/api/sagas/fine/tasks", json!({"inptu": 1})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("bad_request")),
        "{body}"
    );

    let (status, unknown_saga) = api.post("/api/sagas/nope/tasks", json!({"input": 1})).await;
    assert_eq!(status, 404);
    let (status, unknown_task) = api.get(&format!("/api/tasks/{}", TaskId::new())).await;
    assert_eq!(status, 404);
    assert_eq!(unknown_saga["code"], unknown_task["code"]);
    let (status, _) = api.get("/api/tasks/not-a-uuid").await;
    assert_eq!(status, 400);
    let (status, body) = api.get("/api/no/such/route").await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));

    let keyed = json!({"input": 5, "key": "order-5"});
    let (_, first) = api.post("/api/sagas/fine/tasks", keyed.clone()).await;
    let (status, again) = api.post("/api/sagas/fine/tasks", keyed).await;
    assert_eq!((status, &again["id"]), (201, &first["id"]));
    let (status, body) = api
        .post(
            "/api/sagas/fine/tasks",
            json!({"input": 6, "key": "order-5"}),
        )
        .await;
    assert_eq!((status, body["code"].as_str()), (409, Some("conflict")));
    // Its workers would take the next scenario's tasks on a shared Redis.
    engine.shutdown().await;
}

/// Lists filter by saga, status, step and error text; the overview
/// counts by status.
async fn listing(engine: Engine) {
    let api = serve(&engine).await;
    let parked = engine.start::<Parked>(1).await.unwrap();
    let stuck = engine.start::<Stuck>(1).await.unwrap();
    engine.wait(parked).await.unwrap();
    engine.wait(stuck).await.unwrap();

    let (status, body) = api.get("/api/tasks?saga=parked&status=DeadLettered").await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = body["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [parked.to_string()]);
    assert_eq!(body["tasks"][0]["step"], "call");

    let (_, body) = api.get("/api/tasks?error=warehouse").await;
    let ids: Vec<&Value> = body["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["id"])
        .collect();
    assert_eq!(ids, [&json!(stuck.to_string())]);
    let (_, body) = api.get("/api/tasks?step=charge").await;
    assert_eq!(body["tasks"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(body["tasks"][0]["id"], json!(stuck.to_string()));

    let (status, body) = api.get("/api/tasks?status=Bogus").await;
    assert_eq!((status, body["code"].as_str()), (400, Some("bad_request")));
    assert!(
        body["error"].as_str().unwrap().contains("DeadLettered"),
        "{body}"
    );
    assert_eq!(api.get("/api/tasks?saga=nope").await.0, 404);
    assert_eq!(api.get("/api/tasks?sgaa=fine").await.0, 400);

    let (_, overview) = api.get("/api/overview").await;
    let counts = |saga: &str| {
        overview["sagas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["saga"] == saga)
            .unwrap()["counts"]
            .clone()
    };
    assert_eq!(counts("parked"), json!({"DeadLettered": 1}));
    assert_eq!(counts("stuck"), json!({"CompensationFailed": 1}));
    assert_eq!(overview["dead_letters"], json!(1));
    assert_eq!(overview["changes_allowed"], json!(true));
    // Its workers would take the next scenario's tasks on a shared Redis.
    engine.shutdown().await;
}

/// The `(by, note)` of each `Requeued` entry of `task`'s audit log.
fn requeued_by(task: &TaskInstance) -> Vec<(Value, Value)> {
    task.audit_log
        .iter()
        .filter(|e| e.action == saga_runtime::AuditAction::Requeued)
        .map(|e| {
            let details: Value = serde_json::from_str(e.details.as_deref().unwrap()).unwrap();
            (details["by"].clone(), details["note"].clone())
        })
        .collect()
}

/// Resolve, discard and requeue (one letter, and in bulk) through the
/// API, audited with the operator who called and the note, if any, they
/// gave.
async fn operator_actions(redis: Option<&TestRedis>) {
    let gate = Arc::new(AtomicBool::new(false));
    let engine = engine_with(redis, gate.clone()).await;
    let api = serve(&engine).await;
    let stuck = engine.start::<Stuck>(1).await.unwrap();
    let parked = engine.start::<Parked>(1).await.unwrap();
    let mut gated = Vec::new();
    for n in 0..4 {
        gated.push(engine.start::<Gate>(n).await.unwrap());
    }
    for id in gated.iter().chain([&stuck, &parked]) {
        engine.wait(*id).await.unwrap();
    }

    let path = format!("/api/tasks/{stuck}/resolve");
    let (status, body) = api.post(&path, json!({"note": " "})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("invalid_input"))
    );
    let (status, body) = api.post(&path, json!({"note": "released by hand"})).await;
    assert_eq!(
        (status, &body["status"]),
        (200, &json!("Resolved")),
        "{body}"
    );
    let audit = body["audit_log"].as_array().unwrap();
    // The whole log as stored, not only the entries the resolve wrote.
    let stored = engine.task(stuck).await.unwrap().unwrap().audit_log;
    assert!(stored.len() > 4, "{stored:?}");
    assert_eq!(audit.len(), stored.len(), "{body}");
    assert_eq!(audit[0], serde_json::to_value(&stored[0]).unwrap());
    let resolved = &audit.iter().find(|e| e["kind"] == "Resolved").unwrap()["details"];
    let details: Value = serde_json::from_str(resolved.as_str().unwrap()).unwrap();
    assert_eq!(details["by"], "ana");
    let (status, body) = api.post(&path, json!({"note": "again"})).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("conflict")));

    let (_, letters) = api.get("/api/dead-letters").await;
    let letters = letters["letters"].as_array().unwrap().clone();
    assert_eq!(letters.len(), 5);
    let parked_letter = letters
        .iter()
        .find(|l| l["saga"] == "parked")
        .expect("a row names its saga");
    assert_eq!(parked_letter["task_status"], "DeadLettered");
    let letter_id = parked_letter["id"].as_str().unwrap();

    let discard = format!("/api/dead-letters/{letter_id}/discard");
    let (status, body) = api.post(&discard, json!({})).await;
    assert_eq!(status, 422, "{body}");
    let (status, _) = api.post(&discard, json!({"note": "obsolete order"})).await;
    assert_eq!(status, 200);
    let (status, body) = api.post(&discard, json!({"note": "obsolete order"})).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    let task = engine.task(parked).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::DeadLettered, "kept for a resolve");
    let entry = task.audit_log.last().unwrap();
    assert_eq!(entry.action, saga_runtime::AuditAction::DeadLetterDiscarded);
    assert!(entry.details.as_deref().unwrap().contains("\"by\":\"ana\""));
    assert!(entry.details.as_deref().unwrap().contains("obsolete order"));

    // A selection that picks nothing requeues nothing.
    let (status, bulk) = api
        .post(
            "/api/dead-letters/requeue",
            json!({"saga": "gate", "step": "nope"}),
        )
        .await;
    assert_eq!((status, &bulk["done"]), (200, &json!([])), "{bulk}");
    assert_eq!(bulk["scanned"], json!(4));
    let (status, body) = api
        .post("/api/dead-letters/requeue", json!({"sgaa": "gate"}))
        .await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = api.post("/api/dead-letters/requeue", json!({})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("invalid_input"))
    );

    gate.store(true, Ordering::SeqCst);
    let letter_of = |id: TaskId| {
        let id = id.to_string();
        let letter = letters.iter().find(|l| l["task_id"] == json!(id)).unwrap();
        format!(
            "/api/dead-letters/{}/requeue",
            letter["id"].as_str().unwrap()
        )
    };
    // One letter, with a note; a body that is not one is refused.
    let (status, body) = api.post(&letter_of(gated[0]), json!({"nota": "x"})).await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = api.post(&letter_of(gated[0]), json!({"note": 5})).await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = api
        .post(&letter_of(gated[0]), json!({"note": "the gate is fixed"}))
        .await;
    assert_eq!(status, 200, "{body}");
    // And without a body, as the console's button sends it.
    let (status, body) = api.send("POST", &letter_of(gated[1]), None).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = api
        .post(
            "/api/dead-letters/requeue",
            json!({"saga": "gate", "nota": "all gates open"}),
        )
        .await;
    assert_eq!(
        status, 422,
        "a misspelt field is refused, not ignored: {body}"
    );
    let (_, bulk) = api
        .post(
            "/api/dead-letters/requeue",
            json!({"saga": "gate", "error_contains": "gate closed", "note": " all gates open "}),
        )
        .await;
    assert_eq!(bulk["done"].as_array().unwrap().len(), 2, "{bulk}");
    assert_eq!(bulk["failed"], json!([]));
    // Who requeued each task, and why, is in its audit log.
    let notes = ["the gate is fixed", "", "all gates open", "all gates open"];
    for (id, note) in gated.iter().zip(notes) {
        let task = engine.wait(*id).await.unwrap();
        assert_eq!(task.status, TaskStatus::Completed);
        assert_eq!(
            requeued_by(&task),
            [(json!("ana"), json!(note))],
            "{:#?}",
            task.audit_log
        );
    }
    let (_, letters) = api.get("/api/dead-letters").await;
    assert_eq!(letters["letters"], json!([]));
    // Its workers would take the next scenario's tasks on a shared Redis.
    engine.shutdown().await;
}

/// A task's progress streams as server-sent events, in order, and the
/// stream ends when the task does.
async fn progress_events(engine: Engine) {
    let api = serve(&engine).await;
    let id = engine.start::<Once>(3).await.unwrap();
    let events = api.events(&format!("/api/tasks/{id}/events")).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "step_started",
            "attempt_failed",
            "retry_scheduled",
            "step_started",
            "step_completed",
            "finished"
        ],
        "{events:?}"
    );
    assert_eq!(events[0].1["attempt"], json!(1));
    assert_eq!(events[2].1["delay_ms"], json!(300));
    assert_eq!(events[3].1["attempt"], json!(2));
    assert_eq!(events[5].1["status"], json!("Completed"));
    // A finished task replays its history and ends at once.
    let again = api.events(&format!("/api/tasks/{id}/events")).await;
    assert_eq!(again.last().unwrap().0, "finished");
    assert_eq!(
        api.get(&format!("/api/tasks/{}/events", TaskId::new()))
            .await
            .0,
        404
    );
    // Its workers would take the next scenario's tasks on a shared Redis.
    engine.shutdown().await;
}

/// Process-manager instances page by page, each with its pending
/// timeout.
async fn process_instances(engine: Engine) {
    let api = serve(&engine).await;
    for id in 0..5 {
        engine.publish(Remind { id }).await.unwrap();
    }
    let (_, names) = api.get("/api/processes").await;
    assert_eq!(names["processes"][0]["name"], json!("reminders"));
    let mut seen = std::collections::BTreeSet::new();
    let mut path = "/api/processes/reminders/instances?limit=2".to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, page) = api.get(&path).await;
        assert_eq!(status, 200, "{page}");
        for instance in page["instances"].as_array().unwrap() {
            seen.insert(instance["id"].as_str().unwrap().to_owned());
        }
        match page["next"].as_str() {
            Some(next) => {
                path = format!("/api/processes/reminders/instances?limit=2&cursor={next}")
            }
            None if seen.len() == 5 => break,
            None => {
                // Not all handled yet: list again from the start.
                assert!(tokio::time::Instant::now() < deadline, "{seen:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                seen.clear();
                path = "/api/processes/reminders/instances?limit=2".to_owned();
            }
        }
    }
    let some = seen.first().unwrap();
    let (status, body) = api
        .get(&format!("/api/processes/reminders/instances/{some}"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["instance"]["id"], json!(some));
    let timeouts = body["timeouts"].as_array().unwrap();
    assert_eq!(timeouts.len(), 1, "{body}");
    assert_eq!(timeouts[0]["instance"], json!(some));
    assert!(
        timeouts[0]["message_type"]
            .as_str()
            .unwrap()
            .contains("Nudge"),
        "{body}"
    );
    // Counted, and by status; filtered by status.
    let (_, listed) = api.get("/api/processes").await;
    assert_eq!(
        listed,
        json!({"processes": [{"name": "reminders", "total": 5, "counts": {"Active": 5}}]})
    );
    let (status, active) = api
        .get("/api/processes/reminders/instances?status=Active&limit=10")
        .await;
    assert_eq!(status, 200, "{active}");
    assert_eq!(active["instances"].as_array().unwrap().len(), 5, "{active}");
    let (status, done) = api
        .get("/api/processes/reminders/instances?status=Completed")
        .await;
    assert_eq!(
        (status, &done),
        (
            200,
            &json!({"instances": [], "next": null, "truncated": false})
        )
    );
    let (status, body) = api
        .get("/api/processes/reminders/instances?status=Done")
        .await;
    assert_eq!((status, body["code"].as_str()), (400, Some("bad_request")));
    let (status, body) = api.get("/api/processes/nope/instances").await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    let (status, _) = api.get("/api/processes/reminders/instances/nope").await;
    assert_eq!(status, 404);
    engine.shutdown().await;
}

/// Cancelling through the API records who asked and why, like the other
/// actions, and answers each outcome as a stable value.
async fn cancelling(engine: Engine) {
    let api = serve(&engine).await;
    let running = async |id: TaskId| {
        common::until("the task runs", async || {
            engine.task(id).await.unwrap().unwrap().status == TaskStatus::Running
        })
        .await
    };
    let asked = async |id: TaskId| -> Vec<Value> {
        let task = engine.task(id).await.unwrap().unwrap();
        task.audit_log
            .iter()
            .filter(|e| e.action == saga_runtime::AuditAction::CancellationRequested)
            .filter_map(|e| e.details.as_deref())
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    };
    let held = engine.start::<Hold>(1).await.unwrap();
    running(held).await;
    let path = format!("/api/tasks/{held}/cancel");
    let (status, body) = api.post(&path, json!({"nope": 1})).await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = api
        .post(&path, json!({"note": "the customer withdrew"}))
        .await;
    assert_eq!((status, body), (200, json!({"result": "Cancelled"})));
    // No body at all is fine too: the note is optional.
    let (status, body) = api.send("POST", &path, None).await;
    assert_eq!((status, body), (200, json!({"result": "AlreadyCancelled"})));
    assert_eq!(
        engine.wait(held).await.unwrap().status,
        TaskStatus::Cancelled
    );
    assert_eq!(
        asked(held).await,
        [json!({"by": "ana", "note": "the customer withdrew"})]
    );

    let quiet = engine.start::<Hold>(2).await.unwrap();
    running(quiet).await;
    // Declared JSON, sent empty (`curl -H 'Content-Type: application/json'
    // -X POST`): no note either.
    let (status, body) = api
        .with("Content-Type", "application/json")
        .send("POST", &format!("/api/tasks/{quiet}/cancel"), None)
        .await;
    assert_eq!((status, body), (200, json!({"result": "Cancelled"})));
    assert_eq!(asked(quiet).await, [json!({"by": "ana", "note": ""})]);

    let fine = engine.start::<Fine>(1).await.unwrap();
    engine.wait(fine).await.unwrap();
    let (status, body) = api
        .send("POST", &format!("/api/tasks/{fine}/cancel"), None)
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(
        (&body["code"], &body["result"], &body["status"]),
        (
            &json!("conflict"),
            &json!("NotCancellable"),
            &json!("Completed")
        ),
        "`fine` is not cancellable: {body}"
    );
    let (status, body) = api
        .send(
            "POST",
            &format!("/api/tasks/{}/cancel", TaskId::new()),
            None,
        )
        .await;
    assert_eq!(
        (status, &body["code"], &body["result"]),
        (404, &json!("not_found"), &json!("NotFound")),
        "{body}"
    );
    engine.shutdown().await;
}

/// A task id the API refuses says what a task id is, without the UUID
/// parser's words and without echoing a long input back.
async fn task_ids(engine: Engine) {
    let api = serve(&engine).await;
    let (status, body) = api.get("/api/tasks/4b6c1f0e").await;
    assert_eq!((status, body["code"].as_str()), (400, Some("bad_request")));
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("full UUID, 36 characters"), "{error}");
    assert!(error.contains("first 8 characters"), "{error}");
    assert!(!error.contains("invalid length"), "{error}");
    let (status, body) = api.send("POST", "/api/tasks/4b6c1f0e/cancel", None).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("first 8"),
        "{body}"
    );
    let long = "a".repeat(10_000);
    let (status, body) = api.get(&format!("/api/tasks/{long}")).await;
    assert_eq!(status, 400);
    assert!(body.to_string().len() < 400, "{body}");
    let (status, body) = api.get(&format!("/sagas/fine/{long}")).await;
    assert_eq!(status, 400);
    assert!(body.to_string().len() < 400, "{body}");
    engine.shutdown().await;
}

/// Every answer carries the security headers; the console's page keeps
/// the policy its handler set.
async fn security_headers(engine: Engine) {
    let api = serve(&engine).await;
    let head = |raw: String| -> Vec<(String, String)> {
        let (head, _) = raw.split_once("\r\n\r\n").unwrap();
        head.lines()
            .skip(1)
            .filter_map(|l| l.split_once(": "))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
            .collect()
    };
    let id = TaskId::new();
    for (method, path) in [
        ("GET", "/api/overview".to_owned()),
        ("GET", format!("/api/tasks/{id}")),
        ("GET", "/api/tasks/nope".to_owned()),
        ("POST", format!("/api/tasks/{id}/cancel")),
        ("GET", "/no/such/route".to_owned()),
    ] {
        let headers = head(api.raw(method, &path, None).await);
        for (name, value) in [
            ("x-content-type-options", "nosniff"),
            ("x-frame-options", "DENY"),
            ("referrer-policy", "no-referrer"),
            (
                "content-security-policy",
                "default-src 'none'; frame-ancestors 'none'",
            ),
        ] {
            assert!(
                headers.contains(&(name.to_owned(), value.to_owned())),
                "{method} {path}: {name}: {headers:?}"
            );
        }
    }
    let console = head(api.raw("GET", "/console", None).await);
    let policies: Vec<&String> = console
        .iter()
        .filter(|(n, _)| n == "content-security-policy")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(policies.len(), 1, "{console:?}");
    assert_ne!(
        policies[0], "default-src 'none'; frame-ancestors 'none'",
        "the console's own policy is kept"
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory() {
    process_instances(engine(None).await).await;
    access(engine(None).await).await;
    starting(engine(None).await).await;
    listing(engine(None).await).await;
    operator_actions(None).await;
    progress_events(engine(None).await).await;
    cancelling(engine(None).await).await;
    task_ids(engine(None).await).await;
    security_headers(engine(None).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let redis = TestRedis::start();
    starting(engine(Some(&redis)).await).await;
    redis.flush();
    listing(engine(Some(&redis)).await).await;
    redis.flush();
    operator_actions(Some(&redis)).await;
    progress_events(engine(Some(&redis)).await).await;
    process_instances(engine(Some(&redis)).await).await;
    redis.flush();
    cancelling(engine(Some(&redis)).await).await;
}

/// Event streams are capped: each polls the store for as long as its
/// client stays, so one more than the cap is refused (503) until a stream
/// ends, and then served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_are_capped() {
    let redis = TestRedis::start();
    // No workers: the tasks wait until a worker engine comes.
    let client = Engine::builder()
        .backend(redis.backend().await)
        .saga(Fine)
        .workers(0)
        .build()
        .await
        .unwrap();
    let api = Client::serve(Api::new(client.clone()).max_watchers(1).router()).await;
    let first = client.start::<Fine>(1).await.unwrap();
    let second = client.start::<Fine>(2).await.unwrap();
    // The first stream: open (its headers read) before the second asks.
    let mut stream = tokio::net::TcpStream::connect(api.addr).await.unwrap();
    let request = format!(
        "GET /api/tasks/{first}/events HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !String::from_utf8_lossy(&head).contains("\r\n\r\n") {
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "the first stream closed: {}",
            String::from_utf8_lossy(&head)
        );
        head.extend_from_slice(&buf[..n]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let watching = tokio::spawn(async move {
        let mut rest = String::new();
        stream.read_to_string(&mut rest).await.unwrap();
        String::from_utf8_lossy(&head).into_owned() + &rest
    });
    // The first stream holds the only place.
    let refused = async {
        loop {
            let (status, body) = api.get(&format!("/api/tasks/{second}/events")).await;
            if status == 503 {
                break body;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let body = tokio::time::timeout(Duration::from_secs(10), refused)
        .await
        .expect("a second stream is refused while the first is open");
    assert_eq!(body["code"], json!("too_many_watchers"), "{body}");
    // A worker ends both tasks; the first stream ends with its task and
    // frees its place.
    let workers = Engine::builder()
        .backend(redis.backend().await)
        .saga(Fine)
        .build()
        .await
        .unwrap();
    let events = tokio::time::timeout(Duration::from_secs(20), watching)
        .await
        .expect("the first stream ends with its task")
        .unwrap();
    assert!(events.contains("event: finished"), "{events}");
    client.wait(second).await.unwrap();
    let events = api.events(&format!("/api/tasks/{second}/events")).await;
    assert_eq!(
        events.last().map(|(name, _)| name.as_str()),
        Some("finished")
    );
    workers.shutdown().await;
    client.shutdown().await;
}
