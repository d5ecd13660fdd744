//! Circuit breakers shared by the deployment (`scope = shared`).

use std::time::Duration;

use async_trait::async_trait;

use super::{ms, scripts as s, RedisBackend};
use crate::backend::{BackendError, BreakerDecision, Breakers};

#[async_trait]
impl Breakers for RedisBackend {
    async fn breaker_acquire(
        &self,
        name: &str,
        probe_ttl: Duration,
        token: &str,
    ) -> Result<BreakerDecision, BackendError> {
        let (call, value): (i64, u64) = self
            .run(
                s::BREAKER_ACQUIRE
                    .key(self.keys().breaker(name))
                    .arg(ms(probe_ttl))
                    .arg(token),
            )
            .await?;
        Ok(match call {
            1 => BreakerDecision::Call { probe: value == 1 },
            _ => BreakerDecision::Open {
                retry_after: Duration::from_millis(value),
            },
        })
    }

    async fn breaker_report(
        &self,
        name: &str,
        probe: Option<&str>,
        failed: Option<bool>,
        threshold: u32,
        open_for: Duration,
    ) -> Result<(), BackendError> {
        // Kept for a day past the break without calls, then forgotten.
        let keep = open_for + Duration::from_secs(24 * 60 * 60);
        let _: i64 = self
            .run(
                s::BREAKER_REPORT
                    .key(self.keys().breaker(name))
                    .arg(probe.unwrap_or_default())
                    .arg(match failed {
                        None => "-",
                        Some(true) => "1",
                        Some(false) => "0",
                    })
                    .arg(threshold)
                    .arg(ms(open_for))
                    .arg(ms(keep)),
            )
            .await?;
        Ok(())
    }
}
