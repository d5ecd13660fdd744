//! Advancing one saga task as far as one delivery may.
//!
//! A message says "advance task T". The worker takes the task's lease (or
//! hands the message back for later: it never waits; the read may have
//! taken it already), loads the task, asks the state machine what the task
//! needs, and makes the attempt (a step or a compensation, with its
//! timeout, under a heartbeat). While an outcome calls for another attempt
//! at once, it goes on under the same lease and message, recording each
//! outcome with the next attempt's start in one write. What needs a new
//! message (a backoff, the end, a guarded transition) is committed with the
//! acknowledgement in one atomic write. A crash anywhere before that write
//! leaves the message unacknowledged, so it is delivered again and the task
//! resumes from what was persisted: attempt counts are written before every
//! call, and a step whose completion was recorded is never run again.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use serde_json::Value;
use tracing::Instrument;

use super::lease::{Heartbeat, LeaseGuard};
use crate::backend::{
    BackendError, Delivery, Lease, Locked, Next, NextAttempt, QueueMessage, Settle, TakenLease,
    TaskCommit,
};
use crate::backend::{BreakerChange, BreakerDecision};
use crate::circuit::{BreakerScope, CircuitBreaker, CircuitBreakerConfig, CircuitOpen, WhenOpen};
use crate::context::StepContext;
use crate::error::{StepError, StepErrorKind};
use crate::metrics::{self, BreakerState, DeadLetterKind};
use crate::model::task::{TaskInstance, TaskStatus};
use crate::saga::state_machine::{self as sm, Call, Effects, NextMove, Outcome, Phase, Plan};
use crate::saga::{ErasedSaga, SagaDefinition, StepDefinition};
use crate::worker::runtime::Runtime;

