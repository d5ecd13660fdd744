//! What the worker processes the tests start and SIGKILL read from their
//! environment: the store (`BACKEND_URL`, or `REDIS_URL` as older tests
//! set it), the Redis they record on (`RECORD_URL`, else the store when it
//! is a Redis), and the store's backend with short idle waits (as the
//! scenarios' own backends), a dead worker's messages back after `lease`.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::Backend;

/// `name` in milliseconds, or `default`.
pub fn env_ms(name: &str, default: u64) -> Duration {
    Duration::from_millis(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

/// The store's URL and the recording Redis's.
pub fn urls() -> Result<(String, String), Box<dyn Error>> {
    let redis_url = std::env::var("REDIS_URL").ok();
    let url = std::env::var("BACKEND_URL")
        .ok()
        .or_else(|| redis_url.clone())
        .ok_or("BACKEND_URL (or REDIS_URL) is needed")?;
    let record_url = match std::env::var("RECORD_URL").ok().or(redis_url) {
        Some(record_url) => record_url,
        None if url.starts_with("redis") => url.clone(),
        None => return Err(format!("RECORD_URL (a Redis) is needed beside {url}").into()),
    };
    Ok((url, record_url))
}

/// The store `url` names (PostgreSQL idle poll: `POLL_MS`, default 50).
pub async fn backend(url: &str, lease: Duration) -> Result<Arc<dyn Backend>, Box<dyn Error>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let config = PostgresConfig {
            visibility_timeout: lease,
            poll_interval: env_ms("POLL_MS", 50),
            ..PostgresConfig::default()
        };
        return Ok(Arc::new(PostgresBackend::connect_url(url, config).await?));
    }
    let config = RedisConfig {
        visibility_timeout: lease,
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    };
    Ok(Arc::new(RedisBackend::connect_with(url, config).await?))
}
