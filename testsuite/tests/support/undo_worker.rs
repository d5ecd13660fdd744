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

use saga_runtime::Engine;
use sagas_tests::worker_env::{backend, env_ms, urls};

#[path = "undo_pay.rs"]
mod undo_pay;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, record_url) = urls()?;
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
