//! Retry and backoff policies.
//!
//! A [`RetryPolicy`] is plain data so that `#[retry_policy(..)]` can expand to a
//! `const`. The delays it produces are exact (the tests compare them to the
//! millisecond under tokio's paused clock); jitter is opt-in.
//!
//! The schedule is exposed through the `backoff` crate's [`Backoff`] trait so that
//! users can plug a policy into any helper written against that trait. The crate
//! is unmaintained (RUSTSEC-2025-0012); we use only the trait, and only here, so
//! replacing it later touches this module alone (see `deny.toml`).

use std::time::Duration;

pub use backoff::backoff::Backoff;
use serde::{Deserialize, Serialize};

/// How the delay grows between retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackoffKind {
    /// `base * 2^(n-1)`: 200, 400, 800, 1600, 3200 ms for a 200 ms base.
    Exponential,
    /// `base * n`: 200, 400, 600, ... ms for a 200 ms base.
    Linear,
    /// `base` every time.
    Constant,
}

/// What happens to a task once a step has used up its retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExhausted {
    /// Compensate the completed steps in reverse order, then end `Compensated`.
    #[default]
    Compensate,
    /// End `Failed` at once; nothing is compensated.
    Fail,
    /// Park the task's message on the dead-letter queue (status `DeadLettered`)
    /// until an operator requeues it.
    DeadLetter,
}

/// Retry policy of one step (or of its compensation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RetryPolicy {
    /// Retries after the first call: `5` means up to six calls.
    pub max_retries: u32,
    /// Shape of the delay schedule.
    pub backoff: BackoffKind,
    /// The first delay (and the unit of the schedule).
    pub base_delay: Duration,
    /// Upper bound on any single delay.
    pub max_delay: Option<Duration>,
    /// Randomise each delay uniformly within `[delay / 2, delay]` so that many
    /// tasks failing together do not retry in lock-step.
    pub jitter: bool,
    /// What to do once the retries are used up.
    pub on_exhausted: OnExhausted,
}

impl RetryPolicy {
    /// The policy of a step without `#[retry_policy]`: one call, no retry,
    /// compensate on failure. Retrying is opt-in because only the author knows
    /// whether a step is safe to call twice.
    pub const NO_RETRY: RetryPolicy = RetryPolicy::new(0, BackoffKind::Constant, 0);

    /// A policy with no delay cap, no jitter and `on_exhausted = compensate`.
    pub const fn new(max_retries: u32, backoff: BackoffKind, base_delay_ms: u64) -> Self {
        RetryPolicy {
            max_retries,
            backoff,
            base_delay: Duration::from_millis(base_delay_ms),
            max_delay: None,
            jitter: false,
            on_exhausted: OnExhausted::Compensate,
        }
    }

    /// Caps every delay at `ms` milliseconds.
    pub const fn with_max_delay_ms(mut self, ms: u64) -> Self {
        self.max_delay = Some(Duration::from_millis(ms));
        self
    }

    /// Turns jitter on or off.
    pub const fn with_jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets what happens once the retries are used up.
    pub const fn with_on_exhausted(mut self, action: OnExhausted) -> Self {
        self.on_exhausted = action;
        self
    }

    /// The delay before retry number `retry` (1-based), before jitter.
    ///
    /// Saturates instead of overflowing, so a large `max_retries` with an
    /// exponential schedule is safe (and should come with `max_delay_ms`).
    pub fn nominal_delay(&self, retry: u32) -> Duration {
        let retry = retry.max(1);
        let delay = match self.backoff {
            BackoffKind::Constant => self.base_delay,
            BackoffKind::Linear => self.base_delay.saturating_mul(retry),
            BackoffKind::Exponential => {
                let exp = (retry - 1).min(31);
                self.base_delay.saturating_mul(1u32 << exp)
            }
        };
        match self.max_delay {
            Some(cap) if delay > cap => cap,
            _ => delay,
        }
    }

