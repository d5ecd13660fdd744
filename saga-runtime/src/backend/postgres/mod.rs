//! The PostgreSQL backend (feature `postgres`, on sqlx): the store most
//! teams already run, and the one whose tasks can start in the same
//! transaction as the business write that calls for them
//! ([`Engine::start_in`](crate::Engine::start_in)).
//!
//! - Everything lives in one schema ([`PostgresConfig::schema`], default
//!   `saga`), created and upgraded by the versioned migrations embedded in
//!   the crate (`migrations/*.sql`); a schema written by a newer version of
//!   this library is refused.
//! - Every write of the protocol is one call of a function in that schema:
//!   one statement, one transaction, one round trip. A function checks
//!   before it writes (the lease's fence, the version, a cancellation) and
//!   answers a refusal code otherwise, as the Redis scripts do.
//! - A task is a row (its head), a row per step and per audit entry: a
//!   step's write touches its own step row, not the task's history.
//! - The work queue is a table read with `FOR UPDATE SKIP LOCKED`: a
//!   delivery makes its row invisible until the visibility timeout under a
//!   new claim, and counts one more unanswered delivery; a delayed message
//!   is a row visible later. Idle readers are woken by `LISTEN/NOTIFY`, and
//!   look again on their own now and then (a slow poll) should a
//!   notification be lost with a connection. The engine's own writes do
//!   not notify in their transactions (that would serialize their
//!   commits): `wake` notifies after them, once for many.
//! - Times that decide leases and visibility are the server's.
//!
//! Files mirror the seam's: `tasks`, `queue`, `dead_letters`,
//! `housekeeping`, `process`, `tally`, `endpoint`, `leases`, `breakers`,
//! `partitions`, `limits`; `migrate` (the migrator), `listen`
//! (notifications received), `wake` (notifications sent for the engine's
//! writes), `write` (the write vocabulary's interpreter), `steps` (which
//! step rows a write must send), `session` (where
//! a statement runs, its timeouts in force).

/// A statement built from the schema's (checked) name: what sqlx asks to
/// be told is not built from untrusted input.
macro_rules! sql {
    ($($arg:tt)*) => {
        sqlx::AssertSqlSafe(format!($($arg)*))
    };
}

#[macro_use]
mod session;

mod breakers;
mod cancel;
mod dead_letters;
mod endpoint;
mod failure;
mod housekeeping;
mod leases;
mod limits;
mod listen;
mod migrate;
mod privileges;
mod process;
mod queue;
mod runners;
mod settling;
mod steps;
mod tally;
mod tasks;
mod wake;
mod write;

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio_util::sync::CancellationToken;

use super::{Backend, BackendError, Breakers, Leases, Limits, ProcessBackend, Runners};
pub(crate) use failure::{corrupt, failure};
use listen::Signals;
use session::{Session, Statements};
use wake::Waker;

pub use migrate::SCHEMA_VERSION;
/// The sqlx this backend is built on: take pools and transactions for
/// [`Engine::start_in`](crate::Engine::start_in) from it, so that the
/// versions match.
pub use sqlx;

