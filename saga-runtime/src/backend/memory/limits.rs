//! Flow-control limits for the engines on this store: each `(limit, key)`
//! is a [`LimitState`] under the store's lock, decided by the limit
//! machine (`limit/machine.rs`; the protocol is in `backend/limits.rs`).

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryBackend;
use crate::backend::{Acquired, BackendError, LimitRequest, LimitUsage, Limits, Released};
use crate::limit::machine::{LimitState, Moment};
use crate::limit::LimitConfig;

type LimitId = (String, Option<String>);

fn id(limit: &str, key: Option<&str>) -> LimitId {
    (limit.to_owned(), key.map(str::to_owned))
}

impl super::State {
    /// Drops the limits whose every slot, waiter and booking ran out.
    pub(super) fn sweep_limits(&mut self, now: Moment) {
        self.limits.retain(|_, l| {
            l.prune(now);
            !l.is_idle(now)
        });
    }
}

impl MemoryBackend {
    /// The limit machine's time now.
    pub(super) fn moment(&self, at: Instant) -> Moment {
        at.saturating_duration_since(self.shared.epoch)
    }

    /// Runs `f` on the limit's state, dropping it once idle (a key used
    /// once must not be kept for ever).
    fn with_limit<T>(&self, id: LimitId, f: impl FnOnce(&mut LimitState, Moment) -> T) -> T {
        let now = self.moment(Instant::now());
        let mut state = self.state();
        let limit = state.limits.entry(id.clone()).or_default();
        let out = f(limit, now);
        if limit.is_idle(now) {
            state.limits.remove(&id);
        }
        out
    }
}

#[async_trait]
impl Limits for MemoryBackend {
    async fn limit_acquire(&self, request: &LimitRequest<'_>) -> Result<Acquired, BackendError> {
        Ok(self.with_limit(id(request.limit, request.key), |l, now| {
            l.acquire(request, now)
        }))
    }

    async fn limit_release(
        &self,
        limit: &str,
        key: Option<&str>,
        holder: &str,
        config: LimitConfig,
    ) -> Result<Released, BackendError> {
        Ok(self.with_limit(id(limit, key), |l, now| l.release(holder, config, now)))
    }

    async fn limit_leave(
        &self,
        limit: &str,
        key: Option<&str>,
        waiter: &str,
        config: LimitConfig,
    ) -> Result<Released, BackendError> {
        Ok(self.with_limit(id(limit, key), |l, now| l.leave(waiter, config, now)))
    }

    async fn limit_renew(
        &self,
        limit: &str,
        key: Option<&str>,
        holder: &str,
        hold_for: Duration,
    ) -> Result<bool, BackendError> {
        Ok(self.with_limit(id(limit, key), |l, now| l.renew(holder, hold_for, now)))
    }

    async fn limit_usage(
        &self,
        limit: &str,
        key: Option<&str>,
        _config: LimitConfig,
    ) -> Result<LimitUsage, BackendError> {
        Ok(self.with_limit(id(limit, key), |l, now| l.usage(now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Housekeeping, Retention};

    /// A key whose holder died and that nobody asks for again is dropped
    /// by housekeeping, once its slot ran out; one still held stays.
    #[tokio::test(start_paused = true)]
    async fn housekeeping_drops_the_keys_that_ran_out() {
        let b = MemoryBackend::new();
        let config = LimitConfig {
            concurrency: Some(1),
            rate: None,
        };
        for (key, hold) in [("dead", 1), ("alive", 60)] {
            let request = LimitRequest {
                limit: "psp",
                key: Some(key),
                config,
                holder: key,
                waiter: key,
                hold_for: Duration::from_secs(hold),
                wake: None,
            };
            b.limit_acquire(&request).await.unwrap();
        }
        assert_eq!(b.state().limits.len(), 2);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let retention = Retention {
            dead_letters: None,
            dead_letters_max: 100,
            idle_consumers: Duration::from_secs(60),
            batch: 100,
        };
        b.housekeep(&retention).await.unwrap();
        let kept: Vec<_> = b.state().limits.keys().cloned().collect();
        assert_eq!(kept, [("psp".to_owned(), Some("alive".to_owned()))]);
    }
}