    /// The delay before retry number `retry` (1-based), jitter applied.
    pub fn delay(&self, retry: u32) -> Duration {
        let nominal = self.nominal_delay(retry);
        if !self.jitter || nominal.is_zero() {
            return nominal;
        }
        use rand::Rng;
        let half = nominal / 2;
        let extra = rand::thread_rng().gen_range(0..=(nominal - half).as_micros() as u64);
        half + Duration::from_micros(extra)
    }

    /// The schedule as a [`Backoff`], starting after `retries_done` retries.
    ///
    /// Starting part-way matters after a crash: the attempt count is persisted,
    /// so a redelivered task resumes its schedule instead of starting over.
    pub fn schedule(&self, retries_done: u32) -> Schedule {
        Schedule {
            policy: *self,
            retries_done,
            start: retries_done,
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::NO_RETRY
    }
}

/// A retry schedule: yields one delay per remaining retry, then `None`.
#[derive(Debug, Clone)]
pub struct Schedule {
    policy: RetryPolicy,
    retries_done: u32,
    start: u32,
}

impl Schedule {
    /// How many retries this schedule has handed out (including those done
    /// before it was created).
    pub fn retries_done(&self) -> u32 {
        self.retries_done
    }
}

impl Backoff for Schedule {
    fn next_backoff(&mut self) -> Option<Duration> {
        if self.retries_done >= self.policy.max_retries {
            return None;
        }
        self.retries_done += 1;
        Some(self.policy.delay(self.retries_done))
    }

    fn reset(&mut self) {
        self.retries_done = self.start;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(policy: RetryPolicy) -> Vec<u128> {
        let mut s = policy.schedule(0);
        std::iter::from_fn(|| s.next_backoff().map(|d| d.as_millis())).collect()
    }

    #[test]
    fn exponential_linear_constant_schedules_are_exact() {
        assert_eq!(
            ms(RetryPolicy::new(5, BackoffKind::Exponential, 200)),
            [200, 400, 800, 1600, 3200]
        );
        assert_eq!(
            ms(RetryPolicy::new(4, BackoffKind::Linear, 200)),
            [200, 400, 600, 800]
        );
        assert_eq!(ms(RetryPolicy::new(1, BackoffKind::Constant, 0)), [0]);
        assert_eq!(ms(RetryPolicy::NO_RETRY), Vec::<u128>::new());
    }

    #[test]
    fn max_delay_caps_and_huge_exponents_saturate() {
        let p = RetryPolicy::new(6, BackoffKind::Exponential, 200).with_max_delay_ms(1000);
        assert_eq!(ms(p), [200, 400, 800, 1000, 1000, 1000]);
        let p = RetryPolicy::new(u32::MAX, BackoffKind::Exponential, u64::MAX);
        assert_eq!(p.nominal_delay(u32::MAX), Duration::MAX);
    }

    #[test]
    fn jitter_stays_within_half_and_full_delay() {
        let p = RetryPolicy::new(3, BackoffKind::Constant, 1000).with_jitter(true);
        let delays: Vec<_> = (0..200).map(|_| p.delay(1)).collect();
        assert!(delays
            .iter()
            .all(|d| *d >= Duration::from_millis(500) && *d <= Duration::from_millis(1000)));
        assert!(delays.iter().any(|d| *d != delays[0]), "jitter must vary");
    }

    #[test]
    fn schedule_resumes_after_persisted_retries_and_resets_to_its_start() {
        let mut s = RetryPolicy::new(5, BackoffKind::Exponential, 200).schedule(3);
        assert_eq!(s.next_backoff(), Some(Duration::from_millis(1600)));
        assert_eq!(s.next_backoff(), Some(Duration::from_millis(3200)));
        assert_eq!(s.next_backoff(), None);
        s.reset();
        assert_eq!(s.next_backoff(), Some(Duration::from_millis(1600)));
    }
}
