//! `/api/processes`: process managers with their instance counts, their
//! instances (all, or those in one status) and pending timeouts.

use std::collections::BTreeMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::reads::Reader;
use super::reply::ApiError;
use super::ApiState;
use crate::backend::ProcessInstance;
use crate::engine::Engine;
use crate::error::Error;
use crate::model::process::InstanceStatus;

/// Up to how many instances `GET /api/processes` reads to count them by
/// status: the stores keep no index by status, so counting reads every
/// instance (each status count costs a read of each record).
const STATUS_COUNT_LIMIT: usize = 1_000;

/// Up to how many instances one filtered page reads looking for matches
/// (for an operator): past it the page comes back short, with a cursor to
/// go on from.
const FILTER_SCAN_LIMIT: usize = 5_000;

/// The most rows of one page of instances (the engine's own cap).
const MAX_ROWS: usize = 1000;

/// `GET /api/processes`: each process manager with `total`, its number of
/// instances (any status; counted without reading them), and `counts`, how
/// many are in each status (`{"Active": n, "Completed": n, "Stopped": n}`,
/// statuses with none left out), or `null` past 1,000 instances, where
/// counting would read each one (past the public read limit for a reader
/// without the API's access).
pub(super) async fn list(
    State(state): State<ApiState>,
    reader: Reader,
) -> Result<Json<Value>, ApiError> {
    let engine = &state.engine;
    let count_limit = reader.scan(STATUS_COUNT_LIMIT);
    let mut processes = Vec::new();
    for name in engine.process_names() {
        let total = engine.process_count(name).await?;
        let counts = match total <= count_limit {
            true => Some(status_counts(engine, name, count_limit).await?),
            false => None,
        };
        processes.push(json!({ "name": name, "total": total, "counts": counts }));
    }
    Ok(Json(json!({ "processes": processes })))
}

/// How many instances of `process` are in each status, from reading them
/// (`limit` a page, twice that at most: instances come meanwhile).
async fn status_counts(
    engine: &Engine,
    process: &str,
    limit: usize,
) -> Result<BTreeMap<String, usize>, Error> {
    let mut counts = BTreeMap::new();
    let mut cursor: Option<String> = None;
    let mut read = 0;
    loop {
        let page = engine
            .process_instances_page(process, cursor.as_deref(), limit)
            .await?;
        read += page.instances.len();
        for instance in &page.instances {
            *counts.entry(status_name(instance.status)).or_default() += 1;
        }
        match page.next {
            Some(next) if read < 2 * limit => cursor = Some(next),
            _ => return Ok(counts),
        }
    }
}

/// The name a status has in JSON (`"Active"`).
fn status_name(status: InstanceStatus) -> String {
    match serde_json::to_value(status) {
        Ok(Value::String(name)) => name,
        _ => format!("{status:?}"),
    }
}

/// The filters and paging of `GET /api/processes/{name}/instances`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PageParams {
    cursor: Option<String>,
    limit: Option<usize>,
    status: Option<String>,
}

/// `GET /api/processes/{name}/instances?status=&cursor=&limit=`: a page of
/// instances (in no promised order: the stores keep none by time), only
/// those in `status` (`Active`, `Completed`, `Stopped`) if given. A
/// filtered page reads at most 5,000 instances looking for matches (the
/// public read limit for a reader without the API's access), and may come
/// back short with a `next` cursor to go on from and `"truncated": true`.
pub(super) async fn instances(
    State(state): State<ApiState>,
    reader: Reader,
    Path(name): Path<String>,
    params: Result<Query<PageParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(params) = params?;
    let cursor = params.cursor.filter(|c| !c.is_empty());
    let limit = reader.rows(params.limit, MAX_ROWS);
    let status = match params.status.filter(|s| !s.is_empty()) {
        Some(status) => Some(
            serde_json::from_value::<InstanceStatus>(json!(status)).map_err(|_| {
                ApiError::bad_request(format!(
                    "`{}` is not an instance status (one of Active, Completed, Stopped)",
                    status.chars().take(40).collect::<String>()
                ))
            })?,
        ),
        None => None,
    };
    let engine = &state.engine;
    let Some(status) = status else {
        let page = engine
            .process_instances_page(&name, cursor.as_deref(), limit)
            .await?;
        return Ok(Json(
            json!({ "instances": page.instances, "next": page.next, "truncated": false }),
        ));
    };
    let scan = reader.scan(FILTER_SCAN_LIMIT);
    let (instances, next) = filtered(engine, &name, status, cursor, limit, scan).await?;
    let truncated = instances.len() < limit && next.is_some();
    Ok(Json(
        json!({ "instances": instances, "next": next, "truncated": truncated }),
    ))
}

/// About `limit` instances of `process` in `status` from `cursor` (every
/// match of each page read is kept), reading about `scan` at most, and
/// where to go on from.
async fn filtered(
    engine: &Engine,
    process: &str,
    status: InstanceStatus,
    mut cursor: Option<String>,
    limit: usize,
    scan: usize,
) -> Result<(Vec<ProcessInstance>, Option<String>), Error> {
    let mut found = Vec::new();
    let mut read = 0;
    loop {
        let page = engine
            .process_instances_page(process, cursor.as_deref(), limit)
            .await?;
        read += page.instances.len();
        found.extend(page.instances.into_iter().filter(|i| i.status == status));
        cursor = page.next;
        if cursor.is_none() || found.len() >= limit.max(1) || read >= scan {
            return Ok((found, cursor));
        }
    }
}

/// `GET /api/processes/{name}/instances/{id}`: the instance (state,
/// correlation keys, audit log) and its pending timeouts.
pub(super) async fn instance(
    State(state): State<ApiState>,
    _reader: Reader,
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
