//! Housekeeping: what keeps a deployment's storage bounded over a year of
//! traffic. Finished tasks expire after their retention, dead letters are
//! trimmed by age and count, and the queue forgets consumers of workers
//! that left.
//!
//! One engine at a time does it, the one holding the `housekeeping` lease.
//! Every engine samples the queue gauges and the count of tasks waiting
//! for an operator on the same beat (feature `metrics`): two backend round
//! trips, lease or not, from the first beat
//! on (not at start: many engines starting at once need not all look).

use std::sync::Arc;

use crate::worker::runtime::Runtime;

/// Runs until the engine shuts down.
pub(crate) async fn run(rt: Arc<Runtime>) {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let every = rt.settings.housekeeping_interval;
    let lease_ttl = every * 3;
    loop {
        tokio::select! {
            _ = rt.shutdown.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
        crate::metrics::sample_queue(rt.backend.as_ref()).await;
        let sagas: Vec<&'static str> = rt.sagas.latest().iter().map(|d| d.name).collect();
        crate::metrics::sample_tasks(rt.backend.as_ref(), &sagas).await;
        if cfg!(feature = "metrics") {
            super::limits::sample(&rt).await;
        }
        match rt
            .leases()
            .named_lease("housekeeping", &token, lease_ttl)
            .await
        {
            Ok(true) => {}
            Ok(false) => continue,
            Err(error) => {
                tracing::warn!(%error, "housekeeping lease failed; will retry");
                continue;
            }
        }
        let retention = rt.settings.housekeeping();
        loop {
            match rt.backend.housekeep(&retention).await {
                Ok(done) => {
                    if done != Default::default() {
                        tracing::info!(
                            tasks = done.tasks,
                            dead_letters = done.dead_letters,
                            consumers = done.consumers,
                            "housekeeping removed expired records"
                        );
                    }
                    // A full batch of tasks: more may be waiting.
                    if done.tasks < retention.batch {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "housekeeping failed; will retry");
                    break;
                }
            }
        }
    }
    let _ = rt
        .leases()
        .release_named_lease("housekeeping", &token)
        .await;
}
