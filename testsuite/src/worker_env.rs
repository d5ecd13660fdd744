//! What the worker processes the tests start and SIGKILL read from their
//! environment: the store (`BACKEND_URL`, or `REDIS_URL` as older tests
//! set it), the Redis they record on (`RECORD_URL`, else the store when it
//! is a Redis), the store's backend with short idle waits (as the
//! scenarios' own backends), a dead worker's messages back after `lease`,
//! and their settings, each parsed or else its default.

use std::error::Error;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::sqlite::{SqliteBackend, SqliteConfig};
use saga_runtime::backend::Backend;

/// `name` parsed, or `default` when it is unset or does not parse.
pub fn env<T: FromStr>(name: &str, default: T) -> T {
    env_opt(name).unwrap_or(default)
}

/// `name` parsed, or nothing when it is unset or does not parse: for the
/// settings that have no default (chaos-worker's `POISON`, `LOCK_TTL_MS`).
pub fn env_opt<T: FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// `name` in milliseconds, or `default`.
pub fn env_ms(name: &str, default: u64) -> Duration {
    Duration::from_millis(env(name, default))
}

/// The store's URL and the recording Redis's.
pub fn urls() -> Result<(String, String), Box<dyn Error>> {
    let url = store_url()?;
    let record_url = record_url(&url)?;
    Ok((url, record_url))
}

/// The store's URL alone ([`urls`]' first half): tally-checker needs a
/// recording Redis only when it is named, and chaos-worker falls back to a
/// local Redis of its own when neither variable is set.
pub fn store_url() -> Result<String, Box<dyn Error>> {
    Ok(std::env::var("BACKEND_URL")
        .ok()
        .or_else(|| std::env::var("REDIS_URL").ok())
        .ok_or("BACKEND_URL (or REDIS_URL) is needed")?)
}

/// The recording Redis's URL beside the store at `url` ([`urls`]' second
/// half): `RECORD_URL`, else `REDIS_URL`, else `url` when it is a Redis.
pub fn record_url(url: &str) -> Result<String, Box<dyn Error>> {
    match std::env::var("RECORD_URL")
        .ok()
        .or_else(|| std::env::var("REDIS_URL").ok())
    {
        Some(record_url) => Ok(record_url),
        None if url.starts_with("redis") => Ok(url.to_owned()),
        None => Err(format!("RECORD_URL (a Redis) is needed beside {url}").into()),
    }
}

/// The store `url` names (PostgreSQL idle poll: `POLL_MS`, default 50; a
/// Redis read blocks 100 ms).
pub async fn backend(url: &str, lease: Duration) -> Result<Arc<dyn Backend>, Box<dyn Error>> {
    backend_waiting(url, lease, 50, Duration::from_millis(100)).await
}

/// [`backend`] with other idle waits (a SQLite file has none: its
/// workers are woken in the process): PostgreSQL polls every `POLL_MS`
/// (default `poll_ms`), a Redis read blocks for `block`. chaos-worker has
/// always waited longer (100 ms, 200 ms) than the scenario workers, and the
/// chaos runs and the benchmark keep its defaults.
pub async fn backend_waiting(
    url: &str,
    lease: Duration,
    poll_ms: u64,
    block: Duration,
) -> Result<Arc<dyn Backend>, Box<dyn Error>> {
    if url.starts_with("sqlite://") {
        // The file is the worker's alone while it runs (the store takes its
        // exclusive lock): a test reads it once the worker is gone.
        let config = SqliteConfig {
            visibility_timeout: lease,
            ..SqliteConfig::default()
        };
        return Ok(Arc::new(SqliteBackend::connect_with(url, config).await?));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let config = PostgresConfig {
            visibility_timeout: lease,
            poll_interval: env_ms("POLL_MS", poll_ms),
            ..PostgresConfig::default()
        };
        return Ok(Arc::new(PostgresBackend::connect_url(url, config).await?));
    }
    let config = RedisConfig {
        visibility_timeout: lease,
        block,
        ..RedisConfig::default()
    };
    Ok(Arc::new(RedisBackend::connect_with(url, config).await?))
}