/// Settings of a [`PostgresBackend`].
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// The schema every table and function lives in (default `saga`):
    /// lets several deployments share one database. Lower-case letters,
    /// digits and `_`, starting with a letter.
    pub schema: String,
    /// A delivered message not settled within this is delivered again
    /// (default 15 s). Running steps keep their message; task leases
    /// default to it too.
    pub visibility_timeout: Duration,
    /// How often an idle reader looks for work while notifications are
    /// down (default 1 s: the listening connection is being re-made, and
    /// what was sent meanwhile is lost). While they are up, an idle reader
    /// sleeps until a notification, or until the next delayed message is
    /// due.
    pub poll_interval: Duration,
    /// Dead-lettered payloads keep at most this many bytes (default
    /// 256 KiB).
    pub dead_letter_payload_limit: usize,
    /// Each endpoint keeps about this many messages (default 100,000);
    /// older ones are trimmed.
    pub endpoint_max_len: usize,
    /// How long one statement may run before the server cancels it
    /// (default 30 s): a statement stuck behind a lock or on a sick
    /// server must not hold a worker for ever.
    pub statement_timeout: Duration,
    /// How long a statement waits for a row lock (default 5 s).
    pub lock_timeout: Duration,
    /// The connections of the pool [`PostgresBackend::connect_url`] makes
    /// (default 8). About twice the database server's cores, not one per
    /// message in flight: a statement holds a connection only while it
    /// runs, and more connections than the server has cores to run them
    /// make every statement slower (4 workers x 16 messages on a 2-core
    /// server, `bench_postgres --pool N`: 8 connections 3,600 steps/s, 16
    /// connections 3,000, 32 and more 2,500). A pool passed to
    /// [`connect_with`](PostgresBackend::connect_with) is sized by whoever
    /// made it.
    pub max_connections: u32,
    /// Whether an engine creates or upgrades its schema at start (default
    /// `true`). An engine whose schema is current runs no DDL either way;
    /// turn this off where engines run as a role that cannot migrate, and
    /// a deploy job migrates first ([`PostgresBackend::migrate`]): an
    /// engine that finds its schema behind then stops with that said,
    /// rather than with the permission error of the first `CREATE`.
    pub migrate: bool,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            schema: "saga".to_owned(),
            visibility_timeout: Duration::from_secs(15),
            poll_interval: Duration::from_secs(1),
            dead_letter_payload_limit: super::memory::DEFAULT_DEAD_LETTER_PAYLOAD_LIMIT,
            endpoint_max_len: 100_000,
            statement_timeout: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(5),
            max_connections: 8,
            migrate: true,
        }
    }
}

/// The PostgreSQL backend. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PostgresBackend {
    shared: Arc<Shared>,
}

struct Shared {
    pool: PgPool,
    /// Where the engine's statements run, their timeouts in force.
    statements: Statements,
    config: PostgresConfig,
    /// The schema, quoted for SQL.
    schema: String,
    signals: Arc<Signals>,
    /// Tells this process and the other engines about the engine's own
    /// writes (which do not notify in their transactions).
    waker: Arc<Waker>,
    steps: steps::StepCache,
    /// Stops the listener when the last clone goes.
    stop: CancellationToken,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("schema", &self.shared.config.schema)
            .finish_non_exhaustive()
    }
}

impl PostgresBackend {
    /// Connects to `url` (`postgres://user:password@host:port/database`)
    /// with the default settings, and creates or upgrades the schema.
    pub async fn connect(url: &str) -> Result<Self, BackendError> {
        PostgresBackend::connect_url(url, PostgresConfig::default()).await
    }

