//! Circuit breaker for steps that call something that may be down entirely.
//!
//! One breaker exists per saga step per [`Engine`](crate::engine::Engine) (in
//! practice: per process), shared by every task running that step. The breaker
//! wraps the retry policy: it is asked before every call, and while it is open
//! the step fails at once, without calling the step and without consuming a
//! retry, and the step's `on_exhausted` action applies.
//!
//! Only transient failures count: a permanent error means the endpoint answered
//! (and refused the request), not that it is down.
//!
//! With `scope = shared` the breaker's state lives in the backend instead,
//! so every worker of the deployment opens and closes it together and one
//! half-open probe is let through across all of them. With
//! `when_open = wait`, a task that meets the open breaker is not failed: it
//! is parked durably (a scheduled message; no worker, no lease, no retry
//! spent) until the break ends, spread over part of the break so the tasks
//! come back gradually; and a failed half-open probe costs the task that
//! made it no retry either (it is recorded, and the task parked again), so
//! an outage of any length compensates nothing. Calls through a closed
//! breaker count as usual.

use std::sync::Mutex;
use std::time::Duration;

use crate::util::Unpoisoned;
use tokio::time::Instant;

/// `#[circuit_breaker(failure_threshold, duration_secs, scope, when_open)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CircuitBreakerConfig {
    /// Consecutive failed calls that open the circuit.
    pub failure_threshold: u32,
    /// How long the circuit stays open before letting one probe through.
    pub duration: Duration,
    /// Whose breaker it is: this process's, or the deployment's.
    pub scope: BreakerScope,
    /// What a task that meets the open breaker does.
    pub when_open: WhenOpen,
}

/// `scope = process | shared`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BreakerScope {
    /// One breaker per engine (per process): the default.
    #[default]
    Process,
    /// One breaker for every engine on the backend, kept there.
    Shared,
}

/// `when_open = fail | wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WhenOpen {
    /// The step fails at once and its `on_exhausted` action applies: the
    /// default.
    #[default]
    Fail,
    /// The task is parked until the break ends, then tries again; no retry
    /// is spent, not even by a failed half-open probe.
    Wait,
}

impl CircuitBreakerConfig {
    /// A config; both values must be positive (the macro checks this).
    pub const fn new(failure_threshold: u32, duration_secs: u64) -> Self {
        CircuitBreakerConfig {
            failure_threshold,
            duration: Duration::from_secs(duration_secs),
            scope: BreakerScope::Process,
            when_open: WhenOpen::Fail,
        }
    }

    /// With `scope`.
    pub const fn with_scope(mut self, scope: BreakerScope) -> Self {
        self.scope = scope;
        self
    }

    /// With `when_open`.
    pub const fn with_when_open(mut self, when_open: WhenOpen) -> Self {
        self.when_open = when_open;
        self
    }
}

/// The observable state of a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Calls go through; `failures` consecutive failures so far.
    Closed {
        /// Consecutive failures.
        failures: u32,
    },
    /// Calls are rejected until the break ends.
    Open,
    /// The break ended; one probe call decides whether to close or reopen.
    HalfOpen,
}

#[derive(Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probing: bool },
}

/// A change of a breaker's state, returned to whoever made it so that the
/// worker can record it (the breaker itself records nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// It opened: the threshold was reached, or the probe failed.
    Opened,
    /// Its break ended and a probe was let through (again, after a probe
    /// that did not happen).
    HalfOpened,
    /// It closed: the probe succeeded.
    Closed,
}

impl State {
    /// The state a transition into it is named by.
    fn kind(&self) -> Transition {
        match self {
            State::Closed { .. } => Transition::Closed,
            State::Open { .. } => Transition::Opened,
            State::HalfOpen { .. } => Transition::HalfOpened,
        }
    }
}

/// A circuit breaker (closed, open, half-open with a single probe).
#[derive(Debug)]
pub struct CircuitBreaker {
    config: CircuitBreakerConfig,
    state: Mutex<State>,
}

/// Returned when the circuit rejects a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("circuit breaker is open; calls are rejected for the next {:.1} s", retry_after.as_secs_f64())]
pub struct CircuitOpen {
    /// Time until the breaker lets a probe through.
    pub retry_after: Duration,
}

