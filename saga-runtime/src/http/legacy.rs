//! The per-saga routes that came before `/api`: `GET` and (for
//! `#[cancellable]` sagas) `DELETE /sagas/{saga}/{task_id}`. `DELETE`
//! changes something, so it needs the configured access like `/api`.

use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};

use super::access::Operator;
use super::reply::{task_id, ApiError};
use super::tasks::cancel_reply;
use super::ApiState;
use crate::engine::Engine;
use crate::error::Error;
use crate::model::task::TaskInstance;

pub(super) fn routes(mut router: Router<ApiState>, engine: &Engine) -> Router<ApiState> {
    for def in engine.sagas() {
        let saga = def.name;
        let route = get(
            move |State(state): State<ApiState>, Path(id): Path<String>| get_task(state, saga, id),
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
    let result = state.engine.cancel_by_name(saga, id).await;
    tracing::info!(task_id = %id, by, ?result, "cancel requested through the HTTP API");
    cancel_reply(result.map_err(|e| match e {
        Error::WrongSaga { task, .. } => Error::TaskNotFound(task),
        e => e,
    }))
}
