//! Circuit breakers shared by the deployment (`scope = shared`).

use std::time::Duration;

use async_trait::async_trait;

use super::{ms, scripts as s, RedisBackend};
use crate::backend::{BackendError, BreakerChange, BreakerDecision, Breakers};

#[async_trait]
impl Breakers for RedisBackend {
    async fn breaker_acquire(
        &self,
        name: &str,
        probe_ttl: Duration,
        token: &str,
    ) -> Result<BreakerDecision, BackendError> {
        self.call(&s::BreakerAcquire {
            breaker: self.keys().breaker(name),
            probe_ttl_ms: ms(probe_ttl),
            token,
        })
        .await
    }

    async fn breaker_report(
        &self,
        name: &str,
        probe: Option<&str>,
        failed: Option<bool>,
        threshold: u32,
        open_for: Duration,
    ) -> Result<Option<BreakerChange>, BackendError> {
        // Kept for a day past the break without calls, then forgotten.
        let keep = open_for + Duration::from_secs(24 * 60 * 60);
        self.call(&s::BreakerReport {
            breaker: self.keys().breaker(name),
            probe,
            failed,
            threshold,
            open_ms: ms(open_for),
            keep_ms: ms(keep),
        })
        .await
    }
}
