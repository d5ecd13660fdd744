//! Timers: delayed saga messages (retry backoffs, handed-back messages) and
//! process-manager timeouts become deliverable when they fall due.
//!
//! One engine at a time moves them, the one holding the `timers` lease, so
//! that pollers in many processes do not all scan. Each entry is moved
//! exactly once even without the lease: the backend moves it atomically.

use std::sync::Arc;
use std::time::Duration;

use crate::model::task::Timestamp;
use crate::worker::runtime::Runtime;

/// Entries moved per backend call.
const BATCH: usize = 256;

/// Polls until the engine shuts down.
pub(crate) async fn run(rt: Arc<Runtime>) {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let poll = rt.settings.timer_poll;
    let lease_ttl = (poll * 20).max(Duration::from_secs(2));
    let mut holder = false;
    loop {
        // A holder polls at the configured pace; the others only check, now
        // and then, whether the holder went away.
        let wait = if holder {
            poll
        } else {
            (lease_ttl / 4).max(poll)
        };
        tokio::select! {
            _ = rt.shutdown.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
        holder = match rt.leases().named_lease("timers", &token, lease_ttl).await {
            Ok(held) => held,
            Err(error) => {
                tracing::warn!(%error, "timer lease failed; will retry");
                false
            }
        };
        if holder {
            move_due(&rt).await;
        }
    }
    let _ = rt.leases().release_named_lease("timers", &token).await;
}

async fn move_due(rt: &Runtime) {
    loop {
        // A sum over partitions: a full batch from any one reaches BATCH.
        match rt.backend.release_due(BATCH).await {
            Ok(n) if n >= BATCH => continue,
            Ok(_) => break,
            Err(error) => {
                tracing::warn!(%error, "moving due retries failed; will retry");
                break;
            }
        }
    }
    // Process-manager timeouts too, whether or not this engine runs any
    // process managers: the lease holder moves every timer of the
    // deployment, and may well be a process that runs only sagas. A
    // backend without a process store has none.
    let Ok(processes) = rt.processes() else {
        return;
    };
    loop {
        match processes
            .process_release_due(Timestamp::now().0, BATCH)
            .await
        {
            Ok(n) if n >= BATCH => continue,
            Ok(_) => break,
            Err(error) => {
                tracing::warn!(%error, "releasing due timeouts failed; will retry");
                break;
            }
        }
    }
}
