//! `POST /api/messages`: another service publishes a message to the
//! process managers, over HTTP.
//!
//! The message is `{"type": "<Message::TYPE>", "payload": {..}}`, or, in
//! CloudEvents' HTTP binary mode, its JSON data as the body with the type
//! in `ce-type` (and its id in `ce-id`). Its id is the `Idempotency-Key`
//! header (or `ce-id`), which every message needs: a POST retried after a
//! lost answer is then handled once (the instance recognises the id).
//! Access, cross-site and size rules are those of every route that
//! changes something.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::access::Operator;
use super::reply::ApiError;
use super::ApiState;

/// The body without CloudEvents headers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageBody {
    #[serde(rename = "type")]
    message_type: String,
    payload: Value,
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
}

fn json_of(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let e = crate::model::decode::without_values(&e.to_string());
        ApiError::bad_request(format!("the body is not JSON: {e}"))
    })
}

/// `POST /api/messages`: 202 `{"message_id", "delivered_to"}`.
pub(super) async fn publish(
    State(state): State<ApiState>,
    Operator(by): Operator,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = header(&headers, "idempotency-key").or_else(|| header(&headers, "ce-id"));
    let Some(id) = id.map(str::to_owned) else {
        return Err(ApiError::bad_request(
            "a message needs an id: send it as the `Idempotency-Key` header (or `ce-id`), so \
             that a retried POST is handled once",
        ));
    };
    let (message_type, payload) = match header(&headers, "ce-type") {
        Some(t) => (t.to_owned(), json_of(&body)?),
        None => {
            let parsed: MessageBody = serde_json::from_value(json_of(&body)?).map_err(|e| {
                ApiError::bad_request(format!(
                    "expected `{{\"type\": \"<message type>\", \"payload\": {{..}}}}` (or the \
                     payload alone with a `ce-type` header): {e}"
                ))
            })?;
            (parsed.message_type, parsed.payload)
        }
    };
    let delivered = state
        .engine
        .publish_raw(&id, &message_type, payload)
        .await?;
    tracing::info!(message_id = %id, %message_type, by, "message published through the HTTP API");
    let answer = json!({ "message_id": id, "delivered_to": delivered });
    Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
}
