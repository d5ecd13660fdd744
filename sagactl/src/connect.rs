//! Reaching the deployment's store, and saying what went wrong in terms an
//! operator can act on: which URL, what it should look like, what kind of
//! server answered. An operator typing a URL by hand meets these errors
//! first, and the runtime's own (`backend unavailable: Moved: 9869 ...`)
//! name neither the URL nor the fix.

use std::sync::Arc;
use std::time::Duration;

use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::sqlite::{SqliteBackend, SqliteConfig};
use saga_runtime::backend::{Backend, BackendError};
use saga_runtime::Error;

/// The URL forms sagactl accepts, for an error about a URL.
pub const FORMS: &str = "accepted store URLs:
  redis://[[user]:password@]host:port[/db]         one Redis server
  redis+cluster://host:port,host:port              a Redis Cluster (some of its nodes)
  redis+sentinel://host:port,host:port/<service>   a Redis behind Sentinel
  postgres://user[:password]@host:port/database    PostgreSQL
  sqlite://path/to/file.db                         a SQLite store (while no engine has it open)
  (rediss://, Redis over TLS, needs a sagactl built with TLS: this one has none)";

/// The store a command acts on, as an operator should see it.
pub struct Store {
    /// The URL as given: what the connection uses.
    url: String,
    /// The URL with any password masked: what is printed.
    pub shown: String,
    /// The key prefix (Redis) or schema (PostgreSQL).
    prefix: String,
    /// How long connecting and each command may take before the server
    /// counts as unresponsive.
    pub timeout: Duration,
}

impl Store {
    pub fn new(url: String, prefix: String, timeout: Duration) -> Self {
        Store {
            shown: masked(&url),
            url,
            prefix,
            timeout,
        }
    }

    fn is_sqlite(&self) -> bool {
        self.url.starts_with("sqlite://")
    }

    fn is_postgres(&self) -> bool {
        self.url.starts_with("postgres://") || self.url.starts_with("postgresql://")
    }

    /// `redis://host:6379 (prefix `saga`)`: which deployment this is.
    pub fn describe(&self) -> String {
        if self.is_sqlite() {
            return self.shown.clone();
        }
        match self.is_postgres() {
            true => format!("{} (schema `{}`)", self.shown, self.prefix),
            false => format!("{} (prefix `{}`)", self.shown, self.prefix),
        }
    }

    /// The deployment, attached without writing anything: a Redis under
    /// the prefix, or a PostgreSQL database's schema. An unresponsive
    /// server (a socket nobody answers on, a stopped process) is an error
    /// after `timeout`, not after the client's own retries (about 21 s).
    pub async fn attach(&self) -> Result<Arc<dyn Backend>, String> {
        let scheme = self.url.split_once("://").map(|(s, _)| s);
        match scheme {
            Some(
                "redis" | "redis+cluster" | "redis+sentinel" | "postgres" | "postgresql" | "sqlite",
            ) => {}
            Some("rediss") => {
                return Err(format!(
                    "`{}`: this sagactl was built without TLS, so it cannot reach a Redis \
                     over `rediss://`\n{FORMS}",
                    self.shown
                ))
            }
            _ => return Err(format!("`{}` is not a store URL\n{FORMS}", self.shown)),
        }
        match tokio::time::timeout(self.timeout, self.attach_untimed()).await {
            // The node of a cluster that holds the deployment's layout key
            // attaches, and the next command's key is on another node:
            // told now, not after the retries of a `MOVED`.
            Ok(Ok(_)) if self.url.starts_with("redis://") && self.is_cluster_node().await => {
                Err(self.cluster_node())
            }
            Ok(Ok(backend)) => Ok(backend),
            Ok(Err(error)) => Err(self.explain_attach(&error).await),
            Err(_) => Err(self.silent()),
        }
    }

    fn cluster_node(&self) -> String {
        format!(
            "{} is a Redis Cluster node: use `redis+cluster://host:port,host:port` \
             with some of the cluster's nodes",
            self.shown
        )
    }

    async fn attach_untimed(&self) -> Result<Arc<dyn Backend>, BackendError> {
        if self.is_sqlite() {
            // An operator's typo must not create an empty store.
            let config = SqliteConfig {
                create: false,
                ..SqliteConfig::default()
            };
            return Ok(Arc::new(
                SqliteBackend::connect_with(&self.url, config).await?,
            ));
        }
        if self.is_postgres() {
            let config = PostgresConfig {
                schema: self.prefix.clone(),
                ..PostgresConfig::default()
            };
            return Ok(Arc::new(PostgresBackend::attach(&self.url, config).await?));
        }
        let config = RedisConfig {
            prefix: self.prefix.clone(),
            ..RedisConfig::default()
        };
        Ok(Arc::new(RedisBackend::attach(&self.url, config).await?))
    }

    /// Brings a PostgreSQL deployment's schema to this version's; what
    /// it says of the schema before and after.
    pub async fn migrate(&self) -> Result<String, String> {
        if self.is_sqlite() {
            return Err(
                "nothing to migrate by hand on SQLite: the store migrates its file when it opens it"
                    .to_owned(),
            );
        }
        if !self.is_postgres() {
            return Err(
                "nothing to migrate on Redis: a deployment records its key and record \
                 layouts at its first start (`record-layout` switches the latter)"
                    .to_owned(),
            );
        }
        let config = PostgresConfig {
            schema: self.prefix.clone(),
            ..PostgresConfig::default()
        };
        let now = saga_runtime::backend::postgres::SCHEMA_VERSION;
        match PostgresBackend::migrate(&self.url, &config).await {
            Ok(None) => Ok(format!("schema `{}` created at version {now}", self.prefix)),
            Ok(Some(v)) if v == now => Ok(format!(
                "schema `{}` is at version {now} already",
                self.prefix
            )),
            Ok(Some(v)) => Ok(format!(
                "schema `{}` upgraded from version {v} to {now}",
                self.prefix
            )),
            Err(error) => Err(self.explain_attach(&error).await),
        }
    }

    /// The record layout a Redis deployment writes (`1` or `2`), after
    /// switching it to 2 if `switch`.
    pub async fn record_layout(&self, switch: bool) -> Result<u8, String> {
        if self.is_postgres() {
            return Err(
                "record layouts are a Redis deployment's: PostgreSQL keeps each \
                        step in a row of its own already"
                    .to_owned(),
            );
        }
        self.attach().await?;
        let config = RedisConfig {
            prefix: self.prefix.clone(),
            ..RedisConfig::default()
        };
        let work = async {
            let backend = RedisBackend::attach(&self.url, config).await?;
            if switch {
                backend.write_steps_apart().await?;
            }
            backend.writes_steps_apart().await
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(apart)) => Ok(if apart { 2 } else { 1 }),
            Ok(Err(error)) => Err(self.explain_attach(&error).await),
            Err(_) => Err(self.silent()),
        }
    }

    /// What a server that accepted the connection and never answered is.
    pub fn silent(&self) -> String {
        format!(
            "no answer from {} within {} s: is the server there running and answering \
             (not stopped, paused or overloaded), and is it a {} server? \
             (--timeout sets how long to wait)",
            self.shown,
            self.timeout.as_secs_f64(),
            match self.is_postgres() {
                true => "PostgreSQL",
                false => "Redis",
            }
        )
    }

    /// An attach's failure, told with the URL and what to change.
    async fn explain_attach(&self, error: &BackendError) -> String {
        if let Some(redis) = redis_error(error) {
            if redis.kind() == redis::ErrorKind::InvalidClientConfig {
                return format!("`{}` is not a valid Redis URL\n{FORMS}", self.shown);
            }
            if redis.code() == Some("MOVED") {
                return format!(
                    "{} is a Redis Cluster node (it answered MOVED): use \
                     `redis+cluster://host:port,host:port` with some of the cluster's nodes",
                    self.shown
                );
            }
            if redis.to_string().contains("cluster support disabled") {
                return format!(
                    "{} is not a Redis Cluster node (cluster support is disabled there), \
                     but the URL says `redis+cluster://`: use `redis://host:port` for a single \
                     server, or `redis+sentinel://` for one behind Sentinel",
                    self.shown
                );
            }
        }
        if let BackendError::Misconfigured(_) = error {
            // The layout key of a deployment on a cluster lives on one
            // node: the node that holds its slot answers "nothing here"
            // rather than MOVED.
            if self.url.starts_with("redis://") && self.is_cluster_node().await {
                return self.cluster_node();
            }
            return self.scrub(format!("{}: {error}", self.shown));
        }
        if error.is_transient() {
            return self.scrub(format!("cannot reach {}: {error}", self.shown));
        }
        self.scrub(format!("{}: {error}", self.shown))
    }

    /// Whether the single server at the URL runs in cluster mode.
    async fn is_cluster_node(&self) -> bool {
        let probe = async {
            let client = redis::Client::open(self.url.as_str()).ok()?;
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(Some(self.timeout));
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .ok()?;
            let info: String = redis::cmd("INFO")
                .arg("cluster")
                .query_async(&mut conn)
                .await
                .ok()?;
            Some(info.contains("cluster_enabled:1"))
        };
        matches!(
            tokio::time::timeout(self.timeout, probe).await,
            Ok(Some(true))
        )
    }

    /// An engine call's failure: one that reached the store names it.
    pub fn explain(&self, error: &Error) -> String {
        let backend = match error {
            Error::Backend(e) => Some(e),
            Error::Unavailable { source, .. } => Some(source),
            _ => None,
        };
        match backend {
            Some(e) if redis_error(e).is_some_and(|r| r.code() == Some("MOVED")) => {
                self.cluster_node()
            }
            Some(e) if e.is_transient() => self.scrub(format!("lost {}: {error}", self.shown)),
            Some(_) => self.scrub(format!("{}: {error}", self.shown)),
            None => self.scrub(error.to_string()),
        }
    }

    /// [`without_secrets`] for this store's URL.
    pub fn without_secrets(&self, text: String) -> String {
        without_secrets(text, &self.url)
    }

    /// `text`, the runtime's words about the store, with the URL as given
    /// replaced by the masked one, and then [`scrubbed`]: the runtime's
    /// messages may quote the URL, password and all.
    fn scrub(&self, text: String) -> String {
        let text = match self.url == self.shown {
            true => text,
            false => text.replace(&self.url, &self.shown),
        };
        scrubbed(&text, Some(&self.url))
    }
}