    /// Connects to `url` with `config`, and creates or upgrades the schema.
    /// The pool has [`PostgresConfig::max_connections`] connections.
    pub async fn connect_url(url: &str, config: PostgresConfig) -> Result<Self, BackendError> {
        let options = parse_url(url)?;
        let options = options.application_name("saga-runtime");
        failure::reach(&options).await?;
        let set = session::set_statements(&config, false);
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections.max(2))
            .acquire_timeout(Duration::from_secs(10))
            // No ping before each statement (it doubled the round trips of
            // every write): a connection that died meanwhile fails its
            // statement, which the engine retries as any transient failure,
            // on a fresh connection.
            .test_before_acquire(false)
            .after_connect(move |conn, _| {
                let set = set.clone();
                Box::pin(
                    async move { sqlx::raw_sql(sql!("{set}")).execute(conn).await.map(|_| ()) },
                )
            })
            .connect_lazy_with(options);
        PostgresBackend::connect_on(pool, config, true).await
    }

    /// Uses `pool` (your application's, so that [`Engine::start_in`] can
    /// take one of your transactions) with `config`, and creates or
    /// upgrades the schema.
    ///
    /// The engine's statements keep [`PostgresConfig::statement_timeout`]
    /// and [`PostgresConfig::lock_timeout`] without changing your
    /// sessions: on a pool whose connections start with them (made from
    /// [`PostgresConfig::session_options`]) they run as they are; on any
    /// other, each runs in a transaction of its own that sets them (`SET
    /// LOCAL`), two round trips more per statement. Statements in your own
    /// transactions (`start_in`, `publish_in`) run under your settings.
    ///
    /// [`Engine::start_in`]: crate::Engine::start_in
    pub async fn connect_with(pool: PgPool, config: PostgresConfig) -> Result<Self, BackendError> {
        PostgresBackend::connect_on(pool, config, false).await
    }

    /// [`connect_with`](Self::connect_with) on `pool`, which sets the
    /// timeouts on each of its connections when `own`.
    async fn connect_on(
        pool: PgPool,
        config: PostgresConfig,
        own: bool,
    ) -> Result<Self, BackendError> {
        let schema = migrate::quoted_schema(&config.schema)?;
        if let Err(e) = migrate::prepare(&pool, &config.schema, config.migrate).await {
            return Err(failure::at_start(&pool.connect_options(), e).await);
        }
        let statements = Statements::new(pool.clone(), &config, own);
        if statements.per_transaction() {
            tracing::debug!("the pool's connections do not start with the configured timeouts: each engine statement sets them in a transaction of its own");
        }
        let stop = CancellationToken::new();
        let signals = listen::spawn(pool.clone(), &config.schema, stop.clone());
        let waker = Waker::spawn(
            statements.clone(),
            &config.schema,
            signals.clone(),
            stop.clone(),
        );
        Ok(PostgresBackend {
            shared: Arc::new(Shared {
                pool,
                statements,
                schema,
                signals,
                waker,
                steps: steps::StepCache::default(),
                config,
                stop,
            }),
        })
    }

    /// Creates or upgrades `config.schema` at `url` to [`SCHEMA_VERSION`]
    /// and returns: what a deploy job runs, as a role that may (`CREATE`
    /// on the database the first time, ownership of the schema's objects
    /// after), so that the engines can run as a role that only uses them
    /// (see [`PostgresConfig::migrate`]). Several at once are safe (one
    /// migrates, the others wait and find it done). Returns the version
    /// the schema was at before (`None`: it held no deployment).
    pub async fn migrate(url: &str, config: &PostgresConfig) -> Result<Option<i32>, BackendError> {
        let options = parse_url(url)?.application_name("saga-runtime migrate");
        failure::reach(&options).await?;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options);
        let migrated = async {
            let before = migrate::version_of(&pool, &config.schema).await?;
            migrate::run(&pool, &config.schema).await?;
            Ok(before)
        }
        .await;
        let migrated = match migrated {
            Ok(before) => Ok(before),
            Err(e) => Err(failure::at_start(&pool.connect_options(), e).await),
        };
        pool.close().await;
        migrated
    }

    /// Attaches to a deployment's existing schema without creating or
    /// upgrading anything (an operator's tool must not be what migrates a
    /// production database): refused when `config.schema` holds no
    /// deployment, or one of another schema version than this library's.
    pub async fn attach(url: &str, config: PostgresConfig) -> Result<Self, BackendError> {
        let options = parse_url(url)?;
        let options = options.application_name("sagactl");
        failure::reach(&options).await?;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(options);
        let found = migrate::version_of(&pool, &config.schema).await?;
        match found {
            Some(v) if v == SCHEMA_VERSION => migrate::check(&pool, &config.schema).await?,
            Some(v) => {
                return Err(BackendError::Misconfigured(format!(
                    "schema `{}` is at version {v}, this tool knows version {SCHEMA_VERSION}: \
                     use the tool of the deployment's version (or, to upgrade the deployment to \
                     this one, migrate it as the schema's owner: `sagactl migrate`)",
                    config.schema
                )))
            }
            None => {
                return Err(BackendError::Misconfigured(format!(
                    "no deployment in schema `{}` of this database: check the URL and the schema \
                     (sagactl's `--prefix`), or create it with `sagactl migrate`",
                    config.schema
                )))
            }
        }
        PostgresBackend::connect_with(pool, config).await
    }

    /// The pool, for a transaction to start tasks in.
    pub fn pool(&self) -> &PgPool {
        &self.shared.pool
    }

    /// The settings.
    pub fn config(&self) -> &PostgresConfig {
        &self.shared.config
    }

    /// A connection for one engine statement, its timeouts in force (see
    /// `session`; statements go through `run!`).
    async fn session(&self) -> Result<Session, sqlx::Error> {
        self.shared.statements.session().await
    }

    /// A transaction for several engine statements, the timeouts in force.
    async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, BackendError> {
        self.shared.statements.begin().await.map_err(failure)
    }

    /// `{schema}.name`, quoted, for a statement.
    fn q(&self, name: &str) -> String {
        format!("{}.{name}", self.shared.schema)
    }
}

