//! Going on with a task attempt after attempt under one lease and message.

use super::commit::Landed;
use super::{Attempted, BreakerPermit, Run, Stopped};
use crate::backend::{NextAttempt, TaskRefusal};
use crate::error::StepErrorKind;
use crate::metrics;
use crate::model::task::{TaskInstance, TaskStatus};
use crate::saga::state_machine as sm;
use crate::saga::state_machine::{Call, NextMove, Outcome, Phase, Plan, Transition};
use crate::util::Unpoisoned;

impl Run<'_> {
    /// Advances the task as far as this delivery may: an attempt whose
    /// outcome calls for another one at once (the next step, the next
    /// compensation) is followed by it here, under the same lease and the
    /// same message, its start recorded together with the last outcome in
    /// one write. Only what needs a new message (a backoff, the end, a
    /// guarded transition, a shutdown) is committed.
    pub(super) async fn advance(
        &self,
        mut task: TaskInstance,
        cancel: Option<crate::model::task::Timestamp>,
    ) -> Result<(), Stopped> {
        // The status stored under the task's current version.
        let mut stored = task.status;
        if self.delivery.deliveries > self.rt.settings.max_deliveries {
            let transition = sm::poisoned(&mut task, self.def, self.delivery.deliveries - 1);
            return self.commit(task, stored, transition).await;
        }
        sm::forgive_crash(&mut task, self.worker);
        let mut plan = sm::plan(&mut task, self.def, cancel, self.worker);
        let mut continuing = false;
        loop {
            let transition = match plan {
                Plan::Nothing if continuing => Transition::stop(),
                Plan::Nothing => {
                    self.rt.backend.ack(self.delivery).await?;
                    return Ok(());
                }
                Plan::Commit(transition) => transition,
                Plan::Call(call) => {
                    match self
                        .attempt(&mut task, &mut stored, call, continuing)
                        .await?
                    {
                        Attempted::Ended { transition, wrote }
                            if wrote && self.goes_on(&task, &transition) =>
                        {
                            continuing = true;
                            plan = sm::plan(&mut task, self.def, None, self.worker);
                            continue;
                        }
                        Attempted::Ended { transition, .. } => transition,
                        Attempted::Cancelled { at } => {
                            plan = sm::plan(&mut task, self.def, Some(at), self.worker);
                            continue;
                        }
                    }
                }
            };
            return self.commit(task, stored, transition).await;
        }
    }

    /// Whether this delivery runs alone: a message recovered from a worker
    /// that stopped answering it (see `worker::isolation`).
    pub(super) fn alone(&self) -> bool {
        self.delivery.deliveries > 1
    }

    /// Whether the worker goes on with the task after an attempt rather
    /// than commit: the next attempt is due now, nothing needs the
    /// guarded commit or the dead-letter queue, the engine is not shutting
    /// down, and this is the message's first delivery. A redelivered
    /// message (its worker died) commits once its task made progress, so
    /// that the next step starts on a fresh message: a message's count of
    /// unanswered deliveries is its poison cap, and it must not add up the
    /// crashes of several steps that each went on to complete.
    pub(super) fn goes_on(&self, task: &TaskInstance, transition: &Transition) -> bool {
        self.delivery.deliveries <= 1
            && transition.next == NextMove::Now
            && transition.dead_letter.is_none()
            && transition.guard.is_none()
            && !task.status.is_terminal()
            && !self.rt.shutdown.is_cancelled()
    }

    /// Makes one attempt: asks the breaker, records the attempt and claims
    /// it, calls under a timeout and a heartbeat, and turns the result into
    /// the task's next state.
    pub(super) async fn attempt(
        &self,
        task: &mut TaskInstance,
        stored: &mut TaskStatus,
        call: Call,
        continuing: bool,
    ) -> Result<Attempted, Stopped> {
        let step = &self.def.steps[call.idx];
        // Limits first: a task that must wait is parked before its breaker
        // is asked (a probe must not be spent on a call that waits).
        let held = match call.phase {
            Phase::Step if !step.limits.is_empty() => match self.limit_permit(task, call).await? {
                Ok(held) => Some(held),
                Err(outcome) => {
                    let transition = self.parked(task, call, outcome);
                    return Ok(Attempted::Ended {
                        transition,
                        wrote: false,
                    });
                }
            },
            _ => None,
        };
        let local = match call.phase {
            Phase::Step => self.rt.breaker(self.def.name, step),
            Phase::Compensation => None,
        };
        let permit = match self
            .breaker_permit(step, call.phase, local.as_deref())
            .await
        {
            Ok(permit) => permit,
            Err(outcome) => {
                let transition = sm::on_outcome(task, self.def, call, outcome, self.worker);
                return Ok(Attempted::Ended {
                    transition,
                    wrote: false,
                });
            }
        };
        // Going on with a running task is refused once its cancellation
        // is requested (a task already being cancelled or compensated
        // goes on regardless).
        let unless_cancelled = continuing
            && task.cancelled_at.is_none()
            && matches!(task.status, TaskStatus::Pending | TaskStatus::Running);
        let (attempt, before) =
            sm::start_attempt(task, self.def, call, self.alone(), unless_cancelled);
        let sent = tokio::time::Instant::now();
        // Renewed with the write when a heartbeat would have renewed it by
        // now; a chain of quick steps renews nothing.
        let leased_at = *self.leased_at.locked();
        let renew = (continuing && sent - leased_at >= self.rt.heartbeat_every())
            .then(|| self.rt.lease_ttl());
        let written = self
            .write_attempt(
                task,
                *stored,
                &attempt.claim,
                continuing.then_some((renew, unless_cancelled)),
            )
            .await;
        let landed = match written {
            Ok(Ok(landed)) => landed,
            Ok(Err(refused)) => {
                BreakerPermit::abandon(permit, self.rt).await;
                return match (refused, before) {
                    (TaskRefusal::CancelRequested { at }, Some(before)) => {
                        before.apply(task);
                        Ok(Attempted::Cancelled { at })
                    }
                    (refused, _) => Err(refused.into()),
                };
            }
            Err(error) => {
                BreakerPermit::abandon(permit, self.rt).await;
                return Err(error.into());
            }
        };
        let (version, claimed) = match landed {
            Landed::Replied(recorded) => recorded,
            // Our write landed but its reply was lost: whether the claim
            // was won is unknown, so count it as not won. A step then
            // skips to the next attempt number without spending its
            // budget; one attempt number never runs twice.
            Landed::ReplyLost(version) => (version, false),
        };
        if renew.is_some() {
            *self.leased_at.locked() = sent;
        }
        task.version = version;
        task.audit_saved();
        task.steps_saved(version);
        *stored = task.status;
        if !claimed {
            BreakerPermit::abandon(permit, self.rt).await;
            let outcome = Outcome::AlreadyClaimed;
            let transition = sm::on_outcome(task, self.def, call, outcome, self.worker);
            return Ok(Attempted::Ended {
                transition,
                wrote: true,
            });
        }
        let rec = &task.steps[call.idx];
        let retry = match call.phase {
            Phase::Step => attempt.number.saturating_sub(rec.retry_base) > 1,
            Phase::Compensation => attempt.number.saturating_sub(rec.compensation_retry_base) > 1,
        };
        let watch = metrics::attempt_started(self.def.name, step.name, call.phase, retry);
        let outcome = self.call(task, call, attempt.number, held.as_ref()).await;
        self.free_limits(held, call).await;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(lost) => {
                BreakerPermit::abandon(permit, self.rt).await;
                return Err(lost.into());
            }
        };
        metrics::attempt_ended(self.def.name, step.name, call.phase, &outcome, watch);
        // A failed half-open probe may cost its task less than a failed call
        // (`when_open = wait`): the state machine decides.
        let probe = permit.as_ref().is_some_and(BreakerPermit::is_probe);
        if let Some(permit) = permit {
            permit.report(self.rt, breaker_verdict(&outcome)).await;
        }
        let transition = match probe {
            true => sm::on_probe_outcome(task, self.def, call, outcome, self.worker),
            false => sm::on_outcome(task, self.def, call, outcome, self.worker),
        };
        Ok(Attempted::Ended {
            transition,
            wrote: true,
        })
    }
}

