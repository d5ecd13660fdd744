//! `/api/dead-letters`: list, read, requeue (one or in bulk) and discard.

use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::access::Operator;
use super::reads::Reader;
use super::reply::ApiError;
use super::tasks::{intervention, optional_note, NoteBody};
use super::ApiState;
use crate::engine::{Bulk, DeadLetterFilter, DeadLetterSelection, Intervention};
use crate::error::Error;
use crate::DeadLetter;

/// The paging of `GET /api/dead-letters`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PageParams {
    cursor: Option<String>,
    limit: Option<usize>,
}

/// The most rows `GET /api/dead-letters` answers in one page.
const MAX_ROWS: usize = 200;

/// `GET /api/dead-letters?cursor=&limit=`: newest first, with each
/// letter's task status when it has a task.
pub(super) async fn list(
    State(state): State<ApiState>,
    reader: Reader,
    params: Result<Query<PageParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(params) = params?;
    // Each row loads its letter's task: the page is kept small so that a
    // read cannot make the store read thousands of tasks (an anonymous
    // one, where reads are open, a page of the public read limit).
    let limit = reader.rows(params.limit, MAX_ROWS);
    let mut filter = DeadLetterFilter::new().limit(limit);
    if let Some(cursor) = params.cursor.filter(|c| !c.is_empty()) {
        filter = filter.after(cursor);
    }
    let page = state.engine.dead_letters(filter).await?;
    let mut letters = Vec::with_capacity(page.letters.len());
    for letter in page.letters {
        let task = match letter.task_id {
            Some(id) => state.engine.task(id).await?,
            None => None,
        };
        let mut row = serde_json::to_value(&letter).unwrap_or_default();
        if let (Some(task), Some(row)) = (task, row.as_object_mut()) {
            row.insert("saga".into(), json!(task.saga));
            row.insert("task_status".into(), json!(task.status));
            row.insert("step".into(), json!(task.current_step().map(|s| &s.name)));
        }
        letters.push(row);
    }
    Ok(Json(json!({ "letters": letters, "next": page.next })))
}

/// `GET /api/dead-letters/{id}`.
pub(super) async fn get(
    State(state): State<ApiState>,
    _reader: Reader,
    Path(id): Path<String>,
) -> Result<Json<DeadLetter>, ApiError> {
    match state.engine.dead_letter(&id).await? {
        Some(letter) => Ok(Json(letter)),
        None => Err(Error::DeadLetterNotFound(id).into()),
    }
}

/// `POST /api/dead-letters/{id}/requeue` (body optional: `{"note": ..}`):
/// records who requeued it and why in its task's `Requeued` audit entry.
/// The note is optional, as a cancellation's is (the console's button
/// sends none): a requeue after a fix is the letter's ordinary way on.
pub(super) async fn requeue(
    State(state): State<ApiState>,
    Operator(by): Operator,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let note = optional_note(&headers, &body)?;
    state
        .engine
        .requeue_by(&id, Intervention::new(by, note))
        .await?;
    Ok(Json(json!({ "requeued": id })))
}

/// `POST /api/dead-letters/{id}/discard` `{"note": ..}`.
pub(super) async fn discard(
    State(state): State<ApiState>,
    Operator(by): Operator,
    Path(id): Path<String>,
    body: Result<Json<NoteBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let intervention = intervention(by, body)?;
    state.engine.discard(&id, intervention).await?;
    Ok(Json(json!({ "discarded": id })))
}

/// The body of `POST /api/dead-letters/requeue`: a
/// [`DeadLetterSelection`] and the operator's note. Its own type, not the
/// selection flattened into one, because serde's `flatten` would let an
/// unknown (misspelt) field through, and a misspelt filter must not
/// widen what is requeued.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RequeueWhereBody {
    saga: Option<String>,
    step: Option<String>,
    error_contains: Option<String>,
    max: Option<usize>,
    /// Why (optional, as for one letter's requeue).
    note: Option<String>,
}

/// `POST /api/dead-letters/requeue` `{"saga": .., "step": ..,
/// "error_contains": .., "max": .., "note": ..}`: every letter the
/// selection picks, each requeued task's audit log recording who and why.
pub(super) async fn requeue_where(
    State(state): State<ApiState>,
    Operator(by): Operator,
    body: Result<Json<RequeueWhereBody>, JsonRejection>,
) -> Result<Json<Bulk>, ApiError> {
    let Json(body) = body?;
    if body.saga.is_none() && body.step.is_none() && body.error_contains.is_none() {
        return Err(ApiError::invalid(
            "pick the letters by `saga`, `step` or `error_contains`: a bulk requeue does not \
             take the whole queue",
        ));
    }
    let note = body.note.map(|n| n.trim().to_owned()).unwrap_or_default();
    let selection = DeadLetterSelection {
        saga: body.saga,
        step: body.step,
        error_contains: body.error_contains,
        max: body.max,
    };
    let bulk = state
        .engine
        .requeue_where_by(selection, Intervention::new(by, note))
        .await?;
    Ok(Json(bulk))
}
