//! `/api/tasks` and `/api/sagas`: list, read, start, cancel, resolve and
//! retry tasks, and stream one task's progress.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::access::Operator;
use super::reads::Reader;
use super::reply::{task_id, ApiError};
use super::watchers::Watcher;
use super::ApiState;
use crate::engine::{CancelResult, Intervention, TaskFilter};
use crate::error::Error;
use crate::model::task::{TaskId, TaskInstance, TaskStatus, Timestamp};

/// `GET /api/sagas`: each saga's newest definition.
pub(super) async fn sagas(State(state): State<ApiState>, _reader: Reader) -> Json<Value> {
    let sagas: Vec<Value> = state
        .engine
        .sagas()
        .into_iter()
        .map(|def| {
            json!({
                "name": def.name,
                "version": def.version,
                "cancellable": def.cancellable,
                "steps": def.steps.iter().map(|s| s.name).collect::<Vec<_>>(),
            })
        })
        .collect();
    Json(json!({ "sagas": sagas }))
}

/// The filters of `GET /api/tasks`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListParams {
    saga: Option<String>,
    status: Option<String>,
    step: Option<String>,
    error: Option<String>,
    /// Created at or after, in ms since the epoch.
    from: Option<u64>,
    /// Created before, in ms since the epoch.
    to: Option<u64>,
    cursor: Option<String>,
    limit: Option<usize>,
}

/// A task in a listing: what a table row shows.
#[derive(Debug, Serialize)]
pub(super) struct TaskSummary {
    id: TaskId,
    saga: String,
    status: TaskStatus,
    step: Option<String>,
    error: Option<String>,
    created_at: Timestamp,
    updated_at: Timestamp,
    finished_at: Option<Timestamp>,
}

impl From<TaskInstance> for TaskSummary {
    fn from(task: TaskInstance) -> Self {
        TaskSummary {
            step: task.current_step().map(|s| s.name.clone()),
            id: task.id,
            saga: task.saga,
            status: task.status,
            error: task.error,
            created_at: task.created_at,
            updated_at: task.updated_at,
            finished_at: task.finished_at,
        }
    }
}

/// The most rows of one page of `GET /api/tasks` (the engine's own cap).
const MAX_ROWS: usize = 1000;

/// `GET /api/tasks?saga=&status=&step=&error=&from=&to=&cursor=&limit=`:
/// a page of tasks, newest first, with the cursor of the next, and
/// `truncated` when a filter by step or error text stopped its search at
/// the reader's budget before the page was full.
pub(super) async fn list(
    State(state): State<ApiState>,
    reader: Reader,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(params) = params?;
    let limit = reader.rows(params.limit, MAX_ROWS);
    let mut filter = TaskFilter::new()
        .limit(limit)
        .scan_limit(reader.scan(state.scan_limit));
    if let Some(saga) = params.saga.filter(|s| !s.is_empty()) {
        if !state.engine.sagas().iter().any(|d| d.name == saga) {
            return Err(Error::UnknownSaga(saga).into());
        }
        filter = filter.saga(saga);
    }
    if let Some(status) = params.status.filter(|s| !s.is_empty()) {
        filter = filter.status(status.parse().map_err(ApiError::bad_request)?);
    }
    filter.step = params.step.filter(|s| !s.is_empty());
    filter.error_contains = params.error.filter(|s| !s.is_empty());
    filter.created_from = params.from.map(Timestamp);
    filter.created_to = params.to.map(Timestamp);
    filter.cursor = params.cursor.filter(|s| !s.is_empty());
    let scans = filter.step.is_some() || filter.error_contains.is_some();
    let page = state.engine.tasks(filter).await?;
    // A search stopped by its budget comes back short with a cursor; a
    // page that is not searched is short only at the end.
    let truncated = scans && page.tasks.len() < limit && page.next.is_some();
    let tasks: Vec<TaskSummary> = page.tasks.into_iter().map(Into::into).collect();
    Ok(Json(
        json!({ "tasks": tasks, "next": page.next, "truncated": truncated }),
    ))
}

/// `GET /api/tasks/{id}`: the whole task (steps, audit log, trace id).
pub(super) async fn get(
    State(state): State<ApiState>,
    _reader: Reader,
    Path(id): Path<String>,
) -> Result<Json<TaskInstance>, ApiError> {
    let id = task_id(&id)?;
    state
        .engine
        .task(id)
        .await?
        .map(Json)
        .ok_or_else(ApiError::task_not_found)
}

/// The body of `POST /api/sagas/{saga}/tasks`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StartBody {
    /// The saga's input, as its input type serializes.
    input: Value,
    /// Starts at most one task per key.
    key: Option<String>,
}

/// `POST /api/sagas/{saga}/tasks` `{"input": .., "key": ..}`: 201
/// `{"id": ..}`; 422 if the input does not decode as the saga's input.
pub(super) async fn start(
    State(state): State<ApiState>,
    Operator(by): Operator,
    Path(saga): Path<String>,
    body: Result<Json<StartBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    let id = state
        .engine
        .start_json(&saga, body.input, body.key.as_deref())
        .await?;
    tracing::info!(task_id = %id, saga, by, "task started through the HTTP API");
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))).into_response())
}

/// The body of `POST /api/tasks/{id}/cancel`: the shape of every operator
/// action's, with the note optional. A cancellation is the saga's own way
/// out (its compensations clean up), so there may be nothing to explain;
/// who asked is recorded either way.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CancelBody {
    #[serde(default)]
    note: Option<String>,
}