/// The Redis error under a backend error, if that is what it is.
fn redis_error(error: &BackendError) -> Option<&redis::RedisError> {
    match error {
        BackendError::Unavailable(source) | BackendError::Rejected(source) => {
            source.downcast_ref::<redis::RedisError>()
        }
        _ => None,
    }
}

/// `url` with the password of each `user:password@` (a cluster or
/// Sentinel URL names several hosts) and any `password=` query parameter
/// replaced by `***`: what is printed goes to terminals and logs.
pub fn masked(url: &str) -> String {
    saga_runtime::backend::redacted(url)
}

/// The shortest password that [`scrubbed`] replaces wherever it appears:
/// a shorter one cannot be told apart from the letters of the message's
/// own words, and replacing those would leave nothing readable.
const SCRUBBED_FROM: usize = 4;

/// `text` as printed: every URL in it [`masked`] (a message of the runtime
/// or a client library may quote the store's URL, or the operator typed a
/// URL where an id goes), and each password of `url` replaced wherever it
/// still appears (a library may quote it decoded, or on its own).
pub fn scrubbed(text: &str, url: Option<&str>) -> String {
    let text = mask_urls(text);
    match url {
        Some(url) => without_secrets(text, url),
        None => text,
    }
}

/// `text` with each password of `url` replaced wherever it appears: what
/// sagactl's own messages (which quote the URL masked, and list the URL
/// forms, placeholders and all) get before they are printed, in case one
/// quotes the runtime's words unscrubbed.
pub fn without_secrets(mut text: String, url: &str) -> String {
    for secret in saga_runtime::backend::url_secrets(url) {
        if secret.chars().count() >= SCRUBBED_FROM && secret != "***" {
            text = text.replace(&secret, "***");
        }
    }
    text
}

