//! A step's circuit breaker: asked before the call, told its outcome after
//! (this process's breaker, or the deployment's through the backend); the
//! state changes it reports are recorded here.

use super::Run;
use crate::backend::{BreakerChange, BreakerDecision};
use crate::circuit::{BreakerScope, CircuitBreaker, CircuitBreakerConfig, CircuitOpen, WhenOpen};
use crate::metrics;
use crate::metrics::BreakerState;
use crate::saga::state_machine::{Outcome, Phase};
use crate::saga::StepDefinition;
use crate::worker::runtime::Runtime;
use std::time::Duration;

/// Permission from a step's circuit breaker for one call.
pub(super) enum BreakerPermit<'b> {
    Local {
        permit: crate::circuit::Permit<'b>,
        /// The saga and step, for the transition metric.
        step: (&'static str, &'static str),
    },
    Shared {
        name: String,
        /// The saga and step, for the transition metric.
        step: (&'static str, &'static str),
        /// The probe's token, if this call is the half-open probe.
        probe: Option<String>,
        /// Whether failures were being counted when the call was let through.
        counting: bool,
        config: CircuitBreakerConfig,
    },
}

impl BreakerPermit<'_> {
    /// Whether this call is the breaker's half-open probe.
    pub(super) fn is_probe(&self) -> bool {
        match self {
            BreakerPermit::Local { permit, .. } => permit.is_probe(),
            BreakerPermit::Shared { probe, .. } => probe.is_some(),
        }
    }

    /// A permit whose call did not happen (its attempt was claimed
    /// elsewhere, its write failed, its task was cancelled): a shared
    /// probe's slot is freed now rather than when it expires.
    pub(super) async fn abandon(permit: Option<Self>, rt: &Runtime) {
        if let Some(permit) = permit {
            permit.report(rt, None).await;
        }
    }

    /// Records the call's outcome: `Some(failed)`, or `None` when the call
    /// proved nothing (it did not run, or was cut short by cancellation).
    pub(super) async fn report(self, rt: &Runtime, failed: Option<bool>) {
        match (self, failed) {
            (BreakerPermit::Local { permit, step }, Some(failed)) => {
                let change = match failed {
                    false => permit.success(),
                    true => permit.failure(),
                };
                if let Some(change) = change {
                    metrics::breaker_transition(step.0, step.1, change.into());
                }
            }
            (BreakerPermit::Local { permit, .. }, None) => drop(permit),
            (
                BreakerPermit::Shared {
                    name,
                    step: (saga, step),
                    probe,
                    counting,
                    config,
                },
                failed,
            ) => {
                // Nothing to record: no call, or a success with no count
                // to reset (a shared breaker's steady state).
                let nothing = match failed {
                    None => probe.is_none(),
                    Some(false) => probe.is_none() && !counting,
                    Some(true) => false,
                };
                if nothing {
                    return;
                }
                let reported = rt
                    .shared_breakers()
                    .breaker_report(
                        &name,
                        probe.as_deref(),
                        failed,
                        config.failure_threshold,
                        config.duration,
                    )
                    .await;
                match reported {
                    Ok(Some(change)) => metrics::breaker_transition(
                        saga,
                        step,
                        match change {
                            BreakerChange::Opened => BreakerState::Open,
                            BreakerChange::Closed => BreakerState::Closed,
                        },
                    ),
                    Ok(None) => {}
                    Err(error) => {
                        tracing::warn!(%error, breaker = %name, "recording a call in the shared circuit breaker failed");
                    }
                }
            }
        }
    }
}

impl Run<'_> {
    /// Asks the step's circuit breaker (this engine's, or with
    /// `scope = shared` the deployment's) for a call. Refused, it hands
    /// back the outcome to apply instead: fail at once, or with
    /// `when_open = wait` park the task until the break ends.
    pub(super) async fn breaker_permit<'b>(
        &self,
        step: &StepDefinition,
        phase: Phase,
        local: Option<&'b CircuitBreaker>,
    ) -> Result<Option<BreakerPermit<'b>>, Outcome> {
        let Some(config) = step.circuit_breaker.filter(|_| phase == Phase::Step) else {
            return Ok(None);
        };
        let refused = |retry_after: Duration| {
            // A probe out may hold its slot for as long as a call may run:
            // a parked task asks again within a break, not after that.
            let retry_after = retry_after.min(config.duration);
            let error = CircuitOpen { retry_after }.to_string();
            match config.when_open {
                WhenOpen::Fail => Outcome::CircuitOpen(error),
                WhenOpen::Wait => Outcome::CircuitWait { error, retry_after },
            }
        };
        match config.scope {
            BreakerScope::Process => match local.map(CircuitBreaker::try_acquire) {
                Some(Ok(permit)) => {
                    if permit.is_probe() {
                        metrics::breaker_transition(
                            self.def.name,
                            step.name,
                            BreakerState::HalfOpen,
                        );
                    }
                    Ok(Some(BreakerPermit::Local {
                        permit,
                        step: (self.def.name, step.name),
                    }))
                }
                Some(Err(open)) => Err(refused(open.retry_after)),
                None => Ok(None),
            },
            BreakerScope::Shared => {
                let name = format!("{}:{}", self.def.name, step.name);
                // A probe holds its slot for as long as one call may run.
                let probe_ttl = step
                    .timeout
                    .unwrap_or(self.rt.settings.step_timeout)
                    .saturating_add(self.rt.settings.stop_grace);
                let token = uuid::Uuid::new_v4().simple().to_string();
                match self
                    .rt
                    .shared_breakers()
                    .breaker_acquire(&name, probe_ttl, &token)
                    .await
                {
                    Ok(BreakerDecision::Call { probe, counting }) => {
                        if probe {
                            metrics::breaker_transition(
                                self.def.name,
                                step.name,
                                BreakerState::HalfOpen,
                            );
                        }
                        Ok(Some(BreakerPermit::Shared {
                            name,
                            step: (self.def.name, step.name),
                            probe: probe.then_some(token),
                            counting,
                            config,
                        }))
                    }
                    Ok(BreakerDecision::Open { retry_after }) => Err(refused(retry_after)),
                    // The breaker cannot be read: let the call decide (it
                    // needs the same backend to be recorded anyway).
                    Err(error) => {
                        tracing::warn!(%error, breaker = %name, "shared circuit breaker unreadable; calling");
                        Ok(None)
                    }
                }
            }
        }
    }
}
