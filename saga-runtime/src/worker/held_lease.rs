//! A named lease one engine of a deployment holds for a duty (a route's
//! bridge, an endpoint's relay), renewed on the way, trusted only for the
//! TTL it was granted for.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Leases;

/// The lease `name`, as this engine holds it (or not).
pub(crate) struct HeldLease {
    name: String,
    token: String,
    ttl: Duration,
    /// When it was last asked for and granted: it lasts at least until
    /// this plus the TTL.
    asked: Option<Instant>,
}

impl HeldLease {
    pub(crate) fn new(name: String, ttl: Duration) -> Self {
        HeldLease {
            name,
            token: uuid::Uuid::new_v4().simple().to_string(),
            ttl,
            asked: None,
        }
    }

    /// Whether this engine holds it now: asks for it (or renews it) when
    /// a third of its TTL went by since it was last granted.
    pub(crate) async fn holds(&mut self, leases: &dyn Leases) -> bool {
        let now = Instant::now();
        if self.asked.is_none_or(|at| now >= at + self.ttl / 3) {
            self.asked = match leases.named_lease(&self.name, &self.token, self.ttl).await {
                Ok(true) => Some(now),
                Ok(false) => None,
                Err(error) => {
                    tracing::warn!(lease = %self.name, %error, "renewing a lease failed");
                    None
                }
            };
        }
        self.asked.is_some_and(|at| Instant::now() < at + self.ttl)
    }

    /// Lets it go, so that another engine takes the duty over at once.
    pub(crate) async fn release(&mut self, leases: &dyn Leases) {
        if self.asked.take().is_some() {
            let _ = leases.release_named_lease(&self.name, &self.token).await;
        }
    }

    /// How long one that does not hold it waits before it asks again.
    pub(crate) fn retry_every(&self) -> Duration {
        self.ttl / 3
    }
}
