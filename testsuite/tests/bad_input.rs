//! Bad input never disappears: a malformed message, an unknown saga name or a
//! payload that does not deserialize is dead-lettered with a clear reason,
//! and the other tasks are unaffected; and the reason says where and what
//! kind, never the input's value.

mod common;

use std::time::Duration;

use saga_runtime::backend::{QueueMessage, WorkItem};
use saga_runtime::prelude::*;
use sagas_tests::double::Double;

#[tokio::test(start_paused = true)]
async fn malformed_unknown_and_undeserializable_messages_are_dead_lettered() {
    let engine = Engine::builder().saga(Double).build().await.unwrap();
    let backend = engine.backend().clone();

    backend.enqueue_raw(b"{not json").await.unwrap();
    let stray = TaskId::new();
    let unknown = QueueMessage {
        task_id: stray,
        saga: "no-such-saga".into(),
        seq: 0,
    };
    backend.enqueue(&[WorkItem::Saga(unknown)]).await.unwrap();
    // A task whose stored input is not a u32 (as after an incompatible deploy).
    let bad = TaskInstance::new(
        "double",
        serde_json::json!({"n": "three"}),
        [("double".to_owned(), 1)],
    );
    let bad_id = bad.id;
    backend
        .create_task(
            &bad,
            &QueueMessage {
                task_id: bad.id,
                saga: "double".into(),
                seq: 0,
            },
        )
        .await
        .unwrap();
    let good = engine.start::<Double>(21).await.unwrap();

    let done = engine.wait(good).await.unwrap();
    assert_eq!(
        done.output_as::<u32>().unwrap().unwrap(),
        42,
        "other tasks are unaffected"
    );
    let parked = engine.wait(bad_id).await.unwrap();
    assert_eq!(parked.status, TaskStatus::DeadLettered);

    // A message for a saga this worker does not run goes back for a worker
    // that does (a rolling deploy), with growing delays; only at the
    // delivery cap is it dead-lettered.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let letters = engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    let reason = |pred: &dyn Fn(&saga_runtime::DeadLetter) -> bool| {
        letters
            .iter()
            .find(|l| pred(l))
            .map(|l| l.reason.clone())
            .expect("dead letter missing")
    };
    assert_eq!(letters.len(), 3, "{letters:#?}");
    let malformed = reason(&|l| l.payload == "{not json");
    assert!(malformed.starts_with("malformed message"), "{malformed}");
    let unknown = reason(&|l| l.task_id == Some(stray));
    assert!(
        unknown.contains("unknown saga `no-such-saga`") && unknown.contains("[double]"),
        "{unknown}"
    );
    let undeserializable = reason(&|l| l.task_id == Some(bad_id));
    assert!(
        undeserializable.contains("does not deserialize as `u32`"),
        "{undeserializable}"
    );
}

#[tokio::test(start_paused = true)]
async fn starting_an_unregistered_saga_is_an_error_not_a_lost_task() {
    let engine = Engine::builder().build().await.unwrap();
    let err = engine.start::<Double>(1).await.unwrap_err();
    assert!(
        err.to_string().contains("`double` is not registered"),
        "{err}"
    );
}

/// A payment's input: the card number is what must not leak.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Card {
    number: u64,
    holder: String,
}

struct Pay;

#[saga(name = "pay")]
impl Pay {
    #[saga_step(1)]
    async fn charge(&self, card: Card) -> Result<u64, StepError> {
        Ok(card.number % 10)
    }
}

const CARD: &str = "4111 1111 1111 1111";

/// serde_json's messages quote the value they refuse (`invalid type:
/// string "4111 1111 1111 1111", expected u64`): a bad input's value is in
/// neither the HTTP 422 body, nor the task's error, nor the dead letter,
/// on a real redis-server; where it failed and why are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_inputs_value_is_never_echoed() {
    let redis = common::redis_server::TestRedis::start();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .saga(Pay)
        .build()
        .await
        .unwrap();
    let api = common::http_client::Client::serve(
        saga_runtime::http::Api::new(engine.clone())
            .token("t")
            .router(),
    )
    .await
    .with("Authorization", "Bearer t");
    let input = serde_json::json!({"number": CARD, "holder": "Ada"});

    // Refused at the door.
    let (status, body) = api
        .post(
            "/api/sagas/pay/tasks",
            serde_json::json!({ "input": input }),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let text = body.to_string();
    assert!(
        !text.contains("4111"),
        "the 422 body echoes the card: {text}"
    );
    assert!(
        text.contains("number: invalid type: string, expected u64"),
        "{text}"
    );

    // A request body of the wrong shape: axum's words, not the value.
    let (status, body) = api
        .post(
            &format!("/api/tasks/{}/resolve", TaskId::new()),
            serde_json::json!({ "note": 4111111111111111u64 }),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let text = body.to_string();
    assert!(
        !text.contains("4111"),
        "the 422 body echoes the value: {text}"
    );
    assert!(text.contains("note: invalid type: integer"), "{text}");

    // Stored as is (an older version's input, a record written by hand):
    // the step cannot decode it, and the task is dead-lettered.
    let bad = TaskInstance::new("pay", input, [("charge".to_owned(), 1)]);
    let message = QueueMessage {
        task_id: bad.id,
        saga: "pay".into(),
        seq: 0,
    };
    engine.backend().create_task(&bad, &message).await.unwrap();
    let parked = tokio::time::timeout(Duration::from_secs(20), engine.wait(bad.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parked.status, TaskStatus::DeadLettered);
    let error = parked.error.clone().unwrap_or_default();
    assert!(
        error.contains("number: invalid type: string, expected u64"),
        "{error}"
    );
    let mut record = serde_json::to_value(&parked).unwrap();
    record["input"] = serde_json::Value::Null;
    let record = record.to_string();
    assert!(
        !record.contains("4111"),
        "the task record echoes the card: {record}"
    );
    let letters = engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    let letter = letters
        .iter()
        .find(|l| l.task_id == Some(bad.id))
        .expect("the task's dead letter");
    assert!(
        letter.reason.contains("number: invalid type"),
        "{}",
        letter.reason
    );
    let letter = format!("{letter:?}");
    assert!(
        !letter.contains("4111"),
        "the dead letter echoes the card: {letter}"
    );
    // And what the API shows of both.
    for path in [
        format!("/api/tasks/{}", bad.id),
        "/api/dead-letters".to_owned(),
    ] {
        let (status, mut body) = api.get(&path).await;
        assert_eq!(status, 200, "{body}");
        if body.get("input").is_some() {
            body["input"] = serde_json::Value::Null;
        }
        assert!(!body.to_string().contains("4111"), "{path}: {body}");
    }
}
