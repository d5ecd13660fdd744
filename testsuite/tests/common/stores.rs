//! The private servers seen the same way by the engine scenarios
//! (`tests/scenarios/`): a scenario is written once against
//! [`ScenarioStore`] and runs on every store (`engine_scenarios!`), so a
//! team on PostgreSQL gets the same proof as a team on Redis.
//!
//! What differs per store is only how a fault is injected or a result
//! inspected: how connections are cut, how a record is damaged, what the
//! store holds. What the engine must do about it is the scenario's, and is
//! the same for every store.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::sqlite::{SqliteBackend, SqliteConfig};
use saga_runtime::backend::Backend;
use saga_runtime::TaskId;

use super::postgres_server::TestPostgres;
use super::redis_server::TestRedis;

/// A store's private server, for scenarios that kill, cut and restart it.
pub trait ScenarioStore: Sized + Send + Sync + 'static {
    /// Starts a private server that keeps every acknowledged write across
    /// [`crash`](Self::crash) and [`restart`](Self::restart).
    fn start() -> Self;

    /// The URL a worker process connects to (`BACKEND_URL`).
    fn url(&self) -> String;

    /// A backend with the scenarios' settings: `visibility`, and idle
    /// waits short enough that a worker notices work within 100 ms.
    fn backend(&self, visibility: Duration) -> impl Future<Output = Arc<dyn Backend>> + Send;

    /// Cuts every connection of the engines (not the server); how many.
    fn kill_connections(&self) -> usize;

    /// Stops the server at once, as a crash would.
    fn crash(&mut self);

    /// Starts the server again, on the same port and data.
    fn restart(&mut self);

    /// Writes `status` (one this version does not know) into the stored
    /// record of task `id`, as a newer version might.
    fn corrupt_status(&self, id: TaskId, status: &str);

    /// Writes `status` (one this version does not know) into the stored
    /// record of instance `id` of process manager `process`.
    fn corrupt_instance_status(&self, process: &str, id: &str, status: &str);

    /// What the store holds, by what a retention must remove (a Redis key,
    /// a PostgreSQL table) and how many of it; leases, which expire on
    /// their own, left out.
    fn stored(&self) -> BTreeMap<String, usize>;

    /// Messages taken and not settled yet (on PostgreSQL, every message
    /// on the queue).
    fn unsettled(&self) -> usize;

    /// Registrations dead workers left behind (Redis stream consumers);
    /// none on a store without them.
    fn stale_consumers(&self) -> usize {
        0
    }
}

impl ScenarioStore for TestRedis {
    fn start() -> Self {
        TestRedis::start()
    }

    fn url(&self) -> String {
        TestRedis::url(self)
    }

    fn backend(&self, visibility: Duration) -> impl Future<Output = Arc<dyn Backend>> + Send {
        let url = self.url();
        async move {
            let config = RedisConfig {
                visibility_timeout: visibility,
                block: Duration::from_millis(100),
                ..RedisConfig::default()
            };
            let backend = RedisBackend::connect_with(&url, config).await.unwrap();
            Arc::new(backend) as Arc<dyn Backend>
        }
    }

    fn kill_connections(&self) -> usize {
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query::<usize>(&mut self.conn())
            .unwrap_or(0)
    }

    fn crash(&mut self) {
        self.kill();
    }

    fn restart(&mut self) {
        TestRedis::restart(self);
    }

    fn corrupt_status(&self, id: TaskId, status: &str) {
        let key = format!("saga:{{saga:0}}:task:{id}");
        rewrite_status(self, &key, status);
    }

    fn corrupt_instance_status(&self, process: &str, id: &str, status: &str) {
        let suffix = format!(":inst:{process}:{id}");
        let key = self
            .keys()
            .into_iter()
            .find(|k| k.ends_with(&suffix))
            .unwrap_or_else(|| panic!("no key of instance {id} of {process}"));
        rewrite_status(self, &key, status);
    }

    fn stored(&self) -> BTreeMap<String, usize> {
        self.keys()
            .into_iter()
            .filter(|k| !k.contains(":lease:"))
            .map(|k| (k, 1))
            .collect()
    }

