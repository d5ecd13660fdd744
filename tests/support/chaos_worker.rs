//! A worker process for the fault tests and the benchmark: runs the `chaos`
//! saga's workers against the Redis at `REDIS_URL` until killed (or
//! stopped gracefully by Ctrl-C or SIGTERM).
//!
//! Environment (all optional): `REDIS_URL` (a server's, or a cluster's as
//! `redis+cluster://host:port,..`), `RECORD_URL` (where executions are
//! recorded: a single server; default `REDIS_URL`), `WORKERS` (2), `VISIBILITY_MS`
//! (1000), `LOCK_TTL_MS` (the engine's default: the visibility timeout),
//! `MAX_WORK_MS` (20), `FAILURE_RATE` (0.1), `RECORD` (1), `POISON` (an
//! input whose steps abort the process), `MAX_DELIVERIES` (10),
//! `TIMER_POLL_MS` (20), `HOUSEKEEPING_MS` (30000), `IDLE_CONSUMER_MS`
//! (600000).

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

fn env_ms(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
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
    let record_url: String = env("RECORD_URL", url.clone());
    let recorder = redis::Client::open(record_url.as_str())?
        .get_connection_manager()
        .await?;
    let chaos = ChaosConfig {
        max_work: Duration::from_millis(env("MAX_WORK_MS", 20)),
        failure_rate: env("FAILURE_RATE", 0.1),
        record: env("RECORD", 1) == 1,
        poison: std::env::var("POISON").ok().and_then(|v| v.parse().ok()),
    };
    let mut builder = Engine::builder()
        .backend(backend)
        .saga(Chaos::new(
            recorder,
            format!("pid-{}", std::process::id()),
            chaos,
        ))
        .lock_retry_delay(Duration::from_millis(50))
        .max_deliveries(env("MAX_DELIVERIES", 10))
        .worker_concurrency(env("CONCURRENCY", 1))
        .timeout_poll_interval(Duration::from_millis(env("TIMER_POLL_MS", 20)))
        .housekeeping_interval(Duration::from_millis(env("HOUSEKEEPING_MS", 30_000)))
        .idle_consumer_timeout(Duration::from_millis(env("IDLE_CONSUMER_MS", 600_000)))
        .workers(0);
    if let Some(ttl) = env_ms("LOCK_TTL_MS") {
        builder = builder.lock_ttl(ttl);
    }
    let engine = builder.build().await?;
    engine
        .run_workers_until(env("WORKERS", 2), saga_runtime::shutdown_signal())
        .await?;
    Ok(())
}
