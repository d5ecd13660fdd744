//! The per-saga routes that came before `/api`: `GET` and (for
//! `#[cancellable]` sagas) `DELETE /sagas/{saga}/{task_id}`. `DELETE`
//! changes something, so it needs the configured access like `/api`, and
//! records the operator in the task's audit log as `/api` does; it answers
//! what it always has.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::access::Operator;
use super::reads::Reader;
use super::reply::{task_id, ApiError};
use super::ApiState;
use crate::engine::{CancelResult, Engine, Intervention};
use crate::error::Error;
use crate::model::task::TaskInstance;

pub(super) fn routes(mut router: Router<ApiState>, engine: &Engine) -> Router<ApiState> {
    for def in engine.sagas() {
        let saga = def.name;
        let route = get(
            move |State(state): State<ApiState>, _reader: Reader, Path(id): Path<String>| {
                get_task(state, saga, id)
            },
        );
        // Some versions may be cancellable and others not: the route is
        // there if any is, and the task's own version decides.
        let route = if engine.any_version_cancellable(saga) {
            route.delete(
                move |State(state): State<ApiState>,
                      Operator(by): Operator,
                      Path(id): Path<String>| cancel_task(state, by, saga, id),
            )
        } else {
            route
        };
        router = router.route(&format!("/sagas/{saga}/{{task_id}}"), route);
    }
    router
}

async fn get_task(
    state: ApiState,
    saga: &'static str,
    id: String,
) -> Result<Json<TaskInstance>, ApiError> {
    let id = task_id(&id)?;
    match state.engine.task(id).await? {
        Some(task) if task.saga == saga => Ok(Json(task)),
        _ => Err(ApiError::task_not_found()),
    }
}

async fn cancel_task(
    state: ApiState,
    by: String,
    saga: &'static str,
    id: String,
) -> Result<Response, ApiError> {
    let id = task_id(&id)?;
    let result = state
        .engine
        .cancel_by_operator_of(saga, id, Intervention::new(by, ""))
        .await;
    cancel_reply(result.map_err(|e| match e {
        Error::WrongSaga { task, .. } => Error::TaskNotFound(task),
        e => e,
    }))
}

/// What `DELETE /sagas/{saga}/{task_id}` has always answered (the seed's
/// promise, kept for its callers): 200 `{"status": "Cancelled"}` or
/// `{"status": "Already cancelled"}`, 404, or 409. `/api` answers stable
/// values instead (`tasks::cancel_answer`).
fn cancel_reply(result: Result<CancelResult, Error>) -> Result<Response, ApiError> {
    match result? {
        CancelResult::Cancelled => Ok(Json(json!({ "status": "Cancelled" })).into_response()),
        CancelResult::AlreadyCancelled => {
            Ok(Json(json!({ "status": "Already cancelled" })).into_response())
        }
        CancelResult::NotFound => Err(ApiError::task_not_found()),
        CancelResult::AlreadyCompleted => {
            Err(ApiError::conflict("Task already completed, cannot cancel"))
        }
        CancelResult::NotCancellable(status) => Err(ApiError::conflict(format!(
            "Task is {status}, cannot cancel"
        ))),
    }
}