/// Permission from a step's circuit breaker for one call.
enum BreakerPermit<'b> {
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
    /// A permit whose call did not happen (its attempt was claimed
    /// elsewhere, its write failed, its task was cancelled): a shared
    /// probe's slot is freed now rather than when it expires.
    async fn abandon(permit: Option<Self>, rt: &Runtime) {
        if let Some(permit) = permit {
            permit.report(rt, None).await;
        }
    }

    /// Records the call's outcome: `Some(failed)`, or `None` when the call
    /// proved nothing (it did not run, or was cut short by cancellation).
    async fn report(self, rt: &Runtime, failed: Option<bool>) {
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

/// Handles one saga message.
pub(super) async fn handle(rt: &Arc<Runtime>, delivery: &Delivery, message: &QueueMessage) {
    // A lease the backend took with the delivery is guarded from here on:
    // every way out of this function releases it.
    let taken = Taken::from_delivery(rt, delivery, message).await;
    if !rt.sagas.contains(&message.saga) {
        if let Some(Taken::Held { guard, .. }) = taken {
            guard.release().await;
        }
        let why = format!(
            "unknown saga `{}` (this worker runs [{}])",
            message.saga,
            known_sagas(rt)
        );
        return another_version(rt, delivery, message, why).await;
    }
    let taken = match taken {
        Some(taken) => Ok(taken),
        None => Taken::lock(rt, message).await,
    };
    let (locked, leased_at, guard) = match taken {
        Ok(Taken::Held {
            locked,
            leased_at,
            guard,
        }) => (*locked, leased_at, guard),
        Ok(Taken::Busy) => {
            tracing::debug!(task_id = %message.task_id, "task is locked by another worker; message handed back");
            return super::release(rt, delivery, rt.settings.lock_retry_delay).await;
        }
        // A record this worker cannot parse: written by a newer version
        // (during a rolling deploy), or damaged. Handing it back as
        // answered would loop for ever.
        Err(BackendError::Corrupt(error)) => {
            let why = format!(
                "this worker cannot read the record of task {} ({error}); a newer version may have written it",
                message.task_id
            );
            return another_version(rt, delivery, message, why).await;
        }
        Err(error) => {
            tracing::warn!(%error, "locking failed; message handed back");
            return super::release(rt, delivery, rt.settings.lock_retry_delay).await;
        }
    };
    let lease = locked.lease;
    let Some(task) = locked.task else {
        let reason = format!("task {} does not exist", message.task_id);
        super::dead_letter(rt, delivery, reason, Some(message.task_id)).await;
        return guard.release().await;
    };
    if task.saga != message.saga {
        let reason = format!(
            "message names saga `{}` but task {} belongs to `{}`",
            message.saga, task.id, task.saga
        );
        super::dead_letter(rt, delivery, reason, Some(task.id)).await;
        return guard.release().await;
    }
    // A cancellation not applied yet makes any message of the task current:
    // the wake-up `cancel` enqueues carries the sequence number it read
    // before its request landed, and a failed attempt may have committed
    // its delayed retry in between. Under the lease, nobody else is
    // advancing the task.
    let cancel_pending = locked.cancel_requested.is_some()
        && task.cancelled_at.is_none()
        && matches!(task.status, TaskStatus::Pending | TaskStatus::Running);
    if (task.seq != message.seq && !cancel_pending) || task.status.is_terminal() {
        tracing::debug!(task_id = %task.id, "stale duplicate message acknowledged");
        if let Err(error) = rt.backend.ack(delivery).await {
            tracing::debug!(%error, "acknowledging a stale message failed; it comes back and is dropped again");
        }
        return guard.release().await;
    }
    let saga = match rt.sagas.get(&task.saga, task.saga_version) {
        Some(saga) => saga.clone(),
        None => {
            let why = format!(
                "task {} runs on version {} of saga `{}`, which this worker does not have (it runs [{}])",
                task.id,
                task.saga_version,
                task.saga,
                known_sagas(rt)
            );
            guard.release().await;
            return another_version(rt, delivery, message, why).await;
        }
    };
    if let Some(why) = incompatible(&task, saga.definition()) {
        guard.release().await;
        return another_version(rt, delivery, message, why).await;
    }
    let run = Run {
        rt,
        saga: saga.as_ref(),
        def: saga.definition(),
        lease: &lease,
        leased_at: Mutex::new(leased_at),
        delivery,
        worker: &delivery.consumer,
    };
    let id = task.id;
    let result = run.advance(task, locked.cancel_requested).await;
    match result {
        Ok(()) => {
            let mut guard = guard;
            guard.disarm();
        }
        // The store refused the write itself (not a lost connection, not
        // a lost lease): handing the message back would loop. Park it with
        // the reason, on its own.
        Err(error @ (BackendError::Rejected(_) | BackendError::Corrupt(_))) => {
            let reason = format!(
                "saga `{}` task {id}: the store refused the write: {error}",
                message.saga
            );
            super::dead_letter(rt, delivery, reason, Some(id)).await;
            guard.release().await;
        }
        Err(error) => {
            tracing::warn!(task_id = %id, %error, "could not record the outcome; the message will be redelivered");
            super::release(rt, delivery, rt.settings.lock_retry_delay).await;
            guard.release().await;
        }
    }
}

/// The task's lease: taken with the delivery, or by the worker.
enum Taken {
    Held {
        locked: Box<Locked>,
        /// When the lease runs from, at the latest.
        leased_at: tokio::time::Instant,
        guard: LeaseGuard,
    },
    Busy,
}

impl Taken {
    /// Takes the lease now (the delivery came without one).
    async fn lock(rt: &Arc<Runtime>, message: &QueueMessage) -> Result<Taken, BackendError> {
        let leased_at = tokio::time::Instant::now();
        let locked = rt
            .backend
            .lock_and_load(message.task_id, rt.lease_ttl())
            .await?;
        Ok(match locked {
            Some(locked) => Taken::Held {
                guard: LeaseGuard::new(rt, &locked.lease),
                locked: Box::new(locked),
                leased_at,
            },
            None => Taken::Busy,
        })
    }

    /// The lease the delivery came with, if it can be used.
    async fn from_delivery(
        rt: &Arc<Runtime>,
        delivery: &Delivery,
        message: &QueueMessage,
    ) -> Option<Taken> {
        match delivery.lease.clone()? {
            TakenLease::Busy => Some(Taken::Busy),
            TakenLease::Held {
                locked,
                requested_at,
                ttl,
            } => {
                let guard = LeaseGuard::new(rt, &locked.lease);
                if locked.lease.task_id != message.task_id {
                    guard.release().await;
                    return None;
                }
                // The heartbeat counts the lease as lasting the engine's
                // TTL: one taken for less runs out correspondingly sooner.
                let shortfall = rt.lease_ttl().saturating_sub(ttl);
                let leased_at = requested_at.checked_sub(shortfall).unwrap_or(requested_at);
                Some(Taken::Held {
                    locked,
                    leased_at,
                    guard,
                })
            }
        }
    }
}

fn known_sagas(rt: &Runtime) -> String {
    rt.sagas.describe()
}

/// Why a task cannot be advanced by this worker's definition of its saga
/// version: it was started on a definition with other steps (a deploy
/// changed the saga without bumping its version while the task was in
/// flight). Advancing it would run the wrong steps, or index past the ones
/// this definition has.
fn incompatible(task: &TaskInstance, def: &SagaDefinition) -> Option<String> {
    let recorded: Vec<&str> = task.steps.iter().map(|s| s.name.as_str()).collect();
    let defined: Vec<&str> = def.steps.iter().map(|s| s.name).collect();
    let fingerprint = def.fingerprint_hex();
    // Records from before fingerprints can only be compared by step names.
    let same = match &task.fingerprint {
        Some(recorded) => *recorded == fingerprint,
        None => recorded == defined,
    };
    (!same).then(|| {
        format!(
            "task {} was started with steps [{}] (version {} of saga `{}`, fingerprint {}); this \
             worker's version {} has [{}] (fingerprint {fingerprint}): the steps changed without \
             a version bump (give the new definition `#[saga(version = {})]` and keep the old \
             one registered until its tasks have finished)",
            task.id,
            recorded.join(", "),
            task.saga_version,
            def.name,
            task.fingerprint.as_deref().unwrap_or("not recorded"),
            def.version,
            defined.join(", "),
            def.version + 1
        )
    })
}

/// A message this worker cannot handle but another version may: a saga
/// it does not run (a rolling deploy that adds one), a task started with
/// other steps, a record it cannot parse. It goes back with growing delays
/// (1 s, 2 s, 4 s, ... up to 5 minutes) for a worker that can; each such
/// hand-back counts as an unanswered delivery, so a message no worker ever
/// handles is, at the delivery cap, dead-lettered and its task parked
/// `DeadLettered` (waitable, listable, and requeueable once a compatible
/// version is deployed).
async fn another_version(
    rt: &Arc<Runtime>,
    delivery: &Delivery,
    message: &QueueMessage,
    why: String,
) {
    if delivery.deliveries <= rt.settings.max_deliveries {
        let delay = super::another_version_delay(delivery.deliveries);
        tracing::warn!(task_id = %message.task_id, ?delay, "{why}; handed back for a worker that can handle it");
        if let Err(error) = rt.backend.defer(delivery, delay).await {
            tracing::debug!(%error, "handing the message back failed; it is redelivered after the visibility timeout");
        }
        return;
    }
    let reason = format!(
        "{why}; no worker able to handle it took the message in {} deliveries: requeue it once a compatible version is deployed",
        delivery.deliveries - 1,
    );
    match park(rt, delivery, message, &reason).await {
        Ok(true) => {}
        // No task to park, or one this worker cannot even read: the
        // message goes to the dead-letter queue on its own.
        Ok(false) | Err(BackendError::Corrupt(_)) => {
            super::dead_letter(rt, delivery, reason, Some(message.task_id)).await
        }
        Err(error) => {
            tracing::warn!(%error, "parking the task failed; the message comes back");
            super::release(rt, delivery, rt.settings.lock_retry_delay).await;
        }
    }
}

/// Parks the task `message` is for as `DeadLettered` with `reason`, and the
/// message with it, in one commit. `Ok(false)` when there is nothing to
/// park (no such task, ended, or the message is stale).
pub(super) async fn park(
    rt: &Arc<Runtime>,
    delivery: &Delivery,
    message: &QueueMessage,
    reason: &str,
) -> Result<bool, BackendError> {
    let Some(locked) = rt
        .backend
        .lock_and_load(message.task_id, rt.lease_ttl())
        .await?
    else {
        return Ok(false);
    };
    let guard = LeaseGuard::new(rt, &locked.lease);
    let Some(mut task) = locked
        .task
        .filter(|t| t.seq == message.seq && !t.status.is_terminal())
    else {
        guard.release().await;
        return Ok(false);
    };
    let stored = task.status;
    sm::park(&mut task, reason);
    let mut guard = guard;
    rt.backend
        .commit(TaskCommit {
            task: &task,
            stored_status: stored,
            lease: &locked.lease,
            next: None,
            settle: Settle::DeadLetter(delivery, reason),
            unless_cancelled: false,
            expire_after: rt.settings.retention_for(task.status),
        })
        .await?;
    guard.disarm();
    metrics::dead_lettered(DeadLetterKind::Saga);
    metrics::task_parked(&task.saga);
    Ok(true)
}

/// One delivery's work on one task, under its lease.
struct Run<'a> {
    rt: &'a Arc<Runtime>,
    saga: &'a dyn ErasedSaga,
    def: &'static SagaDefinition,
    lease: &'a Lease,
    /// When the lease runs from, at the latest: when it was taken, then
    /// when the last write that renewed it was sent.
    leased_at: Mutex<tokio::time::Instant>,
    delivery: &'a Delivery,
    worker: &'a str,
}

