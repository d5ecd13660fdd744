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

mod attempt;
mod breaker;
mod call;
mod commit;
mod limits;
mod versions;

use breaker::BreakerPermit;
use versions::another_version;
pub(in crate::worker) use versions::park;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::lease::LeaseGuard;
use crate::backend::{
    BackendError, Delivery, Lease, Locked, QueueMessage, TakenLease, TaskRefusal,
};
use crate::saga::admission::{self, Admission, Read};
use crate::saga::state_machine::Transition;
use crate::saga::{ErasedSaga, SagaDefinition};
use crate::worker::runtime::Runtime;

/// Handles one saga message; `lease` is the one taken with the delivery,
/// with its task (the delivery keeps the lease alone). Whether the task is
/// advanced is [`admission`]'s decision; this carries it out.
pub(super) async fn handle(
    rt: &Arc<Runtime>,
    delivery: &Delivery,
    message: &QueueMessage,
    lease: Option<TakenLease>,
) {
    // A lease the backend took with the delivery is guarded from here on:
    // every way out of this function releases it.
    let taken = Taken::from_delivery(rt, lease, message).await;
    if let Some(turned_away) = admission::of_message(&rt.sagas, message) {
        if let Some(Taken::Held { guard, .. }) = taken {
            guard.release().await;
        }
        return settle(rt, delivery, message, turned_away).await;
    }
    let taken = match taken {
        Some(taken) => Ok(taken),
        None => Taken::lock(rt, message).await,
    };
    let (read, held) = match taken {
        Ok(Taken::Held {
            locked,
            leased_at,
            guard,
        }) => {
            let Locked {
                lease,
                task,
                cancel_requested,
            } = *locked;
            let read = Read::Loaded {
                task: task.map(Box::new),
                cancel_requested,
            };
            (read, Some((lease, leased_at, guard)))
        }
        Ok(Taken::Busy) => (Read::Busy, None),
        Err(BackendError::Corrupt(error)) => (Read::Unreadable(error.to_string()), None),
        Err(error) => {
            tracing::warn!(%error, "locking failed; message handed back");
            return super::release(rt, delivery, rt.settings.lock_retry_delay).await;
        }
    };
    let admitted = admission::of_task(&rt.sagas, message, read);
    // Only a loaded task comes with a lease; every other answer has none.
    let Some((lease, leased_at, guard)) = held else {
        return settle(rt, delivery, message, admitted).await;
    };
    match admitted {
        Admission::Advance {
            saga,
            task,
            cancel_requested,
        } => {
            let run = Run {
                rt,
                saga: saga.as_ref(),
                def: saga.definition(),
                lease: &lease,
                leased_at: Mutex::new(leased_at),
                delivery,
                worker: &delivery.consumer,
            };
            let result = run.advance(*task, cancel_requested).await;
            ended(rt, delivery, message, result, guard).await
        }
        turned_away => {
            guard.release().await;
            settle(rt, delivery, message, turned_away).await
        }
    }
}

/// Settles a delivery that [`admission`] turned away.
async fn settle(
    rt: &Arc<Runtime>,
    delivery: &Delivery,
    message: &QueueMessage,
    turned_away: Admission,
) {
    match turned_away {
        Admission::Advance { .. } => unreachable!("an admitted task is advanced, not settled"),
        Admission::HandBack => {
            tracing::debug!(task_id = %message.task_id, "task is locked by another worker; message handed back");
            super::release(rt, delivery, rt.settings.lock_retry_delay).await
        }
        Admission::Acknowledge => {
            tracing::debug!(task_id = %message.task_id, "stale duplicate message acknowledged");
            if let Err(error) = rt.backend.ack(delivery).await {
                tracing::debug!(%error, "acknowledging a stale message failed; it comes back and is dropped again");
            }
        }
        Admission::DeadLetter(reason) => {
            super::dead_letter(rt, delivery, reason, Some(message.task_id)).await
        }
        Admission::AnotherVersion { why, runner } => {
            another_version(rt, delivery, message, why, runner).await
        }
    }
}

/// What becomes of the delivery and the lease once a run on the task
/// stopped: the run settled both, or the message goes back (or, for a
/// write the store refused itself, is parked).
async fn ended(
    rt: &Arc<Runtime>,
    delivery: &Delivery,
    message: &QueueMessage,
    result: Result<(), Stopped>,
    mut guard: LeaseGuard,
) {
    let id = message.task_id;
    match result {
        Ok(()) => guard.disarm(),
        // The store refused the write itself (not a lost connection, not
        // a lost lease): handing the message back would loop. Park it with
        // the reason, on its own.
        Err(Stopped::Failed(error @ (BackendError::Rejected(_) | BackendError::Corrupt(_)))) => {
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

/// Why a run on a task stopped before it recorded where the task is: the
/// store failed, or refused a write the protocol expects it may refuse
/// (the lease was lost to another worker, a write raced ours). Either way
/// the message is handed back (or, for a store that refuses the write
/// itself, parked).
#[derive(Debug, thiserror::Error)]
pub(super) enum Stopped {
    /// The store failed.
    #[error(transparent)]
    Failed(#[from] BackendError),
    /// The store refused the write.
    #[error("the write was refused: {0}")]
    Refused(#[from] TaskRefusal),
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
        lease: Option<TakenLease>,
        message: &QueueMessage,
    ) -> Option<Taken> {
        match lease? {
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
    /// The transition the attempt's outcome makes; `wrote` when its start was
    /// recorded (the task made progress in the store).
    Ended { transition: Transition, wrote: bool },
    /// Going on with the task was refused: its cancellation was requested
    /// at `at`. The task is back as it was before the refused attempt.
    Cancelled { at: crate::model::task::Timestamp },
}

/// `tokio::time::sleep` that saturates instead of panicking on a timeout too
/// large to add to the clock.
async fn sleep(duration: Duration) {
    match tokio::time::Instant::now().checked_add(duration) {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
