//! `POST /api/messages`: a service without this library publishes to the
//! process managers over HTTP, with the API's access rules; its id (the
//! `Idempotency-Key`) makes a retried POST count once.

mod common;

use std::time::Duration;

use common::http_client::Client;
use saga_runtime::http::Api;
use saga_runtime::prelude::*;
use sagas_tests::shop::Fulfillment;
use serde_json::json;

const TOKEN: &str = "s3cret";

async fn served() -> (Engine, Client) {
    let engine = Engine::builder()
        .process_manager(Fulfillment)
        .build()
        .await
        .unwrap();
    let api = Client::serve(Api::new(engine.clone()).token(TOKEN).router()).await;
    (engine, api)
}

async fn counted(engine: &Engine, order: &str) -> Vec<u64> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let state = engine.process_state::<Fulfillment>(order).await.unwrap();
        if let Some(state) = state.filter(|s| !s.counted.is_empty()) {
            return state.counted;
        }
        assert!(tokio::time::Instant::now() < deadline, "never handled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_message_posted_twice_with_one_key_is_handled_once() {
    let (engine, api) = served().await;
    let operator = api.with("Authorization", &format!("Bearer {TOKEN}"));
    let start =
        json!({"type": "OrderSubmitted", "payload": {"order_id": "o-1", "order_number": "A-1"}});
    let (status, body) = operator
        .with("Idempotency-Key", "submit-1")
        .post("/api/messages", start)
        .await;
    assert_eq!((status, &body["delivered_to"]), (202, &json!(1)), "{body}");
    let count = json!({"type": "Counted", "payload": {"order_id": "o-1", "n": 7}});
    for _ in 0..3 {
        let (status, _) = operator
            .with("Idempotency-Key", "count-1")
            .post("/api/messages", count.clone())
            .await;
        assert_eq!(status, 202);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        counted(&engine, "o-1").await,
        [7],
        "a retried POST counted twice"
    );
}

#[tokio::test]
async fn cloudevents_binary_mode_is_read() {
    let (engine, api) = served().await;
    let operator = api.with("Authorization", &format!("Bearer {TOKEN}"));
    let ce = operator
        .with("ce-type", "OrderSubmitted")
        .with("ce-id", "evt-1")
        .with("ce-specversion", "1.0");
    let (status, body) = ce
        .post(
            "/api/messages",
            json!({"order_id": "o-2", "order_number": "A-2"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["message_id"], "evt-1");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while engine
        .process_instance::<Fulfillment>("o-2")
        .await
        .unwrap()
        .is_none()
    {
        assert!(tokio::time::Instant::now() < deadline, "never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn what_cannot_be_published_is_refused_with_a_reason() {
    let (_engine, api) = served().await;
    let message = json!({"type": "Counted", "payload": {"order_id": "o-3", "n": 1}});
    // No token: a publish changes something.
    let (status, body) = api
        .with("Idempotency-Key", "k")
        .post("/api/messages", message.clone())
        .await;
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));
    let operator = api.with("Authorization", &format!("Bearer {TOKEN}"));
    // No id: a retry could not be recognised.
    let (status, body) = operator.post("/api/messages", message.clone()).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("Idempotency-Key"));
    // A type nothing handles.
    let (status, body) = operator
        .with("Idempotency-Key", "k")
        .post("/api/messages", json!({"type": "Nope", "payload": {}}))
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"].as_str().unwrap().contains("`Nope`"));
    // Not the shape.
    let (status, body) = operator
        .with("Idempotency-Key", "k")
        .post("/api/messages", json!({"kind": "Counted"}))
        .await;
    assert_eq!(status, 400, "{body}");
}
