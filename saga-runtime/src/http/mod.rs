//! The HTTP API and web console (feature `http`, axum 0.8).
//!
//! [`Api`] builds one axum [`Router`] with:
//!
//! - a JSON API under `/api` for everything an operator does (see below);
//! - the web console at `/console`, a single page that works offline (no
//!   CDN) and uses only that JSON API;
//! - the older per-saga routes `GET`/`DELETE /sagas/{saga}/{task_id}`.
//!
//! **Security.** Every route that changes something needs the access the
//! application configures: [`Api::token`] (a bearer token; the operator
//! names themselves in `X-Operator`) or [`Api::authorize`] (your own
//! check of the request's headers, returning the operator's name for the
//! audit log). Reads show customer data (a task's input, its steps'
//! outputs, errors and audit log), so with either configured **every read
//! route needs it too** (`GET /metrics` included): 401 `unauthorized`
//! without it, 403 `cross_origin` from another site's page. The console's
//! page itself is served to anyone and asks for the token before it
//! shows anything. [`Api::public_reads`] opens reads to anyone on
//! purpose; then a request without the access reads at most
//! [`Api::public_read_limit`] records (50) of each saga or process
//! manager, whatever its `limit` or filter.
//!
//! Without either the router is **read-only**: changes answer 403
//! `read_only`, and reads are open (there is nothing to check them
//! against), with the same budget as public reads: an API for a
//! developer's machine. Building it logs a warning, and so does the first
//! request that comes from beyond loopback (unless `public_reads(true)`
//! says open reads are meant). Put TLS in front of it.
//!
//! | route | what |
//! |---|---|
//! | `GET /api/overview` | task counts by saga and status, dead letters, process managers |
//! | `GET /api/sagas` | each saga's name, version, steps, whether cancellable |
//! | `GET /api/tasks?saga=&status=&step=&error=&from=&to=&cursor=&limit=` | a page of tasks, newest first (filtered by `step` or `error`, a page reads at most [`Api::scan_limit`] tasks and may come back short, with a `next` cursor and `"truncated": true`) |
//! | `GET /api/tasks/{id}` | the task: steps, attempts, errors, audit log, trace id |
//! | `GET /api/tasks/{id}/events` | its progress as server-sent events, until it finishes (at most [`Api::max_watchers`] streams open at once, a quarter of them kept for operators, and [`Api::max_watchers_per_client`] per reader's address) |
//! | `POST /api/sagas/{saga}/tasks` `{"input":..,"key":..}` | starts a task (201 `{"id":..}`) |
//! | `POST /api/tasks/{id}/cancel` `{"note":..}` (body optional) | cancels it, recording who and why: `result` `Cancelled` or `AlreadyCancelled` (200), `NotFound` (404), `AlreadyCompleted` or `NotCancellable` (409, with the task's `status`) |
//! | `POST /api/tasks/{id}/resolve` `{"note":..}` | marks it resolved by hand |
//! | `POST /api/tasks/{id}/retry-compensation` `{"note":..}` | runs its failed compensation again |
//! | `GET /api/dead-letters?cursor=&limit=` | dead letters, newest first, each with its task's saga, status and step (at most 200 a page) |
//! | `GET /api/dead-letters/{id}` | one |
//! | `POST /api/dead-letters/{id}/requeue` `{"note":..}` (body optional) | puts it back, recording who and why in its task's audit log |
//! | `POST /api/dead-letters/{id}/discard` `{"note":..}` | removes it |
//! | `POST /api/dead-letters/requeue` `{"saga":..,"step":..,"error_contains":..,"max":..,"note":..}` (`note` optional) | requeues every letter picked, recording who and why in each task's audit log |
//! | `POST /api/messages` `{"type":..,"payload":..}` with `Idempotency-Key` | publishes a message to the process managers that handle its type (202 `{"message_id":..,"delivered_to":n}`); CloudEvents binary mode too (the payload as the body, `ce-type`, `ce-id`); the same key again is handled once |
//! | `GET /api/limits` | the flow-control limits (`#[limit]`): each one's `name`, `concurrency`, `rate`, `keyed`, `used_by` and the unkeyed budget's `usage` now (`in_use`, `waiting`, `booked`) |
//! | `GET /api/processes` | each process manager's `name`, `total` instances and `counts` by status (`null` past 1,000 instances) |
//! | `GET /api/processes/{name}/instances?status=&cursor=&limit=` | a page of instances (no promised order), only those in `status` if given (then `truncated` as for tasks) |
//! | `GET /api/processes/{name}/instances/{id}` | one, with its pending timeouts |
//! | `GET /metrics` | Prometheus exposition, with [`Api::metrics`] (feature `metrics`) |
//!
//! Every answer carries `X-Content-Type-Options: nosniff`,
//! `X-Frame-Options: DENY` and `Referrer-Policy: no-referrer`, and every
//! one but the console's page `Content-Security-Policy: default-src
//! 'none'; frame-ancestors 'none'` (the console sets its own policy).
//!
//! Page sizes (`limit`) and scans above are an operator's; a request
//! without the access (where reads are open) gets at most
//! [`Api::public_read_limit`] rows a page and records a scan, and the
//! instance `counts` of `GET /api/processes` only up to as many instances.
//!
//! Errors are JSON everywhere: `{"error": "...", "code": "not_found"}`
//! (`bad_request`, `unauthorized`, `read_only`, `cross_origin`,
//! `conflict`, `invalid_input`, `unsupported_media_type`, `too_many_watchers`, `unavailable`,
//! `internal`). A store that stays unreachable for
//! [`Api::retry_budget`] (5 s) answers 503 `unavailable`, saying what could
//! not be done, not why (the reason is logged). An unknown saga, process
//! manager, task or dead letter answers 404 alike.