/// `text` with each URL in it (`scheme://` up to a blank or a quote, less
/// the punctuation of the sentence around it) [`masked`].
pub fn mask_urls(text: &str) -> String {
    let ends = |c: char| c.is_whitespace() || c.is_control() || matches!(c, '`' | '\'' | '"');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = rest.find("://") {
        let start = rest[..found]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |i| i + 1);
        let end = rest[found..].find(ends).map_or(rest.len(), |e| found + e);
        let url = rest[start..end].trim_end_matches([':', ',', ';', '.', ')']);
        out.push_str(&rest[..start]);
        out.push_str(&masked(url));
        rest = &rest[start + url.len()..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::{masked, scrubbed};

    #[test]
    fn passwords_are_masked() {
        assert_eq!(masked("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(masked("redis://:s3cret@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(
            masked("postgres://ana:pw@db:5432/shop?sslmode=require&password=x"),
            "postgres://ana:***@db:5432/shop?sslmode=require&password=***"
        );
        assert_eq!(
            masked("redis+cluster://:a@h:1,:b@h:2"),
            "redis+cluster://:***@h:1,:***@h:2"
        );
        assert_eq!(masked("redis://user@h:1"), "redis://user@h:1");
    }

    /// A password with a character a URL parser ends the authority at,
    /// typed unencoded, is masked all the same.
    #[test]
    fn a_password_with_a_separator_is_masked() {
        assert_eq!(
            masked("postgres://ana:a/b?c#d@db:5432/shop"),
            "postgres://ana:***@db:5432/shop"
        );
        assert_eq!(masked("redis://:x,y@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(
            masked("postgres://ana@db/shop?x=1"),
            "postgres://ana@db/shop?x=1"
        );
    }

    #[test]
    fn messages_are_scrubbed() {
        let url = "postgres://ana:p%40ss-word@db/shop";
        let text = "cannot reach `postgres://ana:p%40ss-word@db/shop`: auth p@ss-word refused";
        assert_eq!(
            scrubbed(text, Some(url)),
            "cannot reach `postgres://ana:***@db/shop`: auth *** refused"
        );
        assert_eq!(
            scrubbed("dead letter redis://:hunter2@h:1 not found", None),
            "dead letter redis://:***@h:1 not found"
        );
        assert_eq!(scrubbed("a pw b", Some("redis://:pw@h:1")), "a pw b");
        assert_eq!(
            scrubbed("redis://:hunter2@h:1/?password=x2: refused.", None),
            "redis://:***@h:1/?password=***: refused."
        );
    }
}
