//! `/api/processes`: process-manager instances and their pending
//! timeouts.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::reply::ApiError;
use super::ApiState;

/// `GET /api/processes`: the process managers' names.
pub(super) async fn names(State(state): State<ApiState>) -> Json<Value> {
    Json(json!({ "processes": state.engine.process_names() }))
}

/// The paging of `GET /api/processes/{name}/instances`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PageParams {
    cursor: Option<String>,
    limit: Option<usize>,
}

/// `GET /api/processes/{name}/instances?cursor=&limit=`.
pub(super) async fn instances(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    params: Result<Query<PageParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(params) = params?;
    let cursor = params.cursor.filter(|c| !c.is_empty());
    let page = state
        .engine
        .process_instances_page(&name, cursor.as_deref(), params.limit.unwrap_or(50))
        .await?;
    Ok(Json(
        json!({ "instances": page.instances, "next": page.next }),
    ))
}

/// `GET /api/processes/{name}/instances/{id}`: the instance (state,
/// correlation keys, audit log) and its pending timeouts.
pub(super) async fn instance(
    State(state): State<ApiState>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let instance = state
        .engine
        .process_instance_named(&name, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("Instance not found"))?;
    let timeouts = state.engine.process_timeouts(&name, Some(&id), 100).await?;
    Ok(Json(json!({ "instance": instance, "timeouts": timeouts })))
}
