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
        let reply: Vec<u64> = self
            .run(
                s::BREAKER_ACQUIRE
                    .key(self.keys().breaker(name))
                    .arg(ms(probe_ttl))
                    .arg(token),
            )
            .await?;
        Ok(match reply.as_slice() {
            [1, probe, counting] => BreakerDecision::Call {
                probe: *probe == 1,
                counting: *counting == 1,
            },
            [0, ms] => BreakerDecision::Open {
                retry_after: Duration::from_millis(*ms),
            },
            _ => return Err(super::corrupt("unexpected reply from the breaker script")),
        })
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
        let changed: i64 = self
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
        Ok(match changed {
            1 => Some(BreakerChange::Opened),
            2 => Some(BreakerChange::Closed),
            _ => None,
        })
    }
}
