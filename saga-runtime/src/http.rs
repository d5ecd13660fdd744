//! HTTP routes to inspect and cancel tasks (feature `http`, axum 0.8).
//!
//! Mount [`router`] in your application:
//!
//! - `GET /sagas/{saga}/{task_id}`: the task with its steps and audit log,
//!   as JSON (404 when it does not exist or belongs to another saga);
//! - `DELETE /sagas/{saga}/{task_id}`, only for `#[cancellable]` sagas:
//!   200 `{"status":"Cancelled"}`, 200 `{"status":"Already cancelled"}`,
//!   404, or 409 `{"error":"Task already completed, cannot cancel"}` (409 too
//!   for a task that failed or is compensating). A saga that is not
//!   cancellable has no DELETE route at all (so the method is not allowed).
//!
//! Add authentication and authorisation as axum layers around it: the routes
//! trust their caller.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::engine::{CancelResult, Engine};
use crate::error::Error;
use crate::task::TaskId;

/// The routes of every saga registered with `engine`.
pub fn router(engine: Engine) -> Router {
    let mut router = Router::new();
    for def in engine.sagas() {
        let saga = def.name;
        let route = get(
            move |State(engine): State<Engine>, Path(id): Path<String>| get_task(engine, saga, id),
        );
        // Some versions may be cancellable and others not: the route is
        // there if any is, and the task's own version decides.
        let route = if engine.any_version_cancellable(saga) {
            route.delete(
                move |State(engine): State<Engine>, Path(id): Path<String>| {
                    cancel_task(engine, saga, id)
                },
            )
        } else {
            route
        };
        router = router.route(&format!("/sagas/{saga}/{{task_id}}"), route);
    }
    router.with_state(engine)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

fn parse(id: &str) -> Option<TaskId> {
    id.parse().ok()
}

fn bad_id(id: &str) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        format!("`{id}` is not a task id (a UUID)"),
    )
}

fn unavailable(e: Error) -> Response {
    tracing::warn!(error = %e, "HTTP request failed");
    error(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
}

async fn get_task(engine: Engine, saga: &'static str, id: String) -> Response {
    let Some(id) = parse(&id) else {
        return bad_id(&id);
    };
    match engine.task(id).await {
        Ok(Some(task)) if task.saga == saga => Json(task).into_response(),
        Ok(_) => error(StatusCode::NOT_FOUND, "Task not found"),
        Err(e) => unavailable(e),
    }
}

async fn cancel_task(engine: Engine, saga: &'static str, id: String) -> Response {
    let Some(id) = parse(&id) else {
        return bad_id(&id);
    };
    match engine.cancel_by_name(saga, id).await {
        Ok(CancelResult::Cancelled) => Json(json!({ "status": "Cancelled" })).into_response(),
        Ok(CancelResult::AlreadyCancelled) => {
            Json(json!({ "status": "Already cancelled" })).into_response()
        }
        Ok(CancelResult::NotFound) | Err(Error::WrongSaga { .. }) => {
            error(StatusCode::NOT_FOUND, "Task not found")
        }
        Ok(CancelResult::AlreadyCompleted) => error(
            StatusCode::CONFLICT,
            "Task already completed, cannot cancel",
        ),
        Ok(CancelResult::NotCancellable(status)) => error(
            StatusCode::CONFLICT,
            format!("Task is {status}, cannot cancel"),
        ),
        Err(e) => unavailable(e),
    }
}
