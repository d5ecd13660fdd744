//! Messages recovered from a worker that stopped answering them run alone.
//!
//! A step that aborts its process (a crash in native code, running out of
//! memory) takes down every message in flight beside it: each comes back
//! as an unanswered delivery, its attempt cut short. Were they retried
//! together again, the culprit would take them down again, and innocent
//! messages would spend their delivery cap (and their tasks their retry
//! budgets) on a neighbour's crash loop. So a message delivered again after
//! an unanswered delivery runs alone in this engine: it waits for the
//! messages in flight to finish, and none starts beside it until it is
//! done. The culprit then crashes alone and only its own count grows; the
//! innocent ones run through.
//!
//! The common path (a first delivery) only takes a shared hold that is
//! free: no round trip, no wait. A message that arrives while a recovered
//! message runs (or waits to run) alone goes back at once as an answered
//! delivery rather than wait: its lease would run out, and the one alone
//! may be the culprit, whose crash would cost it a delivery it never ran
//! (and, for a recovered one, the forgiveness of its own first crash).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

use crate::backend::{Delivery, TakenLease};
use crate::worker::runtime::Runtime;

/// What recovered messages run alone under: every other message holds it
/// shared; `isolating` is set while a recovered one runs or waits to run.
#[derive(Default)]
pub(crate) struct Isolation {
    lock: Arc<RwLock<()>>,
    isolating: Arc<AtomicBool>,
}

/// A message's turn to run, held (for its drop) until its handling ends.
pub(super) enum Turn {
    /// Beside the others.
    Shared { _hold: OwnedRwLockReadGuard<()> },
    /// Alone: a recovered message.
    Alone {
        _hold: OwnedRwLockWriteGuard<()>,
        _slot: Slot,
    },
}

/// The one place of a recovered message running or waiting to run alone;
/// free again when dropped.
pub(super) struct Slot(Arc<AtomicBool>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// What the read loop found for a message, at once (before it reads
/// again, so that nothing is read beside a recovered message that is to
/// run alone).
pub(super) enum Ticket {
    /// Its turn: run it.
    Ready(Turn),
    /// A recovered message, to run alone once the messages in flight
    /// are done.
    Wait(Slot),
    /// A recovered message runs (or waits to run) alone: this one goes
    /// back for later.
    Back,
}

/// Decides `delivery`'s turn without waiting.
pub(super) fn ticket(rt: &Runtime, delivery: &Delivery) -> Ticket {
    let iso = &rt.isolation;
    if delivery.deliveries <= 1 {
        if iso.isolating.load(Ordering::Acquire) {
            return Ticket::Back;
        }
        return match iso.lock.clone().try_read_owned() {
            Ok(hold) => Ticket::Ready(Turn::Shared { _hold: hold }),
            Err(_) => Ticket::Back,
        };
    }
    if iso.isolating.swap(true, Ordering::AcqRel) {
        return Ticket::Back;
    }
    let slot = Slot(iso.isolating.clone());
    match iso.lock.clone().try_write_owned() {
        Ok(hold) => Ticket::Ready(Turn::Alone {
            _hold: hold,
            _slot: slot,
        }),
        Err(_) => Ticket::Wait(slot),
    }
}

/// The turn of `delivery` as `ticket` found it (and the delivery to
/// handle: a recovered one that had to wait lets go of what was taken
/// with it, which may be stale by then); `None` when it was handed back.
pub(super) async fn turn(
    rt: &Runtime,
    delivery: Arc<Delivery>,
    ticket: Ticket,
) -> Option<(Turn, Arc<Delivery>)> {
    match ticket {
        Ticket::Ready(turn) => Some((turn, delivery)),
        // Boxed: the common path's future stays small.
        Ticket::Back => {
            Box::pin(back(rt, &delivery)).await;
            None
        }
        Ticket::Wait(slot) => Box::pin(wait_alone(rt, delivery, slot)).await,
    }
}

/// Hands `delivery` back for later, as an answered delivery: waiting here,
/// its lease would run out, and the crash of the one alone (it may be the
/// culprit) would cost it a delivery it never ran.
///
/// One that does not decode is dead-lettered now instead: its handling
/// runs nothing that could crash beside the one alone, and an entry with
/// no payload has nothing a hand-back could carry.
async fn back(rt: &Runtime, delivery: &Delivery) {
    if let Err(reason) = &delivery.item {
        return super::dead_letter(rt, delivery, reason.clone(), None).await;
    }
    tracing::debug!(message = %delivery.id, "a recovered message runs alone; handed back for later");
    let_go(rt, delivery).await;
    super::release(rt, delivery, rt.settings.lock_retry_delay).await;
}

async fn wait_alone(
    rt: &Runtime,
    delivery: Arc<Delivery>,
    slot: Slot,
) -> Option<(Turn, Arc<Delivery>)> {
    // It waits for the messages in flight: a task lease taken with it
    // would run out meanwhile, and an instance loaded with it go stale.
    // The handling takes or loads them again.
    let delivery = match (&delivery.lease, &delivery.instance) {
        (None, None) => delivery,
        _ => {
            let_go(rt, &delivery).await;
            Arc::new(Delivery {
                lease: None,
                instance: None,
                ..Delivery::clone(&delivery)
            })
        }
    };
    let write = rt.isolation.lock.clone().write_owned();
    tokio::pin!(write);
    loop {
        tokio::select! {
            hold = &mut write => {
                tracing::info!(message = %delivery.id, deliveries = delivery.deliveries, "a recovered message runs alone");
                let turn = Turn::Alone { _hold: hold, _slot: slot };
                return Some((turn, delivery));
            }
            _ = rt.shutdown.cancelled() => {
                super::release(rt, &delivery, Duration::ZERO).await;
                return None;
            }
            // Not redelivered while it waits.
            _ = tokio::time::sleep(rt.heartbeat_every()) => {
                if let Err(error) = rt.backend.touch(&delivery).await {
                    tracing::debug!(%error, "keeping a waiting message invisible failed");
                }
            }
        }
    }
}

/// Releases the task lease taken with `delivery`, if any.
async fn let_go(rt: &Runtime, delivery: &Delivery) {
    if let Some(TakenLease::Held { locked, .. }) = &delivery.lease {
        if let Err(error) = rt.backend.unlock(&locked.lease).await {
            tracing::debug!(%error, "unlock failed; the lease expires on its own");
        }
    }
}

/// Until no recovered message runs or waits to run alone (at once, in the
/// common case): a worker reads no new message meanwhile, which would only
/// be handed back.
pub(super) async fn settled(rt: &Runtime) {
    let iso = &rt.isolation;
    while iso.isolating.load(Ordering::Acquire) || iso.lock.try_read().is_err() {
        // Set before the recovered message takes the lock: waiting on the
        // lock alone could slip in between.
        match iso.lock.try_read() {
            Err(_) => drop(iso.lock.read().await),
            Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}