/// What [`Run::attempt`] came to.
enum Attempted {
    /// The attempt's effects on the task; `wrote` when its start was
    /// recorded (the task made progress in the store).
    Effects { effects: Effects, wrote: bool },
    /// Going on with the task was refused: its cancellation was requested
    /// at `at`. `before` is the task as it was before the refused attempt.
    Cancelled {
        at: crate::model::task::Timestamp,
        before: Box<TaskInstance>,
    },
}

impl Run<'_> {
    /// Advances the task as far as this delivery may: an attempt whose
    /// outcome calls for another one at once (the next step, the next
    /// compensation) is followed by it here, under the same lease and the
    /// same message, its start recorded together with the last outcome in
    /// one write. Only what needs a new message (a backoff, the end, a
    /// guarded transition, a shutdown) is committed.
    async fn advance(
        &self,
        mut task: TaskInstance,
        cancel: Option<crate::model::task::Timestamp>,
    ) -> Result<(), BackendError> {
        // The status stored under the task's current version.
        let mut stored = task.status;
        if self.delivery.deliveries > self.rt.settings.max_deliveries {
            let effects = sm::poisoned(&mut task, self.def, self.delivery.deliveries - 1);
            return self.commit(task, stored, effects).await;
        }
        let mut plan = sm::plan(&mut task, self.def, cancel, self.worker);
        let mut continuing = false;
        loop {
            let effects = match plan {
                Plan::Nothing if continuing => Effects::stop(),
                Plan::Nothing => {
                    self.rt.backend.ack(self.delivery).await?;
                    return Ok(());
                }
                Plan::Commit(effects) => effects,
                Plan::Call(call) => {
                    match self
                        .attempt(&mut task, &mut stored, call, continuing)
                        .await?
                    {
                        Attempted::Effects { effects, wrote }
                            if wrote && self.goes_on(&task, &effects) =>
                        {
                            continuing = true;
                            plan = sm::plan(&mut task, self.def, None, self.worker);
                            continue;
                        }
                        Attempted::Effects { effects, .. } => effects,
                        Attempted::Cancelled { at, before } => {
                            task = *before;
                            plan = sm::plan(&mut task, self.def, Some(at), self.worker);
                            continue;
                        }
                    }
                }
            };
            return self.commit(task, stored, effects).await;
        }
    }

    /// Whether the worker goes on with the task after an attempt rather
    /// than commit: the next attempt is due now, nothing needs the
    /// guarded commit or the dead-letter queue, the engine is not shutting
    /// down, and this is the message's first delivery. A redelivered
    /// message (its worker died) commits once its task made progress, so
    /// that the next step starts on a fresh message: a message's count of
    /// unanswered deliveries is its poison cap, and it must not add up the
    /// crashes of several steps that each went on to complete.
    fn goes_on(&self, task: &TaskInstance, effects: &Effects) -> bool {
        self.delivery.deliveries <= 1
            && effects.next == NextMove::Now
            && effects.dead_letter.is_none()
            && effects.guard.is_none()
            && !task.status.is_terminal()
            && !self.rt.shutdown.is_cancelled()
    }

    /// Makes one attempt: asks the breaker, records the attempt and claims
    /// it, calls under a timeout and a heartbeat, and turns the result into
    /// the task's next state.
    async fn attempt(
        &self,
        task: &mut TaskInstance,
        stored: &mut TaskStatus,
        call: Call,
        continuing: bool,
    ) -> Result<Attempted, BackendError> {
        let step = &self.def.steps[call.idx];
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
                let effects = sm::on_outcome(task, self.def, call, outcome, self.worker);
                return Ok(Attempted::Effects {
                    effects,
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
        let before = unless_cancelled.then(|| Box::new(task.clone()));
        let attempt = sm::record_attempt(task, self.def, call);
        let sent = tokio::time::Instant::now();
        // Renewed with the write when a heartbeat would have renewed it by
        // now; a chain of quick steps renews nothing.
        let leased_at = *self.leased_at.lock().unwrap_or_else(|p| p.into_inner());
        let renew = (continuing && sent - leased_at >= self.rt.heartbeat_every())
            .then(|| self.rt.lease_ttl());
        let written = self
            .persist(task.id, task.version, || async {
                match continuing {
                    false => {
                        self.rt
                            .backend
                            .record_attempt(task, *stored, self.lease, &attempt.claim)
                            .await
                    }
                    true => {
                        self.rt
                            .backend
                            .record_next_attempt(NextAttempt {
                                task,
                                stored_status: *stored,
                                lease: self.lease,
                                claim: &attempt.claim,
                                delivery: self.delivery,
                                renew,
                                unless_cancelled,
                            })
                            .await
                    }
                }
            })
            .await;
        let (version, claimed) = match written {
            Err(BackendError::CancelRequested { at, .. }) if before.is_some() => {
                BreakerPermit::abandon(permit, self.rt).await;
                let before = before.expect("checked");
                return Ok(Attempted::Cancelled { at, before });
            }
            Err(error) => {
                BreakerPermit::abandon(permit, self.rt).await;
                return Err(error);
            }
            // Our write landed but its reply was lost: whether the claim
            // was won is unknown, so count it as not won. A step then
            // skips to the next attempt number without spending its
            // budget; one attempt number never runs twice.
            Ok(written) => written.unwrap_or_else(|version| (version, false)),
        };
        if renew.is_some() {
            *self.leased_at.lock().unwrap_or_else(|p| p.into_inner()) = sent;
        }
        task.version = version;
        task.audit_saved();
        *stored = task.status;
        if !claimed {
            BreakerPermit::abandon(permit, self.rt).await;
            let outcome = Outcome::AlreadyClaimed;
            let effects = sm::on_outcome(task, self.def, call, outcome, self.worker);
            return Ok(Attempted::Effects {
                effects,
                wrote: true,
            });
        }
        let rec = &task.steps[call.idx];
        let retry = match call.phase {
            Phase::Step => attempt.number.saturating_sub(rec.retry_base) > 1,
            Phase::Compensation => attempt.number.saturating_sub(rec.compensation_retry_base) > 1,
        };
        let watch = metrics::attempt_started(self.def.name, step.name, call.phase, retry);
        let outcome = match self.call(task, call, attempt.number).await {
            Ok(outcome) => outcome,
            Err(error) => {
                BreakerPermit::abandon(permit, self.rt).await;
                return Err(error);
            }
        };
        metrics::attempt_ended(self.def.name, step.name, call.phase, &outcome, watch);
        if let Some(permit) = permit {
            let failed = match &outcome {
                Outcome::Succeeded(_) => Some(false),
                // A permanent error proves the endpoint answered.
                Outcome::Failed {
                    kind: StepErrorKind::Permanent | StepErrorKind::InvalidPayload,
                    ..
                } => Some(false),
                Outcome::Failed { .. } | Outcome::TimedOut { .. } => Some(true),
                _ => None,
            };
            permit.report(self.rt, failed).await;
        }
        let effects = sm::on_outcome(task, self.def, call, outcome, self.worker);
        Ok(Attempted::Effects {
            effects,
            wrote: true,
        })
    }

    /// Asks the step's circuit breaker (this engine's, or with
    /// `scope = shared` the deployment's) for a call. Refused, it hands
    /// back the outcome to apply instead: fail at once, or with
    /// `when_open = wait` park the task until the break ends.
    async fn breaker_permit<'b>(
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

    /// Calls the step (or compensation). The attempt gets the step's
    /// timeout; when it runs out, or the task is cancelled, the attempt's
    /// `ctx.cancelled()` fires and it has a short grace to return before it
    /// is dropped.
    async fn call(
        &self,
        task: &TaskInstance,
        call: Call,
        attempt: u32,
    ) -> Result<Outcome, BackendError> {
        let step = &self.def.steps[call.idx];
        let method = call.method(self.def);
        let running = self.rt.register_running(task.id);
        // The attempt's own token: fired by its timeout, and (for a step)
        // by the task's cancellation. Compensation undoes work; cancelling
        // it would leave things half-undone, so it never sees the task's
        // cancellation.
        let attempt_token = match call.phase {
            Phase::Step => running.token.child_token(),
            Phase::Compensation => tokio_util::sync::CancellationToken::new(),
        };
        let ctx = StepContext {
            task_id: task.id,
            saga: self.def.name,
            step: method,
            attempt,
            trace_id: task.trace_id.clone(),
            token: attempt_token.clone(),
        };
        let span = tracing::info_span!(
            "saga_step",
            task_id = %task.id,
            saga = self.def.name,
            step = method,
            attempt,
            trace_id = %task.trace_id,
            compensation = call.phase == Phase::Compensation,
        );
        crate::otel::continue_trace(&span, task.traceparent.as_deref(), Some(&task.trace_id));
        let input = call.input(task);
        let invoke = async {
            match call.phase {
                Phase::Step => self.saga.execute_step(step.order, input, &ctx).await,
                Phase::Compensation => self
                    .saga
                    .compensate_step(step.order, input, &ctx)
                    .await
                    .map(|()| Value::Null),
            }
        }
        .instrument(span);
        // A panicking step is a failed attempt, not a dead worker.
        let invoke = AssertUnwindSafe(invoke).catch_unwind().map(|r| {
            r.unwrap_or_else(|panic| {
                Err(StepError::transient(format!(
                    "step panicked: {}",
                    super::panic_message(&*panic)
                )))
            })
        });
        tokio::pin!(invoke);

        let heartbeat = Heartbeat {
            rt: self.rt,
            lease: self.lease,
            delivery: self.delivery,
            leased_at: *self.leased_at.lock().unwrap_or_else(|p| p.into_inner()),
            cancel: &running.token,
            cancelled_at: Mutex::new(None),
        };
        let beat = heartbeat.beat();
        tokio::pin!(beat);
        let timeout = step.timeout.unwrap_or(self.rt.settings.step_timeout);
        let cancellable = call.phase == Phase::Step;

        // The engine is shutting down and the attempt outlived the grace
        // period: stop it and hand it to another worker uncounted.
        let interrupt = async {
            self.rt.shutdown.cancelled().await;
            tokio::time::sleep(self.rt.settings.shutdown_grace).await;
        };

        enum Stop {
            TimedOut,
            Cancelled,
            Interrupted,
        }
        let stop = tokio::select! {
            result = &mut invoke => {
                return Ok(match result {
                    Ok(output) => Outcome::Succeeded(output),
                    Err(error) if cancellable && running.token.is_cancelled() => Outcome::Cancelled {
                        at: heartbeat.cancelled_at().await,
                        error: error.to_string(),
                    },
                    Err(error) => Outcome::Failed { error: error.to_string(), kind: error.kind() },
                });
            }
            _ = sleep(timeout) => Stop::TimedOut,
            _ = running.token.cancelled(), if cancellable => Stop::Cancelled,
            _ = interrupt => Stop::Interrupted,
            lost = &mut beat => return Err(lost),
        };
        attempt_token.cancel();
        let grace = self.rt.settings.stop_grace;
        let late = tokio::select! {
            result = &mut invoke => Some(result),
            _ = tokio::time::sleep(grace) => None,
            lost = &mut beat => return Err(lost),
        };
        if late.is_none() {
            tracing::warn!(task_id = %task.id, step = method, attempt, ?grace, "the attempt ignored its cancellation; dropped");
        }
        Ok(match (stop, late) {
            // It finished its work during the grace: keep the result rather
            // than redo a side effect that happened.
            (_, Some(Ok(output))) => Outcome::Succeeded(output),
            (Stop::TimedOut, _) => Outcome::TimedOut { after: timeout },
            (Stop::Interrupted, _) => Outcome::Interrupted,
            (Stop::Cancelled, late) => Outcome::Cancelled {
                at: heartbeat.cancelled_at().await,
                error: match late {
                    Some(Err(error)) => error.to_string(),
                    _ => format!(
                        "the attempt did not stop within {} of the cancellation and was dropped",
                        humantime::format_duration(grace)
                    ),
                },
            },
        })
    }

    /// Writes the outcome, the next message, the acknowledgement (or dead
    /// letter) and the lease's release at once. A write that would end a
    /// running task is refused while a cancellation is recorded; the
    /// cancellation is then applied instead.
    async fn commit(
        &self,
        mut task: TaskInstance,
        stored: TaskStatus,
        effects: Effects,
    ) -> Result<(), BackendError> {
        let Effects {
            next,
            dead_letter,
            guard,
        } = effects;
        let guarded = guard.is_some();
        match self
            .write(&mut task, stored, next, dead_letter.as_deref(), guarded)
            .await
        {
            Err(BackendError::CancelRequested { at, .. }) => {
                let mut task = *guard.expect("only guarded commits are refused");
                sm::begin_cancel(&mut task, self.def, at);
                let next = if task.status.is_terminal() {
                    NextMove::Stop
                } else {
                    NextMove::Now
                };
                self.write(&mut task, stored, next, None, false).await
            }
            other => other,
        }
    }

    async fn write(
        &self,
        task: &mut TaskInstance,
        stored: TaskStatus,
        next: NextMove,
        dead_letter: Option<&str>,
        unless_cancelled: bool,
    ) -> Result<(), BackendError> {
        let delay = match next {
            NextMove::Stop => None,
            NextMove::Now => Some(Duration::ZERO),
            NextMove::After(delay) => Some(delay),
        };
        let next = delay.map(|delay| {
            task.seq += 1;
            Next {
                message: QueueMessage {
                    task_id: task.id,
                    saga: task.saga.clone(),
                    seq: task.seq,
                },
                delay,
            }
        });
        let settle = match dead_letter {
            Some(reason) => Settle::DeadLetter(self.delivery, reason),
            None => Settle::Ack(self.delivery),
        };
        let commit = TaskCommit {
            task,
            stored_status: stored,
            lease: self.lease,
            next,
            settle,
            unless_cancelled,
            expire_after: self.rt.settings.retention_for(task.status),
        };
        // Written now, or by an earlier try whose reply was lost: either way
        // the commit landed.
        let _landed: Result<u64, u64> = self
            .persist(task.id, task.version, || {
                self.rt.backend.commit(commit.clone())
            })
            .await?;
        task.audit_saved();
        if dead_letter.is_some() {
            metrics::dead_lettered(DeadLetterKind::Saga);
        }
        if task.status.is_terminal() {
            metrics::task_finished(self.def.name, task.status);
            tracing::info!(task_id = %task.id, saga = self.def.name, status = %task.status, "task finished");
        }
        Ok(())
    }
}

impl Run<'_> {
    /// Runs a write of the task made under this delivery's lease, riding
    /// out a dropped connection: the write is tried again a few times, and
    /// a retry refused with a version conflict is checked against the
    /// store, because the earlier try may have landed with its reply lost.
    /// Under our lease nobody else writes the task, so a stored version one
    /// past ours is our own write: `Ok(Err(new version))`.
    ///
    /// Without this a blip between a step's call and its commit would make
    /// the redelivery see an attempt that "never reported back", and a step
    /// without retries would fail its task over a network hiccup.
    async fn persist<T, F, Fut>(
        &self,
        id: crate::model::task::TaskId,
        version: u64,
        mut write: F,
    ) -> Result<Result<T, u64>, BackendError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, BackendError>>,
    {
        const DELAYS_MS: [u64; 6] = [0, 10, 50, 100, 250, 500];
        let mut retried = false;
        for delay in DELAYS_MS {
            match write().await {
                Ok(value) => return Ok(Ok(value)),
                Err(BackendError::Conflict { actual, .. }) if retried && actual == version + 1 => {
                    tracing::debug!(task_id = %id, "an earlier try of the write landed; its reply was lost");
                    return Ok(Err(actual));
                }
                Err(error) if error.is_transient() => {
                    tracing::debug!(task_id = %id, %error, "writing the task failed; trying again");
                    retried = true;
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                Err(error) => return Err(error),
            }
        }
        write().await.map(Ok)
    }
}

/// `tokio::time::sleep` that saturates instead of panicking on a timeout too
/// large to add to the clock.
async fn sleep(duration: Duration) {
    match tokio::time::Instant::now().checked_add(duration) {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