mod access;
mod console;
mod dead_letters;
mod exposure;
mod legacy;
mod messages;
mod processes;
mod reads;
mod reply;
mod tasks;
mod watchers;

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::engine::Engine;
use access::Access;
pub use access::Authorize;
pub use reads::DEFAULT_PUBLIC_READ_LIMIT;
use reply::ApiError;
pub use watchers::DEFAULT_MAX_WATCHERS_PER_CLIENT;

/// Builds the router; see the [module docs](self).
#[derive(Clone)]
pub struct Api {
    engine: Engine,
    access: Access,
    max_watchers: usize,
    max_watchers_per_client: usize,
    retry_budget: std::time::Duration,
    scan_limit: usize,
    public_reads: bool,
    public_read_limit: usize,
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
    watchers: Arc<watchers::Watchers>,
    /// The most tasks one `GET /api/tasks` filtered by step or error text
    /// reads from the store (for an operator).
    scan_limit: usize,
    /// Whether reads need the access, and what an anonymous one may cost.
    reads: reads::ReadRules,
    /// The warning for an API without access reached from the network.
    exposure: Arc<exposure::Exposure>,
}

/// Event streams open at once, by default ([`Api::max_watchers`]).
pub const DEFAULT_MAX_WATCHERS: usize = 64;

/// The most tasks one filtered listing reads, by default
/// ([`Api::scan_limit`]).
pub const DEFAULT_SCAN_LIMIT: usize = 200;

/// How long a request rides out an unreachable store before it answers
/// 503, by default ([`Api::retry_budget`]).
pub const DEFAULT_RETRY_BUDGET: std::time::Duration = std::time::Duration::from_secs(5);

impl Api {
    /// A read-only API over `engine` until [`token`](Self::token) or
    /// [`authorize`](Self::authorize) allows changes (and from then on
    /// guards reads too, see [`public_reads`](Self::public_reads)).
    pub fn new(engine: Engine) -> Self {
        Api {
            engine,
            access: Access::ReadOnly,
            max_watchers: DEFAULT_MAX_WATCHERS,
            max_watchers_per_client: DEFAULT_MAX_WATCHERS_PER_CLIENT,
            retry_budget: DEFAULT_RETRY_BUDGET,
            scan_limit: DEFAULT_SCAN_LIMIT,
            public_reads: false,
            public_read_limit: DEFAULT_PUBLIC_READ_LIMIT,
            extra: None,
        }
    }

    /// Allows changes to requests with `Authorization: Bearer <token>`,
    /// and reads only to them (unless [`public_reads`](Self::public_reads)).
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

    /// Allows changes to requests that `authorize` accepts, and reads only
    /// to them (unless [`public_reads`](Self::public_reads)): it returns
    /// the operator's name (recorded in the audit log), or `None` to
    /// refuse with 401. Use it to check your own session cookie, a JWT, or
    /// the identity header of an authenticating proxy.
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
    ///
    /// Where reads are open ([`public_reads`](Self::public_reads)),
    /// readers without the API's access ([`token`](Self::token) or
    /// [`authorize`](Self::authorize)) share at most three quarters of the
    /// places: the rest are kept for operators, whom a reader holding
    /// every stream would otherwise lock out with 503. Where reads need
    /// the access, a request without it is refused before it takes one.
    pub fn max_watchers(mut self, n: usize) -> Self {
        self.max_watchers = n;
        self
    }

    /// At most `n` event streams open at once per peer address for
    /// readers without the API's access (default
    /// [`DEFAULT_MAX_WATCHERS_PER_CLIENT`], 4); one more is refused with
    /// 429 `too_many_watchers`. The peer address is known when the server
    /// is started with
    /// `router.into_make_service_with_connect_info::<SocketAddr>()`;
    /// without it (or behind a proxy, where every request comes from the
    /// proxy) only the shared cap above holds.
    pub fn max_watchers_per_client(mut self, n: usize) -> Self {
        self.max_watchers_per_client = n;
        self
    }

