//! A worker process for the crash tests and the benchmark: runs the `chaos`
//! saga's workers against the Redis at `REDIS_URL` until killed.
//!
//! Environment: `REDIS_URL`, `WORKERS` (default 2), `LOCK_TTL_MS` (default
//! 2000), `VISIBILITY_MS` (default 1000), `MAX_WORK_MS` (default 20),
//! `FAILURE_RATE` (default 0.1), `RECORD` (default 1).

use std::time::Duration;

use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::Engine;
use sagas::chaos::{Chaos, ChaosConfig};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url: String = env("REDIS_URL", "redis://127.0.0.1:6379/".to_owned());
    let config = RedisConfig {
        visibility_timeout: Duration::from_millis(env("VISIBILITY_MS", 1000)),
        block: Duration::from_millis(200),
        ..RedisConfig::default()
    };
    let backend = RedisBackend::connect_with(&url, config).await?;
    let recorder = redis::Client::open(url.as_str())?
        .get_connection_manager()
        .await?;
    let chaos = ChaosConfig {
        max_work: Duration::from_millis(env("MAX_WORK_MS", 20)),
        failure_rate: env("FAILURE_RATE", 0.1),
        record: env("RECORD", 1) == 1,
    };
    let engine = Engine::builder()
        .backend(backend)
        .saga(Chaos::new(
            recorder,
            format!("pid-{}", std::process::id()),
            chaos,
        ))
        .lock_ttl(Duration::from_millis(env("LOCK_TTL_MS", 2000)))
        .lock_retry_delay(Duration::from_millis(50))
        .workers(0)
        .build()
        .await?;
    engine.run_workers(env("WORKERS", 2)).await?;
    Ok(())
}