    fn unsettled(&self) -> usize {
        let summary: (usize, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
            .arg("saga:{saga:0}:queue")
            .arg("workers")
            .query(&mut self.conn())
            .unwrap();
        summary.0
    }

    fn stale_consumers(&self) -> usize {
        let info: Vec<redis::Value> = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg("saga:{saga:0}:queue")
            .arg("workers")
            .query(&mut self.conn())
            .unwrap();
        info.len().saturating_sub(1)
    }
}

/// Replaces the status in the `doc` field of the record at `key` with
/// `status`.
fn rewrite_status(redis: &TestRedis, key: &str, status: &str) {
    let mut conn = redis.conn();
    let doc: String = redis::cmd("HGET")
        .arg(key)
        .arg("doc")
        .query(&mut conn)
        .unwrap();
    let known = doc
        .split(r#""status":""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no status in {doc}"))
        .to_owned();
    let _: () = redis::cmd("HSET")
        .arg(key)
        .arg("doc")
        .arg(doc.replace(
            &format!(r#""status":"{known}""#),
            &format!(r#""status":"{status}""#),
        ))
        .query(&mut conn)
        .unwrap();
}

impl ScenarioStore for TestPostgres {
    fn start() -> Self {
        TestPostgres::start()
    }

    fn url(&self) -> String {
        TestPostgres::url(self)
    }

    fn backend(&self, visibility: Duration) -> impl Future<Output = Arc<dyn Backend>> + Send {
        let url = self.url();
        async move {
            let config = PostgresConfig {
                visibility_timeout: visibility,
                poll_interval: Duration::from_millis(50),
                ..PostgresConfig::default()
            };
            let backend = PostgresBackend::connect_url(&url, config).await.unwrap();
            Arc::new(backend) as Arc<dyn Backend>
        }
    }

    fn kill_connections(&self) -> usize {
        self.try_psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'saga-runtime' AND pid <> pg_backend_pid()",
        )
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
    }

    fn crash(&mut self) {
        TestPostgres::crash(self);
    }

    fn restart(&mut self) {
        TestPostgres::restart(self);
    }

    fn corrupt_status(&self, id: TaskId, status: &str) {
        self.psql(&format!(
            "UPDATE saga.tasks SET head = jsonb_set(head, '{{status}}', '\"{status}\"') \
             WHERE id = '{id}'"
        ));
    }

    fn corrupt_instance_status(&self, process: &str, id: &str, status: &str) {
        let updated = self.psql(&format!(
            "UPDATE saga.process_instances \
             SET record = jsonb_set(record, '{{status}}', '\"{status}\"') \
             WHERE process = '{process}' AND id = '{id}' RETURNING id"
        ));
        assert_eq!(
            updated.lines().next(),
            Some(id),
            "instance {id} of {process}"
        );
    }

    fn stored(&self) -> BTreeMap<String, usize> {
        let tables = self.psql(
            "SELECT string_agg(format('SELECT %L, count(*) FROM saga.%I', tablename, tablename), \
             ' UNION ALL ') FROM pg_tables WHERE schemaname = 'saga' \
             AND tablename NOT IN ('schema_version', 'named_leases')",
        );
        self.psql(&tables)
            .lines()
            .filter_map(|line| line.split_once('|'))
            .map(|(table, n)| (table.to_owned(), n.parse().unwrap()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    fn unsettled(&self) -> usize {
        self.psql("SELECT count(*) FROM saga.queue")
            .parse()
            .unwrap()
    }
}

/// SQLite: a file in a directory of its own. One process owns a file, so
/// the engines of a scenario share one backend (the first
/// [`backend`](ScenarioStore::backend) opens it, with that visibility
/// timeout) and there is no server to crash, no connection to cut and no
/// second process: the scenarios that need those are not generated for it
/// (`tests/sqlite.rs` SIGKILLs a worker process that owns the file).
pub struct TestSqlite {
    dir: tempfile::TempDir,
    opened: Arc<tokio::sync::OnceCell<(Duration, Arc<dyn Backend>)>>,
}

impl TestSqlite {
    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("scenario.db")
    }
}

impl ScenarioStore for TestSqlite {
    fn start() -> Self {
        TestSqlite {
            dir: tempfile::tempdir().unwrap(),
            opened: Arc::default(),
        }
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.path().display())
    }

    fn backend(&self, visibility: Duration) -> impl Future<Output = Arc<dyn Backend>> + Send {
        let (opened, path) = (self.opened.clone(), self.path());
        async move {
            let (first, backend) = opened
                .get_or_init(|| async {
                    let config = SqliteConfig {
                        visibility_timeout: visibility,
                        ..SqliteConfig::default()
                    };
                    let backend = SqliteBackend::open_with(&path, config).await.unwrap();
                    (visibility, Arc::new(backend) as Arc<dyn Backend>)
                })
                .await;
            assert_eq!(*first, visibility, "one backend per file: one visibility");
            backend.clone()
        }
    }

    fn kill_connections(&self) -> usize {
        unreachable!("SQLite has no connections to cut")
    }

    fn crash(&mut self) {
        unreachable!("SQLite has no server to crash")
    }

    fn restart(&mut self) {
        unreachable!("SQLite has no server to restart")
    }

    fn corrupt_status(&self, _: TaskId, _: &str) {
        unreachable!("the engine holds the file")
    }

    fn corrupt_instance_status(&self, _: &str, _: &str, _: &str) {
        unreachable!("the engine holds the file")
    }

    fn stored(&self) -> BTreeMap<String, usize> {
        unreachable!("the engine holds the file")
    }

    fn unsettled(&self) -> usize {
        unreachable!("the engine holds the file")
    }
}
