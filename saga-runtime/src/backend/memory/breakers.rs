//! Circuit breakers shared by the engines on this store.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryBackend;
use crate::backend::{BackendError, BreakerChange, BreakerDecision, Breakers};

/// A `scope = shared` breaker: shared by the engines on this backend.
#[derive(Default)]
pub(super) struct SharedBreaker {
    pub(super) failures: u32,
    /// Open until then; `None` while closed.
    pub(super) open_until: Option<Instant>,
    /// A probe is out until then, under this token.
    pub(super) probe_until: Option<Instant>,
    pub(super) probe_token: String,
}

#[async_trait]
impl Breakers for MemoryBackend {
    async fn breaker_acquire(
        &self,
        name: &str,
        probe_ttl: Duration,
        token: &str,
    ) -> Result<BreakerDecision, BackendError> {
        let mut state = self.state();
        let breaker = state.breakers.entry(name.to_owned()).or_default();
        let now = Instant::now();
        let Some(open_until) = breaker.open_until else {
            return Ok(BreakerDecision::Call {
                probe: false,
                counting: breaker.failures > 0,
            });
        };
        if now < open_until {
            return Ok(BreakerDecision::Open {
                retry_after: open_until - now,
            });
        }
        if let Some(probe_until) = breaker.probe_until.filter(|until| now < *until) {
            return Ok(BreakerDecision::Open {
                retry_after: probe_until - now,
            });
        }
        breaker.probe_until = Some(now + probe_ttl);
        breaker.probe_token = token.to_owned();
        Ok(BreakerDecision::Call {
            probe: true,
            counting: false,
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
        let mut state = self.state();
        let breaker = state.breakers.entry(name.to_owned()).or_default();
        let now = Instant::now();
        if probe.is_some_and(|token| token != breaker.probe_token || breaker.probe_until.is_none())
        {
            return Ok(None);
        }
        let probe = probe.is_some();
        let Some(failed) = failed else {
            if probe {
                breaker.probe_until = None;
            }
            return Ok(None);
        };
        let opened = SharedBreaker {
            open_until: Some(now + open_for),
            ..SharedBreaker::default()
        };
        Ok(match (failed, probe) {
            (false, true) => {
                *breaker = SharedBreaker::default();
                Some(BreakerChange::Closed)
            }
            (false, false) => {
                breaker.failures = 0;
                None
            }
            (true, true) => {
                *breaker = opened;
                Some(BreakerChange::Opened)
            }
            // A call admitted before the breaker opened changes nothing.
            (true, false) if breaker.open_until.is_some() => None,
            (true, false) => {
                breaker.failures += 1;
                (breaker.failures >= threshold).then(|| {
                    *breaker = opened;
                    BreakerChange::Opened
                })
            }
        })
    }
}
