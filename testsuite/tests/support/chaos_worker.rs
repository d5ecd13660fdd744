//! A worker process for the fault tests and the benchmark: runs the `chaos`
//! saga's workers against the store at `BACKEND_URL` until killed (or
//! stopped gracefully by Ctrl-C or SIGTERM).
//!
//! Environment (all optional): `BACKEND_URL` (the store: `postgres://..`,
//! or a Redis server's `redis://..`, or a cluster's as
//! `redis+cluster://host:port,..`; default `REDIS_URL`, which older tests
//! set), `RECORD_URL` (where executions are recorded: a single Redis server,
//! whatever the store; default `REDIS_URL`), `WORKERS` (2), `VISIBILITY_MS`
//! (1000), `LOCK_TTL_MS` (the engine's default: the visibility timeout),
//! `MAX_WORK_MS` (20), `FAILURE_RATE` (0.1), `RECORD` (1), `POISON` (an
//! input whose steps abort the process), `MAX_DELIVERIES` (10),
//! `TIMER_POLL_MS` (20), `HOUSEKEEPING_MS` (30000), `IDLE_CONSUMER_MS`
//! (600000), `POLL_MS` (PostgreSQL's idle poll, 100), `PROCESS` (1: also
//! run the `crashy` process manager), `PM_POISON` (an input whose handler
//! aborts the process), `BRITTLE` (1: also run `chaos-brittle`, the same
//! steps with two retries each).

use std::sync::Arc;
use std::time::Duration;

use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::Backend;
use saga_runtime::Engine;
use sagas_tests::chaos::{Brittle, Chaos, ChaosConfig};

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

/// The store `url` names, with the fault tests' settings: the visibility
/// timeout from `VISIBILITY_MS`, and short waits so that a worker notices
/// work (and a restarted server) quickly.
async fn backend(url: &str) -> Result<Arc<dyn Backend>, Box<dyn std::error::Error>> {
    let visibility_timeout = Duration::from_millis(env("VISIBILITY_MS", 1000));
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let config = PostgresConfig {
            visibility_timeout,
            poll_interval: Duration::from_millis(env("POLL_MS", 100)),
            ..PostgresConfig::default()
        };
        return Ok(Arc::new(PostgresBackend::connect_url(url, config).await?));
    }
    let config = RedisConfig {
        visibility_timeout,
        block: Duration::from_millis(200),
        ..RedisConfig::default()
    };
    Ok(Arc::new(RedisBackend::connect_with(url, config).await?))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis_url: Option<String> = std::env::var("REDIS_URL").ok();
    let url: String = std::env::var("BACKEND_URL")
        .ok()
        .or_else(|| redis_url.clone())
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_owned());
    let backend = backend(&url).await?;
    // Executions are recorded on a Redis whatever the store, out of the
    // way of the faults injected into the store.
    let record_url: String = match std::env::var("RECORD_URL").ok().or(redis_url) {
        Some(record_url) => record_url,
        None if url.starts_with("redis") => url.clone(),
        None => return Err(format!("RECORD_URL (a Redis) is needed beside {url}").into()),
    };
    let recorder = redis::Client::open(record_url.as_str())?
        .get_connection_manager()
        .await?;
    let chaos = ChaosConfig {
        max_work: Duration::from_millis(env("MAX_WORK_MS", 20)),
        failure_rate: env("FAILURE_RATE", 0.1),
        record: env("RECORD", 1) == 1,
        poison: std::env::var("POISON").ok().and_then(|v| v.parse().ok()),
    };
    let worker = format!("pid-{}", std::process::id());
    let mut builder = Engine::builder()
        .backend_arc(backend)
        .saga(Chaos::new(recorder.clone(), worker.clone(), chaos))
        .lock_retry_delay(Duration::from_millis(50))
        .max_deliveries(env("MAX_DELIVERIES", 10))
        .worker_concurrency(env("CONCURRENCY", 1))
        .timeout_poll_interval(Duration::from_millis(env("TIMER_POLL_MS", 20)))
        .housekeeping_interval(Duration::from_millis(env("HOUSEKEEPING_MS", 30_000)))
        .idle_consumer_timeout(Duration::from_millis(env("IDLE_CONSUMER_MS", 600_000)))
        .workers(0);
    // `PROCESS=1`: also the `crashy` process manager, whose handler aborts
    // the process on the input `PM_POISON`.
    if env("PROCESS", 0) == 1 {
        builder = builder.process_manager(sagas_tests::crashy::Crashy {
            poison: std::env::var("PM_POISON").ok().and_then(|v| v.parse().ok()),
        });
    }
    if env("BRITTLE", 0) == 1 {
        builder = builder.saga(Brittle(Chaos::new(recorder, worker, chaos)));
    }
    if let Some(ttl) = env_ms("LOCK_TTL_MS") {
        builder = builder.lock_ttl(ttl);
    }
    let engine = builder.build().await?;
    engine
        .run_workers_until(env("WORKERS", 2), saga_runtime::shutdown_signal())
        .await?;
    Ok(())
}