/// Permission for one call. Report its outcome with [`Permit::success`] or
/// [`Permit::failure`]; dropping it unreported (the call was cancelled) frees
/// the probe slot without changing the state.
#[derive(Debug)]
#[must_use = "report the call's outcome with success() or failure()"]
pub struct Permit<'a> {
    breaker: &'a CircuitBreaker,
    probe: bool,
    reported: bool,
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(config: CircuitBreakerConfig) -> Self {
        CircuitBreaker {
            config,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    /// Its config.
    pub fn config(&self) -> CircuitBreakerConfig {
        self.config
    }

    /// The current state (an open breaker whose break has ended reads as
    /// half-open).
    pub fn state(&self) -> CircuitState {
        match *self.lock() {
            State::Closed { failures } => CircuitState::Closed { failures },
            State::Open { until } if Instant::now() >= until => CircuitState::HalfOpen,
            State::Open { .. } => CircuitState::Open,
            State::HalfOpen { .. } => CircuitState::HalfOpen,
        }
    }

    /// Asks to make one call. A permit that [`is_probe`](Permit::is_probe)
    /// moved the breaker to half-open ([`Transition::HalfOpened`]).
    pub fn try_acquire(&self) -> Result<Permit<'_>, CircuitOpen> {
        let mut state = self.lock();
        let now = Instant::now();
        let probe = match *state {
            State::Closed { .. } => false,
            State::Open { until } if now >= until => {
                *state = State::HalfOpen { probing: true };
                true
            }
            State::Open { until } => {
                return Err(CircuitOpen {
                    retry_after: until - now,
                })
            }
            // The previous probe did not happen after all: another one.
            State::HalfOpen { probing: false } => {
                *state = State::HalfOpen { probing: true };
                true
            }
            // The probe's outcome is not known yet; it may take as long as
            // a call does. Ask again after a share of the break rather than
            // at once (a parked task would otherwise spin).
            State::HalfOpen { probing: true } => {
                return Err(CircuitOpen {
                    retry_after: self.config.duration / 4,
                })
            }
        };
        Ok(Permit {
            breaker: self,
            probe,
            reported: false,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a plain enum: a panic while holding the lock cannot
        // leave it half-written, so a poisoned lock is still usable.
        self.state.locked()
    }

    fn record(&self, success: bool) -> Option<Transition> {
        let mut state = self.lock();
        let before = state.kind();
        *state = match (&*state, success) {
            (_, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) if failures + 1 < self.config.failure_threshold => {
                State::Closed {
                    failures: failures + 1,
                }
            }
            // The threshold was reached, a failed probe, or a call admitted
            // before the circuit opened that failed afterwards: (re)open.
            (_, false) => State::Open {
                until: Instant::now() + self.config.duration,
            },
        };
        let after = state.kind();
        (after != before).then_some(after)
    }
}

impl Permit<'_> {
    /// The call succeeded: close the circuit. Returns the change it made.
    pub fn success(mut self) -> Option<Transition> {
        self.reported = true;
        self.breaker.record(true)
    }

    /// The call failed transiently: count it (and open the circuit at the
    /// threshold, or reopen it after a failed probe). Returns the change it
    /// made.
    pub fn failure(mut self) -> Option<Transition> {
        self.reported = true;
        self.breaker.record(false)
    }

    /// Whether this call is the half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.probe && !self.reported {
            let mut state = self.breaker.lock();
            if let State::HalfOpen { probing: true } = *state {
                *state = State::HalfOpen { probing: false };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_at_threshold_probes_once_then_closes_or_reopens() {
        let b = CircuitBreaker::new(CircuitBreakerConfig::new(3, 30));
        for n in 1..3 {
            b.try_acquire().unwrap().failure();
            assert_eq!(b.state(), CircuitState::Closed { failures: n });
        }
        b.try_acquire().unwrap().failure();
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(
            b.try_acquire().unwrap_err().retry_after,
            Duration::from_secs(30)
        );

        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(
            b.try_acquire().is_err(),
            "still open one second before the end"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        let probe = b.try_acquire().unwrap();
        assert!(probe.is_probe());
        assert!(b.try_acquire().is_err(), "only one probe at a time");
        probe.failure();
        assert_eq!(b.state(), CircuitState::Open, "a failed probe reopens");

        tokio::time::advance(Duration::from_secs(30)).await;
        b.try_acquire().unwrap().success();
        assert_eq!(b.state(), CircuitState::Closed { failures: 0 });
    }

    #[tokio::test(start_paused = true)]
    async fn every_state_change_is_returned_once_to_whoever_made_it() {
        let b = CircuitBreaker::new(CircuitBreakerConfig::new(1, 1));
        assert_eq!(b.try_acquire().unwrap().failure(), Some(Transition::Opened));
        tokio::time::advance(Duration::from_secs(1)).await;
        let probe = b.try_acquire().unwrap();
        assert!(probe.is_probe(), "the break's end lets a probe through");
        assert_eq!(probe.failure(), Some(Transition::Opened), "a failed probe");
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(b.try_acquire().unwrap()); // a probe that did not happen
        let probe = b.try_acquire().unwrap();
        assert!(probe.is_probe(), "another probe, half-open again");
        assert_eq!(probe.success(), Some(Transition::Closed));
        assert_eq!(b.try_acquire().unwrap().success(), None, "closed already");
        assert!(!b.try_acquire().unwrap().is_probe());
    }

    #[tokio::test(start_paused = true)]
    async fn success_resets_the_count_and_an_abandoned_probe_frees_its_slot() {
        let b = CircuitBreaker::new(CircuitBreakerConfig::new(2, 1));
        b.try_acquire().unwrap().failure();
        b.try_acquire().unwrap().success();
        b.try_acquire().unwrap().failure();
        assert_eq!(b.state(), CircuitState::Closed { failures: 1 });
        b.try_acquire().unwrap().failure();
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(b.try_acquire().unwrap());
        assert!(b.try_acquire().unwrap().is_probe());
    }
}
