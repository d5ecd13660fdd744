//! Reaching the deployment's store, and saying what went wrong in terms an
//! operator can act on: which URL, what it should look like, what kind of
//! server answered. An operator typing a URL by hand meets these errors
//! first, and the runtime's own (`backend unavailable: Moved: 9869 ...`)
//! name neither the URL nor the fix.

use std::sync::Arc;
use std::time::Duration;

use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::{Backend, BackendError};
use saga_runtime::Error;

/// The URL forms sagactl accepts, for an error about a URL.
pub const FORMS: &str = "accepted store URLs:
  redis://[[user]:password@]host:port[/db]         one Redis server
  redis+cluster://host:port,host:port              a Redis Cluster (some of its nodes)
  redis+sentinel://host:port,host:port/<service>   a Redis behind Sentinel
  postgres://user[:password]@host:port/database    PostgreSQL
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

    fn is_postgres(&self) -> bool {
        self.url.starts_with("postgres://") || self.url.starts_with("postgresql://")
    }

    /// `redis://host:6379 (prefix `saga`)`: which deployment this is.
    pub fn describe(&self) -> String {
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
            Some("redis" | "redis+cluster" | "redis+sentinel" | "postgres" | "postgresql") => {}
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
            return self.unmask(format!("{}: {error}", self.shown));
        }
        if error.is_transient() {
            return self.unmask(format!("cannot reach {}: {error}", self.shown));
        }
        self.unmask(format!("{}: {error}", self.shown))
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
            Some(e) if e.is_transient() => self.unmask(format!("lost {}: {error}", self.shown)),
            Some(_) => self.unmask(format!("{}: {error}", self.shown)),
            None => error.to_string(),
        }
    }

    /// `text` with the URL as given replaced by the masked one: the
    /// runtime's messages may quote the URL, password and all.
    fn unmask(&self, text: String) -> String {
        match self.url == self.shown {
            true => text,
            false => text.replace(&self.url, &self.shown),
        }
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
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority: Vec<String> = authority
        .split(',')
        .map(|host| match host.rsplit_once('@') {
            Some((userinfo, at)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***@{at}"),
                None => host.to_owned(),
            },
            None => host.to_owned(),
        })
        .collect();
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if key.eq_ignore_ascii_case("password") => {
                        format!("{key}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{}{tail}", authority.join(","))
}

#[cfg(test)]
mod tests {
    use super::masked;

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
}
