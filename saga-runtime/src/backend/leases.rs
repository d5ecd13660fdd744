//! Named leases: one timer poller or janitor at a time across the
//! deployment.

use std::time::Duration;

use super::BackendError;
use async_trait::async_trait;

/// Named leases: one holder at a time (the timer poller, the janitor).
#[async_trait]
pub trait Leases: Send + Sync + 'static {
    /// Takes or renews the named lease `name` for `token`; `false` if
    /// someone else holds it.
    async fn named_lease(
        &self,
        name: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, BackendError>;

    /// Releases the named lease if `token` holds it.
    async fn release_named_lease(&self, name: &str, token: &str) -> Result<bool, BackendError>;
}
