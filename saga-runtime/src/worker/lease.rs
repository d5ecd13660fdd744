//! A task's lease while a worker holds it: renewed by a heartbeat while a
//! step runs, released however the run ends.
//!
//! The lease is short (the backend's visibility timeout by default) so that
//! a killed worker's tasks resume within seconds. The heartbeat renews it
//! and the message's visibility a few times per lease, and brings back a
//! cancellation requested in any process.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{Delivery, Lease, TaskRefusal};
use crate::model::task::Timestamp;
use crate::util::Unpoisoned;
use crate::worker::limits::HeldLimits;
use crate::worker::runtime::Runtime;

/// Releases the lock if processing stops before a commit released it (an
/// error, or the future being dropped at shutdown), so the task is not
/// blocked for a whole lease.
pub(super) struct LeaseGuard {
    rt: Arc<Runtime>,
    lease: Option<Lease>,
}

impl LeaseGuard {
    pub fn new(rt: &Arc<Runtime>, lease: &Lease) -> Self {
        LeaseGuard {
            rt: rt.clone(),
            lease: Some(lease.clone()),
        }
    }

    /// The commit released the lease.
    pub fn disarm(&mut self) {
        self.lease = None;
    }

    /// Releases the lease now.
    pub async fn release(mut self) {
        if let Some(lease) = self.lease.take() {
            if let Err(error) = self.rt.backend.unlock(&lease).await {
                tracing::debug!(%error, task_id = %lease.task_id, "unlock failed; the lease expires on its own");
            }
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let (Some(lease), Ok(handle)) =
            (self.lease.take(), tokio::runtime::Handle::try_current())
        {
            let backend = self.rt.backend.clone();
            let unlock = async move {
                let _ = backend.unlock(&lease).await;
            };
            self.rt.tasks.spawn_on(unlock, &handle);
        }
    }
}

/// The heartbeat of one held lease.
pub(super) struct Heartbeat<'a> {
    pub rt: &'a Runtime,
    pub lease: &'a Lease,
    pub delivery: &'a Delivery,
    /// When the lease was requested: it runs from then at the latest.
    pub leased_at: Instant,
    /// Fired when cancellation of the task is requested.
    pub cancel: &'a CancellationToken,
    /// When the cancellation was requested, once known.
    pub cancelled_at: Mutex<Option<Timestamp>>,
    /// The limit slots the attempt holds: renewed with the lease, so that
    /// a killed worker's slots are freed as soon as its lease would be.
    pub limits: Option<&'a HeldLimits>,
}

impl Heartbeat<'_> {
    /// Renews the lease and the message until the lease is lost; relays
    /// cancellation. Completes only when the lease is lost, or may be:
    /// the lease counts from when its last renewal was *sent*, and the step
    /// is given up a tick before it could expire even while a renewal hangs
    /// (a partition that drops packets rather than connections). Another
    /// worker can take the task only after the lease expired, so two never
    /// run it at once.
    pub async fn beat(&self) -> TaskRefusal {
        let ttl = self.rt.lease_ttl();
        let tick = self.rt.heartbeat_every();
        let mut renewed = self.leased_at;
        loop {
            let deadline = renewed + ttl.saturating_sub(tick);
            tokio::time::sleep_until((Instant::now() + tick).min(deadline)).await;
            if Instant::now() >= deadline {
                return self.given_up(renewed);
            }
            let sent = Instant::now();
            let beat = self.rt.backend.heartbeat(self.lease, self.delivery, ttl);
            match tokio::time::timeout_at(deadline, beat).await {
                Err(_) => return self.given_up(renewed),
                Ok(Ok(beat)) if !beat.lock_held => return self.lost(),
                Ok(Ok(beat)) => {
                    renewed = sent;
                    if let Some(at) = beat.cancel_requested {
                        self.cancelled(at);
                    }
                    if let Some(limits) = self.limits {
                        let left = deadline.saturating_duration_since(Instant::now());
                        limits.renew(ttl, left.min(tick)).await;
                    }
                }
                Ok(Err(error)) => tracing::debug!(%error, "heartbeat failed; will retry"),
            }
        }
    }

    fn given_up(&self, renewed: Instant) -> TaskRefusal {
        tracing::warn!(
            task_id = %self.lease.task_id, since = ?renewed.elapsed(),
            "the lease could not be renewed and is about to expire; abandoning the step"
        );
        self.lost()
    }

    fn lost(&self) -> TaskRefusal {
        TaskRefusal::LockLost {
            fence: self.lease.fence,
        }
    }

    pub fn cancelled(&self, at: Timestamp) {
        self.cancelled_at.locked().get_or_insert(at);
        self.cancel.cancel();
    }

    /// When cancellation was requested: as the heartbeat saw it, else as
    /// the store says, else now (the in-process signal came first).
    pub async fn cancelled_at(&self) -> Timestamp {
        let seen = *self.cancelled_at.locked();
        if let Some(at) = seen {
            return at;
        }
        match self.rt.backend.cancel_requested(self.lease.task_id).await {
            Ok(Some(at)) => at,
            _ => Timestamp::now(),
        }
    }
}