/// `url`'s connection options; the refusal names the URL without its
/// password.
fn parse_url(url: &str) -> Result<PgConnectOptions, BackendError> {
    url.parse().map_err(|e| {
        BackendError::Misconfigured(format!(
            "`{}` is not a PostgreSQL URL ({e}): expected postgres://user:password@host:port/database \
             (a password holding `/`, `?`, `@`, `:` or `#` is percent-encoded: `/` as %2F)",
            crate::backend::redacted(url)
        ))
    })
}

/// Everything: process managers and coordination live in the database
/// every engine shares.
impl Backend for PostgresBackend {
    fn processes(self: Arc<Self>) -> Option<Arc<dyn ProcessBackend>> {
        Some(self)
    }

    fn leases(self: Arc<Self>) -> Option<Arc<dyn Leases>> {
        Some(self)
    }

    fn breakers(self: Arc<Self>) -> Option<Arc<dyn Breakers>> {
        Some(self)
    }

    fn runners(self: Arc<Self>) -> Option<Arc<dyn Runners>> {
        Some(self)
    }

    fn limits(self: Arc<Self>) -> Option<Arc<dyn Limits>> {
        Some(self)
    }
}

/// What starting and publishing in a caller's transaction need
/// ([`Engine::start_in`](crate::Engine::start_in),
/// [`Engine::publish_in`](crate::Engine::publish_in)): the same writes as
/// the engine's own, on the caller's transaction.
impl PostgresBackend {
    /// Creates `task` with its first message in `tx`; `Ok(None)` if it
    /// was created, else the task that exists with its id (committed, or
    /// waited for: the insert waits for another transaction creating it).
    pub(crate) async fn create_in(
        &self,
        tx: &mut sqlx::PgTransaction<'_>,
        task: &crate::model::task::TaskInstance,
        first: &crate::backend::QueueMessage,
    ) -> Result<Option<crate::model::task::TaskInstance>, BackendError> {
        if self.create_task_on(&mut **tx, task, first).await? {
            return Ok(None);
        }
        let record: Option<serde_json::Value> =
            sqlx::query_scalar(sql!("SELECT {}($1)", self.q("task_record")))
                .bind(task.id.0)
                .fetch_one(&mut **tx)
                .await
                .map_err(failure)?;
        match record {
            Some(record) => tasks::parse_task(record).map(Some),
            None => Err(corrupt(format!("task {} exists and does not", task.id))),
        }
    }

    /// Enqueues `items` in `tx`.
    pub(crate) async fn enqueue_in(
        &self,
        tx: &mut sqlx::PgTransaction<'_>,
        items: &[crate::backend::WorkItem],
    ) -> Result<(), BackendError> {
        let rows = items.iter().map(queue::Put::of).collect();
        self.enqueue_rows_on(&mut **tx, rows).await
    }
}
