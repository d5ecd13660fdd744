//! Circuit breakers shared by every engine on the backend.

use std::time::Duration;

use super::BackendError;
use async_trait::async_trait;

/// What a shared circuit breaker lets a caller do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerDecision {
    /// Make the call; `probe` if it is the one half-open probe.
    Call {
        /// Whether this call decides between closing and reopening.
        probe: bool,
        /// Whether failures are being counted (a success must reset
        /// them). A success that finds nothing to reset is not reported:
        /// a healthy step pays one round trip for its breaker, not two.
        counting: bool,
    },
    /// The breaker is open (or its probe is out): not before `retry_after`.
    Open {
        /// How long until the breaker lets a call through, at the earliest.
        retry_after: Duration,
    },
}

/// How a report changed a shared circuit breaker
/// ([`Breakers::breaker_report`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerChange {
    /// It opened: the threshold was reached, or the probe failed.
    Opened,
    /// It closed: the probe succeeded.
    Closed,
}

/// Circuit breakers shared by every engine on the backend
/// (`#[circuit_breaker(scope = shared)]`): closed, open until a time, then
/// half-open with one probe at a time across the deployment.
#[async_trait]
pub trait Breakers: Send + Sync + 'static {
    /// Asks to call through breaker `name`. A probe holds its slot for at
    /// most `probe_ttl` (a prober that dies must not hold it for ever), and
    /// under `token`, which its report must carry.
    async fn breaker_acquire(
        &self,
        name: &str,
        probe_ttl: Duration,
        token: &str,
    ) -> Result<BreakerDecision, BackendError>;

    /// Reports a call's outcome: a success closes (and resets the count);
    /// a failure counts, and opens the breaker for `open_for` at
    /// `threshold` consecutive failures, or at once after a failed probe.
    /// `None`: the call did not happen after all (its attempt was claimed
    /// elsewhere, the task was cancelled); a probe's slot is freed for the
    /// next caller instead of being held until it expires.
    ///
    /// `probe` is the token of the probe this call was; a probe whose slot
    /// expired and was given to another is ignored, so that a late report
    /// cannot close or reopen the breaker under the current probe.
    ///
    /// Returns the change this report made, if any (for metrics).
    async fn breaker_report(
        &self,
        name: &str,
        probe: Option<&str>,
        failed: Option<bool>,
        threshold: u32,
        open_for: Duration,
    ) -> Result<Option<BreakerChange>, BackendError>;
}
