//! A worker process for tests/limits_redis.rs: runs the `holder-child`
//! saga, whose step shares the limit `holder-slot` (one at a time across
//! the deployment) with the test's own saga, against the Redis at
//! `REDIS_URL` until killed. Once its engine runs it sets
//! `limit-worker:ready` and starts one task; the step pushes the task's
//! input onto `limit-worker:starts`, then blocks for an hour holding the
//! slot: the test SIGKILLs the process and checks when the slot comes back.
//!
//! Environment: `REDIS_URL`, `LEASE_MS` (the task lease and the visibility
//! timeout, hence how long the slot outlives the process; default 1000).

use std::time::Duration;

use redis::AsyncCommands;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;

struct Holder {
    recorder: redis::aio::ConnectionManager,
}

/// A saga only this process runs (the test's engine hands its messages
/// back), sharing the test saga's slot by the limit's name.
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
    let url = std::env::var("REDIS_URL")?;
    let lease = Duration::from_millis(
        std::env::var("LEASE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000),
    );
    let recorder = redis::Client::open(url.as_str())?
        .get_connection_manager()
        .await?;
    let config = RedisConfig {
        visibility_timeout: lease,
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    };
    let engine = Engine::builder()
        .backend(RedisBackend::connect_with(&url, config).await?)
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
