//! The HTTP API and web console (feature `http`, axum 0.8).
//!
//! [`Api`] builds one axum [`Router`] with:
//!
//! - a JSON API under `/api` for everything an operator does (see below);
//! - the web console at `/console`, a single page that works offline (no
//!   CDN) and uses only that JSON API;
//! - the older per-saga routes `GET`/`DELETE /sagas/{saga}/{task_id}`.
//!
//! **Security.** Reading is open to whoever reaches the router. Every
//! route that changes something needs the access the application
//! configures: [`Api::token`] (a bearer token; the operator names
//! themselves in `X-Operator`) or [`Api::authorize`] (your own check of
//! the request's headers, returning the operator's name for the audit
//! log). Without either the router is **read-only**: those routes answer
//! 403, and building it logs a warning saying so. Put TLS in front of it.
//!
//! | route | what |
//! |---|---|
//! | `GET /api/overview` | task counts by saga and status, dead letters, process managers |
//! | `GET /api/sagas` | each saga's name, version, steps, whether cancellable |
//! | `GET /api/tasks?saga=&status=&step=&error=&from=&to=&cursor=&limit=` | a page of tasks, newest first |
//! | `GET /api/tasks/{id}` | the task: steps, attempts, errors, audit log, trace id |
//! | `GET /api/tasks/{id}/events` | its progress as server-sent events, until it finishes (at most [`Api::max_watchers`] streams open at once) |
//! | `POST /api/sagas/{saga}/tasks` `{"input":..,"key":..}` | starts a task (201 `{"id":..}`) |
//! | `POST /api/tasks/{id}/cancel` `{"note":..}` (body optional) | cancels it, recording who and why: `result` `Cancelled` or `AlreadyCancelled` (200), `NotFound` (404), `AlreadyCompleted` or `NotCancellable` (409, with the task's `status`) |
//! | `POST /api/tasks/{id}/resolve` `{"note":..}` | marks it resolved by hand |
//! | `POST /api/tasks/{id}/retry-compensation` `{"note":..}` | runs its failed compensation again |
//! | `GET /api/dead-letters?cursor=&limit=` | dead letters, newest first, each with its task's saga, status and step (at most 200 a page) |
//! | `GET /api/dead-letters/{id}` | one |
//! | `POST /api/dead-letters/{id}/requeue` | puts it back |
//! | `POST /api/dead-letters/{id}/discard` `{"note":..}` | removes it |
//! | `POST /api/dead-letters/requeue` `{"saga":..,"step":..,"error_contains":..,"max":..}` | requeues every letter picked |
//! | `GET /api/processes` | each process manager's `name`, `total` instances and `counts` by status (`null` past 1,000 instances) |
//! | `GET /api/processes/{name}/instances?status=&cursor=&limit=` | a page of instances (no promised order), only those in `status` if given |
//! | `GET /api/processes/{name}/instances/{id}` | one, with its pending timeouts |
//! | `GET /metrics` | Prometheus exposition, with [`Api::metrics`] (feature `metrics`) |
//!
//! Every answer carries `X-Content-Type-Options: nosniff`,
//! `X-Frame-Options: DENY` and `Referrer-Policy: no-referrer`, and every
//! one but the console's page `Content-Security-Policy: default-src
//! 'none'; frame-ancestors 'none'` (the console sets its own policy).
//!
//! Errors are JSON everywhere: `{"error": "...", "code": "not_found"}`
//! (`bad_request`, `unauthorized`, `read_only`, `cross_origin`,
//! `conflict`, `invalid_input`, `unsupported_media_type`, `too_many_watchers`, `unavailable`,
//! `internal`). An unknown saga, process
//! manager, task or dead letter answers 404 alike.

mod access;
mod console;
mod dead_letters;
mod legacy;
mod processes;
mod reply;
mod tasks;

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::engine::Engine;
use access::Access;
pub use access::Authorize;
use reply::ApiError;

/// Builds the router; see the [module docs](self).
#[derive(Clone)]
pub struct Api {
    engine: Engine,
    access: Access,
    max_watchers: usize,
    /// `GET /metrics`, when [`Api::metrics`] added it.
    extra: Option<Router>,
}

/// What every handler sees.
#[derive(Clone)]
pub(crate) struct ApiState {
    engine: Engine,
    access: Arc<Access>,
    /// Open event streams: each polls the store until its task ends or
    /// its client leaves, so their number is capped.
    watchers: Arc<tokio::sync::Semaphore>,
}

/// Event streams open at once, by default ([`Api::max_watchers`]).
pub const DEFAULT_MAX_WATCHERS: usize = 64;

impl Api {
    /// A read-only API over `engine` until [`token`](Self::token) or
    /// [`authorize`](Self::authorize) allows changes.
    pub fn new(engine: Engine) -> Self {
        Api {
            engine,
            access: Access::ReadOnly,
            max_watchers: DEFAULT_MAX_WATCHERS,
            extra: None,
        }
    }