/// `POST /api/tasks/{id}/cancel` (body optional: `{"note": ..}`): records
/// who asked (and why) in the task's audit log, and answers the outcome
/// as a stable value (see [`cancel_answer`]).
pub(super) async fn cancel(
    State(state): State<ApiState>,
    Operator(by): Operator,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = task_id(&id)?;
    let note = optional_note(&headers, &body)?;
    let result = state
        .engine
        .cancel_by_operator(id, Intervention::new(by, note))
        .await?;
    Ok(cancel_answer(result))
}

/// The note of a cancellation's (or a dead letter's requeue's) body: none
/// for no body (or an empty one, whatever its type), else the body must be
/// JSON, `{"note": ..}`. Both actions are a saga's ordinary way on, so a
/// caller (the console's button) may have nothing to explain, and who
/// acted is recorded either way.
pub(super) fn optional_note(headers: &HeaderMap, body: &Bytes) -> Result<String, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(String::new());
    }
    // `application/json`, or `application/<x>+json`, as axum's `Json` takes.
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|m| {
            m.strip_prefix("application/")
                .is_some_and(|sub| sub == "json" || sub.ends_with("+json"))
        });
    if !json {
        return Err(ApiError::not_json());
    }
    let Json(body) = Json::<CancelBody>::from_bytes(body)?;
    Ok(body.note.map(|n| n.trim().to_owned()).unwrap_or_default())
}

/// A cancellation's outcome as `result`, a [`CancelResult`] variant's
/// name: 200 `Cancelled` or `AlreadyCancelled`; 404 `NotFound`; 409
/// `AlreadyCompleted`, or `NotCancellable` with the task's `status`
/// (the errors in the shape of every error, with their `code`).
pub(super) fn cancel_answer(result: CancelResult) -> Response {
    let refused = |message: String, result: &str, status: TaskStatus| {
        ApiError::conflict(message)
            .with("result", result)
            .with("status", status.as_str())
            .into_response()
    };
    match result {
        CancelResult::Cancelled => Json(json!({ "result": "Cancelled" })).into_response(),
        CancelResult::AlreadyCancelled => {
            Json(json!({ "result": "AlreadyCancelled" })).into_response()
        }
        CancelResult::NotFound => ApiError::task_not_found()
            .with("result", "NotFound")
            .into_response(),
        CancelResult::AlreadyCompleted => refused(
            "Task already completed, cannot cancel".to_owned(),
            "AlreadyCompleted",
            TaskStatus::Completed,
        ),
        CancelResult::NotCancellable(status) => refused(
            format!("Task is {status}: it cannot be cancelled"),
            "NotCancellable",
            status,
        ),
    }
}

/// The body of an operator action: why.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NoteBody {
    note: String,
}

/// The intervention of `by` with the note of `body` (which must say
/// something: it is what the next operator reads).
pub(super) fn intervention(
    by: String,
    body: Result<Json<NoteBody>, JsonRejection>,
) -> Result<Intervention, ApiError> {
    let Json(body) = body?;
    if body.note.trim().is_empty() {
        return Err(ApiError::invalid("`note` must say what was found and done"));
    }
    Ok(Intervention::new(by, body.note))
}

/// `POST /api/tasks/{id}/resolve` `{"note": ..}`: the resolved task.
pub(super) async fn resolve(
    State(state): State<ApiState>,
    Operator(by): Operator,
    Path(id): Path<String>,
    body: Result<Json<NoteBody>, JsonRejection>,
) -> Result<Json<TaskInstance>, ApiError> {
    let id = task_id(&id)?;
    let intervention = intervention(by, body)?;
    Ok(Json(state.engine.resolve(id, intervention).await?))
}

/// `POST /api/tasks/{id}/retry-compensation` `{"note": ..}`.
pub(super) async fn retry_compensation(
    State(state): State<ApiState>,
    Operator(by): Operator,
    Path(id): Path<String>,
    body: Result<Json<NoteBody>, JsonRejection>,
) -> Result<Json<TaskInstance>, ApiError> {
    let id = task_id(&id)?;
    let intervention = intervention(by, body)?;
    Ok(Json(
        state.engine.retry_compensation(id, intervention).await?,
    ))
}

/// `GET /api/tasks/{id}/events`: the task's progress as server-sent
/// events, named as [`ProgressEvent::name`](crate::engine::ProgressEvent::name),
/// from its start to `finished`; a `watch_error` event (not `error`, which
/// browsers' `EventSource` uses for a dropped connection) if the store
/// stays unreachable.
pub(super) async fn events(
    State(state): State<ApiState>,
    reader: Reader,
    Path(id): Path<String>,
    extensions: axum::http::Extensions,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let id = task_id(&id)?;
    let watcher = Watcher {
        operator: reader.operator(),
        client: extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|info| info.0.ip()),
    };
    let watching = state.watchers.open(watcher)?;
    // Unknown tasks answer 404 like everywhere else, not an empty stream.
    state
        .engine
        .task(id)
        .await?
        .ok_or_else(ApiError::task_not_found)?;
    // The stream holds its place until it ends or its client leaves.
    let stream = state.engine.watch(id).map(move |item| {
        let _watching = &watching;
        let event = match item {
            Ok(progress) => Event::default()
                .event(progress.event.name())
                .json_data(&progress),
            Err(error) => Event::default()
                .event("watch_error")
                .json_data(json!({ "error": error.to_string() })),
        };
        Ok(event.unwrap_or_else(|_| Event::default().event("watch_error")))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
