//! A worker process for the limit scenarios (tests/scenarios/limits.rs):
//! runs the `holder-child` saga, whose step shares the limit `holder-slot`
//! (one at a time across the deployment) with the scenario's own saga,
//! against the store at `BACKEND_URL` until killed. Once its engine runs
//! it sets `limit-worker:ready` on the Redis at `RECORD_URL` and starts
//! one task; the step pushes the task's input onto `limit-worker:starts`
//! there, then blocks for an hour holding the slot: the scenario SIGKILLs
//! the process and checks when the slot comes back.
//!
//! Environment: `BACKEND_URL` (the store: `postgres://..` or a Redis
//! server's `redis://..`; default `REDIS_URL`), `RECORD_URL` (a Redis
//! server, whatever the store; default `REDIS_URL`, or `BACKEND_URL` when
//! that is a Redis), `LEASE_MS` (the task lease and the visibility
//! timeout, hence how long the slot outlives the process; default 1000),
//! `POLL_MS` (PostgreSQL's idle poll, 50).

use std::time::Duration;

use redis::AsyncCommands;
use saga_runtime::prelude::*;
use sagas_tests::worker_env::{backend, env_ms, urls};

struct Holder {
    recorder: redis::aio::ConnectionManager,
}

/// A saga only this process runs (the scenario's engine hands its messages
/// back), sharing the scenario saga's slot by the limit's name.
#[saga(name = "holder-child")]
impl Holder {
    #[saga_step(1)]
    #[limit(concurrency = 1, name = "holder-slot")]
    async fn hold(&self, n: u32) -> Result<u32, StepError> {
        let mut recorder = self.recorder.clone();
        let _: () = recorder
            .rpush("limit-worker:starts", n)
            .await
            .map_err(|e| StepError::transient(e.to_string()))?;
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(n)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, record_url) = urls()?;
    let lease = env_ms("LEASE_MS", 1000);
    let recorder = redis::Client::open(record_url.as_str())?
        .get_connection_manager()
        .await?;
    let engine = Engine::builder()
        .backend_arc(backend(&url, lease).await?)
        .saga(Holder {
            recorder: recorder.clone(),
        })
        .lock_ttl(lease)
        .workers(0)
        .build()
        .await?;
    let mut ready = recorder;
    let _: () = ready.set("limit-worker:ready", std::process::id()).await?;
    engine.start::<Holder>(1).await?;
    engine
        .run_workers_until(1, saga_runtime::shutdown_signal())
        .await?;
    Ok(())
}