impl Run<'_> {
    /// Records the attempt's start and claims it: alone (the first attempt
    /// of this delivery), or with the previous attempt's outcome when
    /// `going_on` (`(renew, unless_cancelled)`), riding out a dropped
    /// connection.
    async fn write_attempt(
        &self,
        task: &TaskInstance,
        stored: TaskStatus,
        claim: &str,
        going_on: Option<(Option<std::time::Duration>, bool)>,
    ) -> Result<crate::backend::TaskWrite<Landed<(u64, bool)>>, crate::backend::BackendError> {
        self.persist(task.id, task.version, || async {
            match going_on {
                None => {
                    self.rt
                        .backend
                        .record_attempt(task, stored, self.lease, claim)
                        .await
                }
                Some((renew, unless_cancelled)) => {
                    self.rt
                        .backend
                        .record_next_attempt(NextAttempt {
                            task,
                            stored_status: stored,
                            lease: self.lease,
                            claim,
                            delivery: self.delivery,
                            renew,
                            unless_cancelled,
                        })
                        .await
                }
            }
        })
        .await
    }
}

/// What a call's outcome tells its circuit breaker: `Some(failed)`, or
/// `None` when it proves nothing (it did not run, or was cut short).
fn breaker_verdict(outcome: &Outcome) -> Option<bool> {
    match outcome {
        Outcome::Succeeded(_) => Some(false),
        // A permanent error proves the endpoint answered.
        Outcome::Failed {
            kind: StepErrorKind::Permanent | StepErrorKind::InvalidPayload,
            ..
        } => Some(false),
        Outcome::Failed { .. } | Outcome::TimedOut { .. } => Some(true),
        _ => None,
    }
}
