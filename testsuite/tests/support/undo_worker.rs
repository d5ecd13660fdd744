//! A worker process for the lost-outcome scenarios
//! (tests/scenarios/outcomes.rs): runs the `undo-pay` saga against the
//! store at `BACKEND_URL` with a `charge` that takes the money, says so on
//! `undo-pay:charged` on the Redis at `RECORD_URL`, then hangs: the
//! scenario SIGKILLs the process there, between the step's side effect and
//! the write that would have recorded it.
//!
//! Environment: `BACKEND_URL` (the store: `postgres://..` or a Redis
//! server's `redis://..`; default `REDIS_URL`), `RECORD_URL` (a Redis
//! server, whatever the store; default `REDIS_URL`, or `BACKEND_URL` when
//! that is a Redis), `LEASE_MS` (the task lease and the visibility
//! timeout; default 1000), `POLL_MS` (PostgreSQL's idle poll, 50).

use std::sync::Arc;
use std::time::Duration;

use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::Backend;
use saga_runtime::Engine;

#[path = "undo_pay.rs"]
mod undo_pay;

fn env_ms(name: &str, default: u64) -> Duration {
    Duration::from_millis(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

/// The store `url` names, a dead worker's messages back after `lease`,
/// with short idle waits (as the scenarios' own backends).
async fn backend(
    url: &str,
    lease: Duration,
) -> Result<Arc<dyn Backend>, Box<dyn std::error::Error>> {
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
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
    let lease = env_ms("LEASE_MS", 1000);
    let recorder = redis::Client::open(record_url.as_str())?
        .get_connection_manager()
        .await?;
    let engine = Engine::builder()
        .backend_arc(backend(&url, lease).await?)
        .saga(undo_pay::UndoPay {
            recorder,
            hang_after_charge: true,
            decline: false,
        })
        .lock_ttl(lease)
        .workers(0)
        .build()
        .await?;
    engine
        .run_workers_until(1, saga_runtime::shutdown_signal())
        .await?;
    Ok(())
}