    /// How long a request keeps retrying a store it cannot reach before
    /// it answers 503 `unavailable` (default [`DEFAULT_RETRY_BUDGET`], 5 s;
    /// each try is cut off at the budget too). The engine's own
    /// [client retry policy](crate::EngineBuilder::client_retry) rides out
    /// a minute, longer than the proxy in front of the API waits: the
    /// proxy would answer its own 504 while the request still holds its
    /// connection and, for an event stream, its place.
    pub fn retry_budget(mut self, budget: std::time::Duration) -> Self {
        self.retry_budget = budget;
        self
    }

    /// At most `n` tasks read from the store by one `GET /api/tasks`
    /// filtered by `step` or `error` (default [`DEFAULT_SCAN_LIMIT`]), which
    /// the store does not index: past it the page comes back short, with
    /// a `next` cursor to go on from. Without it one anonymous request
    /// (`?error=x&limit=1`) made the store send 5,000 tasks, half a
    /// megabyte, for an empty answer.
    pub fn scan_limit(mut self, n: usize) -> Self {
        self.scan_limit = n.max(1);
        self
    }

    /// With `true`, reads are open to anyone who reaches the router, even
    /// with a [`token`](Self::token) or [`authorize`](Self::authorize)
    /// configured (changes still need it); default `false`: a read without
    /// the access answers 401. Reads show every task's input, step
    /// outputs, errors and audit log: open them only where that is meant
    /// (a dashboard inside a trusted network). A request without the
    /// access then reads at most [`public_read_limit`](Self::public_read_limit)
    /// records. With no access configured reads are open anyway; `true`
    /// says so on purpose and silences the warning for a request from
    /// beyond loopback.
    pub fn public_reads(mut self, public: bool) -> Self {
        self.public_reads = public;
        self
    }

    /// At most `n` records (default [`DEFAULT_PUBLIC_READ_LIMIT`], 50) of
    /// each saga or process manager read from the store by one request
    /// without the API's access, where reads are open: its pages have at
    /// most `n` rows whatever its `limit`, a page filtered by step, error
    /// text or instance status stops its search after `n` records (short,
    /// `"truncated": true`, with a `next` cursor), and process managers
    /// with more than `n` instances are not counted by status for it.
    /// Without it one anonymous `?error=x&limit=1` made the store send
    /// 200 tasks (290 kB) for an empty answer.
    pub fn public_read_limit(mut self, n: usize) -> Self {
        self.public_read_limit = n.max(1);
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
        let credential = self.access.allows_changes();
        if !credential && self.public_reads {
            tracing::warn!(
                "saga HTTP API is read-only: configure `Api::token` or `Api::authorize` \
                 to allow starting, cancelling, resolving and requeueing"
            );
        } else if !credential {
            tracing::warn!(
                "saga HTTP API is read-only and its reads are open: configure `Api::token` \
                 or `Api::authorize` to allow starting, cancelling, resolving and requeueing \
                 (reads then need it too); serve it on loopback only until then"
            );
        }
        let state = ApiState {
            engine: self.engine.with_retry_budget(self.retry_budget),
            access: Arc::new(self.access),
            watchers: Arc::new(watchers::Watchers::new(
                self.max_watchers,
                self.max_watchers_per_client,
                credential,
            )),
            scan_limit: self.scan_limit,
            reads: reads::ReadRules {
                public: self.public_reads,
                public_limit: self.public_read_limit,
            },
            exposure: Arc::new(exposure::Exposure::new(!credential && !self.public_reads)),
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
            .route("/api/limits", get(limits))
            .route("/api/messages", post(messages::publish))
            .route("/api/processes", get(processes::list))
            .route("/api/processes/{name}/instances", get(processes::instances))
            .route(
                "/api/processes/{name}/instances/{id}",
                get(processes::instance),
            )
            .route("/console", get(console::page))
            .fallback(|| async { ApiError::not_found("No such route") });
        let router = legacy::routes(api, &self.engine).with_state(state.clone());
        let router = match self.extra {
            Some(extra) => router
                .merge(extra.route_layer(axum::middleware::from_fn_with_state(state, reads::gate))),
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

/// `GET /api/limits`: the flow-control limits the engine declares, with
/// the use of each unkeyed budget now ([`Engine::limits`]).
async fn limits(
    State(state): State<ApiState>,
    _reader: reads::Reader,
) -> Result<Json<Vec<crate::engine::LimitInfo>>, ApiError> {
    Ok(Json(state.engine.limits().await?))
}

/// `GET /api/overview`.
async fn overview(
    State(state): State<ApiState>,
    _reader: reads::Reader,
) -> Result<Json<Value>, ApiError> {
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