    /// Allows changes to requests with `Authorization: Bearer <token>`.
    /// The operator named in their `X-Operator` header (else `token`) is
    /// recorded in the audit log of what they resolve, retry, requeue or
    /// discard (a cancellation logs who asked, with `tracing`).
    ///
    /// # Panics
    ///
    /// On an empty token: it would let anyone in.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        let token = token.into();
        assert!(!token.is_empty(), "an empty API token would let anyone in");
        self.access = Access::Token(token.into());
        self
    }

    /// Allows changes to requests that `authorize` accepts: it returns the
    /// operator's name (recorded in the audit log), or `None` to refuse
    /// with 401. Use it to check your own session cookie, a JWT, or the
    /// identity header of an authenticating proxy.
    pub fn authorize(
        mut self,
        authorize: impl Fn(&HeaderMap) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.access = Access::Custom(Arc::new(authorize));
        self
    }

    /// At most `n` task event streams (`GET /api/tasks/{id}/events`) open
    /// at once (default [`DEFAULT_MAX_WATCHERS`]); one more is refused with
    /// 503 `too_many_watchers` until one closes. Each open stream reads
    /// its task from the store on every change and every
    /// [`WATCH_POLL`](crate::engine::WATCH_POLL), for as long as its client
    /// stays: without a cap, anyone who can reach a read route could load
    /// the store at will.
    pub fn max_watchers(mut self, n: usize) -> Self {
        self.max_watchers = n;
        self
    }

    /// Serves the Prometheus exposition at `GET /metrics` (feature
    /// `metrics`), from the handle [`crate::metrics::install`] returned.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics(mut self, handle: metrics_exporter_prometheus::PrometheusHandle) -> Self {
        self.extra = Some(crate::metrics::route(handle));
        self
    }

    /// The router, ready to serve or to nest in yours.
    pub fn router(self) -> Router {
        if !self.access.allows_changes() {
            tracing::warn!(
                "saga HTTP API is read-only: configure `Api::token` or `Api::authorize` \
                 to allow starting, cancelling, resolving and requeueing"
            );
        }
        let state = ApiState {
            engine: self.engine.clone(),
            access: Arc::new(self.access),
            watchers: Arc::new(tokio::sync::Semaphore::new(self.max_watchers)),
        };
        let api = Router::new()
            .route("/api/overview", get(overview))
            .route("/api/sagas", get(tasks::sagas))
            .route("/api/sagas/{saga}/tasks", post(tasks::start))
            .route("/api/tasks", get(tasks::list))
            .route("/api/tasks/{id}", get(tasks::get))
            .route("/api/tasks/{id}/events", get(tasks::events))
            .route("/api/tasks/{id}/cancel", post(tasks::cancel))
            .route("/api/tasks/{id}/resolve", post(tasks::resolve))
            .route(
                "/api/tasks/{id}/retry-compensation",
                post(tasks::retry_compensation),
            )
            .route("/api/dead-letters", get(dead_letters::list))
            .route(
                "/api/dead-letters/requeue",
                post(dead_letters::requeue_where),
            )
            .route("/api/dead-letters/{id}", get(dead_letters::get))
            .route(
                "/api/dead-letters/{id}/requeue",
                post(dead_letters::requeue),
            )
            .route(
                "/api/dead-letters/{id}/discard",
                post(dead_letters::discard),
            )
            .route("/api/processes", get(processes::list))
            .route("/api/processes/{name}/instances", get(processes::instances))
            .route(
                "/api/processes/{name}/instances/{id}",
                get(processes::instance),
            )
            .route("/console", get(console::page))
            .fallback(|| async { ApiError::not_found("No such route") });
        let router = legacy::routes(api, &self.engine).with_state(state);
        let router = match self.extra {
            Some(extra) => router.merge(extra),
            None => router,
        };
        router
            .layer(axum::middleware::map_response(reply::json_errors))
            .layer(axum::middleware::map_response(reply::security_headers))
    }
}

/// The read-only API of every saga registered with `engine` (see the
/// [module docs](self)); [`Api`] configures access for changes.
pub fn router(engine: Engine) -> Router {
    Api::new(engine).router()
}

/// `GET /api/overview`.
async fn overview(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let engine = &state.engine;
    let counts: Vec<Value> = engine
        .task_counts()
        .await?
        .into_iter()
        .map(|c| {
            let by_status: serde_json::Map<String, Value> = c
                .counts
                .into_iter()
                .map(|(status, n)| (status.to_string(), json!(n)))
                .collect();
            json!({ "saga": c.saga, "counts": by_status })
        })
        .collect();
    Ok(Json(json!({
        "sagas": counts,
        "dead_letters": engine.dead_letter_count().await?,
        "processes": engine.process_names(),
        "changes_allowed": state.access.allows_changes(),
    })))
}
