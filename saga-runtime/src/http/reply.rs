//! Every answer that is not a success has one shape:
//! `{"error": "<what happened, for a person>", "code": "<for a program>"}`,
//! with the status that says the same. An unknown saga, process manager,
//! task or dead letter all answer 404 `not_found`.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::backend::BackendError;
use crate::error::Error;
use crate::model::task::TaskId;

/// An error answer.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Fields an answer adds to the shape (a cancellation's `result`).
    extra: serde_json::Map<String, serde_json::Value>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            extra: serde_json::Map::new(),
        }
    }

    /// The answer with `key: value` besides `error` and `code`.
    pub(crate) fn with(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.extra.insert(key.to_owned(), value.into());
        self
    }

    /// The status and code, for a test of what a rule answers.
    #[cfg(test)]
    pub(crate) fn status_and_code(&self) -> (u16, &'static str) {
        (self.status.as_u16(), self.code)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn task_not_found() -> Self {
        ApiError::not_found("Task not found")
    }

    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, "conflict", message)
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", message)
    }

    /// A body that is not sent as JSON.
    pub(crate) fn not_json() -> Self {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send a JSON body with `Content-Type: application/json` (for example \
             `{\"note\": \"what was found and done\"}`)",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = self.extra;
        body.insert("error".to_owned(), json!(self.message));
        body.insert("code".to_owned(), json!(self.code));
        (self.status, Json(body)).into_response()
    }
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        let message = error.to_string();
        match error {
            Error::TaskNotFound(_) | Error::WrongSaga { .. } => ApiError::task_not_found(),
            Error::UnknownSaga(saga) => ApiError::not_found(format!("Saga `{saga}` not found")),
            Error::UnknownMessageType(_) => ApiError::not_found(message),
            Error::UnknownProcess(name) => {
                ApiError::not_found(format!("Process manager `{name}` not found"))
            }
            Error::DeadLetterNotFound(_) => ApiError::not_found(message),
            Error::NotResolvable { .. }
            | Error::ResolvedTask(_)
            | Error::TaskGone(_)
            | Error::WriteRefused { .. }
            | Error::DeadLetterTruncated { .. }
            | Error::KeyReused { .. } => ApiError::conflict(message),
            Error::InvalidInput { .. } => ApiError::invalid(message),
            Error::InvalidCursor(_) | Error::Backend(BackendError::InvalidCursor(_)) => {
                ApiError::bad_request(message)
            }
            // What failed, not why: the store's own words (an address, an
            // OS error, a script's text) are for the log.
            Error::Unavailable {
                operation,
                attempts,
                ..
            } => {
                tracing::warn!(error = %message, "HTTP request failed: the store is unreachable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!(
                        "The task store could not be reached (`{operation}`, {attempts} tries); \
                         try again later"
                    ),
                )
            }
            Error::Backend(_) => {
                tracing::warn!(error = %message, "HTTP request failed: the store refused it");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "The task store failed to answer this request; the server's log says why",
                )
            }
            _ => {
                tracing::warn!(error = %message, "HTTP request failed");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        match rejection {
            // No body at all, the usual mistake with a `curl -X POST`.
            JsonRejection::MissingJsonContentType(_) => ApiError::not_json(),
            rejection => ApiError::new(
                rejection.status(),
                "bad_request",
                without_values(&rejection.body_text()),
            ),
        }
    }
}

/// A body's decoding error as axum words it, without the values serde
/// quotes (`note: invalid type: integer `4111`, expected a string`): an
/// error body is logged and shown, and the value is the caller's data.
fn without_values(text: &str) -> String {
    const KINDS: &[&str] = &[
        "invalid type: ",
        "invalid value: ",
        "unknown variant `",
        "unknown field `",
        "duplicate field `",
    ];
    match KINDS.iter().filter_map(|k| text.find(k)).min() {
        Some(at) => format!(
            "{}{}",
            &text[..at],
            crate::model::decode::without_values(&text[at..])
        ),
        None => text.to_owned(),
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::bad_request(without_values(&rejection.body_text()))
    }
}

/// Turns the error answers axum makes itself (a method a route does not
/// have, a path that does not decode, a body too large) into the shape
/// of every other error, keeping their status and headers (`Allow`).
pub(crate) async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let message = match text.trim() {
        "" => status.canonical_reason().unwrap_or("error").to_owned(),
        text => text.to_owned(),
    };
    let code = match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        s if s.is_server_error() => "internal",
        _ => "bad_request",
    };
    parts.headers.remove(axum::http::header::CONTENT_TYPE);
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    let mut answer = ApiError::new(status, code, message).into_response();
    answer.headers_mut().extend(parts.headers);
    answer
}

/// The security headers of every answer, added where the handler set
/// none of its own (the console's page sets its policy): an answer is not
/// sniffed into another type, framed by another site, or named in the
/// `Referer` of a link it holds; and an answer that is not a page (JSON,
/// an event stream, metrics) loads nothing if a browser renders it.
pub(crate) async fn security_headers(mut response: Response) -> Response {
    use axum::http::{header, HeaderValue};
    let page = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/html"));
    let headers = response.headers_mut();
    let mut add = |name, value| {
        headers
            .entry(name)
            .or_insert(HeaderValue::from_static(value));
    };
    add(header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    add(header::X_FRAME_OPTIONS, "DENY");
    add(header::REFERRER_POLICY, "no-referrer");
    if !page {
        add(
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; frame-ancestors 'none'",
        );
    }
    response
}

/// `id` as a task id, or 400 saying what a task id is (never the UUID
/// parser's words, never more than the start of a long `id`).
pub(crate) fn task_id(id: &str) -> Result<TaskId, ApiError> {
    id.parse()
        .map_err(|e: crate::model::task::TaskIdError| ApiError::bad_request(e.to_string()))
}
