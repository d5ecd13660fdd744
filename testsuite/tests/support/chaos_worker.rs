//! A worker process for the fault tests and the benchmark: runs the `chaos`
//! saga's workers against the store at `BACKEND_URL` until killed (or
//! stopped gracefully by Ctrl-C or SIGTERM).
//!
//! Environment (all optional): `BACKEND_URL` (the store: `postgres://..`,
//! or a Redis server's `redis://..`, or a cluster's as
//! `redis+cluster://host:port,..`; default `REDIS_URL`, which older tests
//! set), `RECORD_URL` (where executions are recorded: a single Redis
//! server, whatever the store; default `REDIS_URL`, or the store when that
//! is a Redis), `WORKERS` (2), `VISIBILITY_MS` (1000), `LOCK_TTL_MS` (the
//! engine's default: the visibility timeout), `MAX_WORK_MS` (20),
//! `FAILURE_RATE` (0.1), `RECORD` (1), `POISON` (an input whose steps abort
//! the process), `MAX_DELIVERIES` (10), `TIMER_POLL_MS` (20),
//! `HOUSEKEEPING_MS` (30000), `IDLE_CONSUMER_MS` (600000), `POLL_MS`
//! (PostgreSQL's idle poll, 100), `PROCESS` (1: also run the `crashy`
//! process manager), `PM_POISON` (an input whose handler aborts the
//! process), `BRITTLE` (1: also run `chaos-brittle`, the same steps with
//! two retries each).

use std::time::Duration;

use saga_runtime::Engine;
use sagas_tests::chaos::{Brittle, Chaos, ChaosConfig};
use sagas_tests::worker_env::{backend_waiting, env, env_ms, env_opt, record_url, store_url};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A local Redis when neither BACKEND_URL nor REDIS_URL is set.
    let url = store_url().unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    // The fault tests' settings: the visibility timeout from
    // `VISIBILITY_MS`, and short waits so that a worker notices work (and a
    // restarted server) quickly.
    let visibility_timeout = env_ms("VISIBILITY_MS", 1000);
    let backend =
        backend_waiting(&url, visibility_timeout, 100, Duration::from_millis(200)).await?;
    // Executions are recorded on a Redis whatever the store, out of the
    // way of the faults injected into the store.
    let record_url = record_url(&url)?;
    let recorder = redis::Client::open(record_url.as_str())?
        .get_connection_manager()
        .await?;
    let chaos = ChaosConfig {
        max_work: env_ms("MAX_WORK_MS", 20),
        failure_rate: env("FAILURE_RATE", 0.1),
        record: env("RECORD", 1) == 1,
        poison: env_opt("POISON"),
    };
    let worker = format!("pid-{}", std::process::id());
    let mut builder = Engine::builder()
        .backend_arc(backend)
        .saga(Chaos::new(recorder.clone(), worker.clone(), chaos))
        .lock_retry_delay(Duration::from_millis(50))
        .max_deliveries(env("MAX_DELIVERIES", 10))
        .worker_concurrency(env("CONCURRENCY", 1))
        .timeout_poll_interval(env_ms("TIMER_POLL_MS", 20))
        .housekeeping_interval(env_ms("HOUSEKEEPING_MS", 30_000))
        .idle_consumer_timeout(env_ms("IDLE_CONSUMER_MS", 600_000))
        .workers(0);
    // `PROCESS=1`: also the `crashy` process manager, whose handler aborts
    // the process on the input `PM_POISON`.
    if env("PROCESS", 0) == 1 {
        builder = builder.process_manager(sagas_tests::crashy::Crashy {
            poison: env_opt("PM_POISON"),
        });
    }
    if env("BRITTLE", 0) == 1 {
        builder = builder.saga(Brittle(Chaos::new(recorder, worker, chaos)));
    }
    if let Some(ttl) = env_opt("LOCK_TTL_MS").map(Duration::from_millis) {
        builder = builder.lock_ttl(ttl);
    }
    let engine = builder.build().await?;
    engine
        .run_workers_until(env("WORKERS", 2), saga_runtime::shutdown_signal())
        .await?;
    Ok(())
}
