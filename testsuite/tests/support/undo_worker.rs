//! A worker process for tests/unknown_outcomes_redis.rs: runs the
//! `undo-pay` saga against the Redis at `REDIS_URL` with a `charge` that
//! takes the money, says so on `undo-pay:charged`, then hangs: the test
//! SIGKILLs the process there, between the step's side effect and the
//! write that would have recorded it.
//!
//! Environment: `REDIS_URL`, `LEASE_MS` (the task lease and the
//! visibility timeout; default 1000).

use std::time::Duration;

use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::Engine;

#[path = "undo_pay.rs"]
mod undo_pay;

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
