//! One handler per process-manager instance at a time in this process.
//!
//! Workers of one process that take messages for the same instance would
//! otherwise run them side by side and all but one would lose the
//! optimistic save and run again: a hot instance got slower with every
//! worker added. Here they queue on a lock per instance (per what the
//! message finds it by), and each hands the next the instance as it saved
//! it, so the next one does not read it again. Across processes the
//! optimistic version check (or the pessimistic lease) still decides.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, OwnedMutexGuard};

use super::batch::{Joined, Joiners};
use crate::backend::LoadedInstance;
use crate::process::Dispatched;
use crate::util::Unpoisoned;

/// What a lock holder leaves the next one: the instance as it saved it,
/// and (pessimistic mode) the instance's lease, still held, so the next
/// one need not take it again.
#[derive(Default)]
pub(crate) struct Cached {
    pub instance: Option<LoadedInstance>,
    pub lease: Option<HeldLease>,
}

/// A named lease held on behalf of this process's handlers of one
/// instance.
pub(crate) struct HeldLease {
    pub name: String,
    pub token: String,
    /// When it was last taken or renewed.
    pub since: tokio::time::Instant,
}

/// The lock of one instance, and the messages waiting for it.
#[derive(Default)]
struct Slot {
    cached: Arc<tokio::sync::Mutex<Cached>>,
    /// Waiting messages offered to the holder to handle in its write (see
    /// `process::batch`), each with the ticket its waiter knows it by.
    waiting: Mutex<VecDeque<(u64, Joined)>>,
    /// Handlers that will take the lock after the holder: those waiting,
    /// less those a holder took into its write.
    waiters: AtomicUsize,
}

#[derive(Default)]
pub(crate) struct InstanceLocks {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    tickets: AtomicU64,
    /// The instances as last saved here, of instances nobody holds or
    /// waits for now (at most [`RECENT`]): a message taken while another
    /// was being saved carries a read from before that save, and must
    /// not start from it when it finds the lock free.
    recent: Mutex<HashMap<String, LoadedInstance>>,
}

/// Instances remembered after their lock is forgotten.
const RECENT: usize = 1024;

/// How a wait for an instance lock ended.
pub(crate) enum Locked<'a> {
    /// Held: the message is this holder's to handle.
    Held(InstanceGuard<'a>),
    /// A holder handled the message in its own write, with this outcome.
    Handled(Dispatched),
}

/// A held instance lock, with the instance its previous holder saved.
pub(crate) struct InstanceGuard<'a> {
    locks: &'a InstanceLocks,
    key: String,
    slot: Option<Arc<Slot>>,
    guard: Option<OwnedMutexGuard<Cached>>,
    /// Whether another handler of the instance held the lock when this one
    /// asked (the instance the backend read with the message is then
    /// stale).
    pub waited: bool,
}

impl InstanceLocks {
    fn slot(&self, key: &str) -> Arc<Slot> {
        let mut slots = self.slots.locked();
        slots
            .entry(key.to_owned())
            .or_insert_with(|| {
                let mut recent = self.recent.locked();
                let instance = recent.remove(key);
                Arc::new(Slot {
                    cached: Arc::new(tokio::sync::Mutex::new(Cached {
                        instance,
                        lease: None,
                    })),
                    waiting: Mutex::default(),
                    waiters: AtomicUsize::new(0),
                })
            })
            .clone()
    }

    /// Drops a reference to `key`'s slot, and the slot once nobody holds
    /// or waits for it (the map's own reference is the last), so the map
    /// stays as small as the set of instances being handled.
    fn forget(&self, key: &str, slot: Arc<Slot>) {
        drop(slot);
        let mut slots = self.slots.locked();
        let Some(slot) = slots.get(key).filter(|s| Arc::strong_count(s) == 1) else {
            return;
        };
        // Never one whose lock is held: its holder would go on beside a
        // new slot's.
        let Ok(mut cached) = slot.cached.try_lock() else {
            return;
        };
        let kept = cached.instance.take();
        if let Some(lease) = cached.lease.take() {
            // Handed over to a waiter that never came: it expires on its own.
            tracing::warn!(lease = %lease.name, "an instance lease was left to no one; it is held until its TTL");
        }
        drop(cached);
        slots.remove(key);
        if let Some(instance) = kept {
            let mut recent = self.recent.locked();
            if recent.len() >= RECENT {
                if let Some(any) = recent.keys().next().cloned() {
                    recent.remove(&any);
                }
            }
            recent.insert(key.to_owned(), instance);
        }
    }

    fn guard(
        &self,
        key: String,
        slot: Arc<Slot>,
        guard: OwnedMutexGuard<Cached>,
        waited: bool,
    ) -> InstanceGuard<'_> {
        InstanceGuard {
            locks: self,
            key,
            slot: Some(slot),
            guard: Some(guard),
            waited,
        }
    }

    /// Waits for the lock of `key`; `queued` is called once this wait
    /// has its place in the lock's queue (which is fair: first come,
    /// first served), or holds the lock.
    pub async fn lock(&self, key: String, queued: &mut (dyn FnMut() + Send)) -> InstanceGuard<'_> {
        let slot = self.slot(&key);
        if let Ok(guard) = slot.cached.clone().try_lock_owned() {
            queued();
            return self.guard(key, slot, guard, false);
        }
        let mut wait = Wait::new(self, &key, slot, None);
        let lock = wait.slot().cached.clone().lock_owned();
        tokio::pin!(lock);
        let guard = match futures::poll!(lock.as_mut()) {
            std::task::Poll::Ready(guard) => guard,
            std::task::Poll::Pending => {
                queued();
                lock.await
            }
        };
        queued();
        let slot = wait.held();
        self.guard(key.clone(), slot, guard, true)
    }

    /// Waits for the lock of `key`, meanwhile offering the holder the
    /// message `offer` makes, to handle in its own write.
    pub async fn lock_or_join(
        &self,
        key: String,
        offer: impl FnOnce() -> (Joined, oneshot::Receiver<Dispatched>),
        queued: &mut (dyn FnMut() + Send),
    ) -> Locked<'_> {
        let slot = self.slot(&key);
        if let Ok(guard) = slot.cached.clone().try_lock_owned() {
            queued();
            return Locked::Held(self.guard(key, slot, guard, false));
        }
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        let (joined, mut outcome) = offer();
        slot.waiting.locked().push_back((ticket, joined));
        let mut wait = Wait::new(self, &key, slot, Some(ticket));
        // Declared after `wait`, so dropped before it (a cancelled wait
        // that was granted the lock lets go before the slot may be
        // forgotten).
        let lock = wait.slot().cached.clone().lock_owned();
        tokio::pin!(lock);
        // Its place in the lock's queue is taken on the first poll: the
        // message behind it in its lane may queue now, behind it.
        if let std::task::Poll::Ready(guard) = futures::poll!(lock.as_mut()) {
            queued();
            let slot = wait.held();
            return Locked::Held(self.guard(key.clone(), slot, guard, true));
        }
        queued();
        let mut offered = true;
        loop {
            tokio::select! {
                // A holder answers before it lets go of the lock: with both
                // ready, the answer counts.
                biased;
                answer = &mut outcome, if offered => match answer {
                    // `wait` goes (and with it, perhaps, the slot).
                    Ok(dispatched) => return Locked::Handled(dispatched),
                    // Taken, then left out of the write: handled alone,
                    // after the holder.
                    Err(_) => {
                        offered = false;
                        wait.reoffered();
                    }
                },
                guard = &mut lock => {
                    let slot = wait.held();
                    return Locked::Held(self.guard(key.clone(), slot, guard, true));
                }
            }
        }
    }
}

/// A wait for an instance's lock, counted among its waiters (what
/// `has_waiters` tells a holder about to hand its lease over) for as long
/// as it lasts, however it ends: with the lock, handled in a holder's
/// write, or dropped (a worker aborted), which must neither leave a
/// holder handing its lease to nobody nor leave the slot behind.
struct Wait<'a> {
    locks: &'a InstanceLocks,
    key: &'a str,
    /// Until the lock is held (then the guard's).
    slot: Option<Arc<Slot>>,
    /// Its offer in the slot's queue, if it made one.
    ticket: Option<u64>,
    /// Taken by a holder (who stopped counting it), then left out: it
    /// counts itself again.
    reoffered: bool,
}

impl<'a> Wait<'a> {
    fn new(locks: &'a InstanceLocks, key: &'a str, slot: Arc<Slot>, ticket: Option<u64>) -> Self {
        slot.waiters.fetch_add(1, Ordering::SeqCst);
        Wait {
            locks,
            key,
            slot: Some(slot),
            ticket,
            reoffered: false,
        }
    }

    // The slot is taken only by `held`, which ends the wait: nothing asks
    // for it after.
    #[allow(clippy::expect_used)]
    fn slot(&self) -> &Arc<Slot> {
        self.slot.as_ref().expect("the slot until the lock is held")
    }

    fn reoffered(&mut self) {
        self.slot().waiters.fetch_add(1, Ordering::SeqCst);
        self.reoffered = true;
    }

    /// The lock is held: the slot is the guard's now (and this wait,
    /// slotless, does nothing more when dropped).
    // Called once, when the lock is won, which ends the wait.
    #[allow(clippy::expect_used)]
    fn held(&mut self) -> Arc<Slot> {
        self.finish();
        self.slot.take().expect("held once")
    }

    /// Stops counting this wait and withdraws its offer (once: the slot
    /// goes with it).
    fn finish(&mut self) {
        let Some(slot) = self.slot.as_ref() else {
            return;
        };
        let queued = match self.ticket.take() {
            Some(ticket) => {
                let mut waiting = slot.waiting.locked();
                let before = waiting.len();
                waiting.retain(|(t, _)| *t != ticket);
                waiting.len() != before
            }
            None => !self.reoffered,
        };
        if queued || self.reoffered {
            slot.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        self.finish();
        if let Some(slot) = self.slot.take() {
            self.locks.forget(self.key, slot);
        }
    }
}

impl InstanceGuard<'_> {
    /// What the previous holder left (taken: once).
    pub fn take_cached(&mut self) -> Cached {
        self.guard
            .as_mut()
            .map(|g| std::mem::take(&mut **g))
            .unwrap_or_default()
    }

    /// What the next holder starts from.
    pub fn set_cached(&mut self, cached: Cached) {
        if let Some(g) = self.guard.as_mut() {
            **g = cached;
        }
    }

    /// Whether another handler will take this lock after this one.
    pub fn has_waiters(&self) -> bool {
        self.slot
            .as_ref()
            .is_some_and(|slot| slot.waiters.load(Ordering::SeqCst) > 0)
    }
}

impl Joiners for InstanceGuard<'_> {
    fn next(&self) -> Option<Joined> {
        let slot = self.slot.as_ref()?;
        let mut waiting = slot.waiting.locked();
        let (_, joined) = waiting.pop_front()?;
        // Its waiter counts itself again should it be left out.
        slot.waiters.fetch_sub(1, Ordering::SeqCst);
        Some(joined)
    }
}

impl Drop for InstanceGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        if let Some(slot) = self.slot.take() {
            self.locks.forget(&self.key, slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn holders_queue_hand_over_the_instance_and_leave_no_slot_behind() {
        let locks = InstanceLocks::default();
        let mut first = locks.lock("pm\0a".into(), &mut || {}).await;
        assert!(!first.waited);
        first.set_cached(Cached {
            instance: Some(LoadedInstance {
                key: "a".into(),
                key_field: None,
                instance: None,
            }),
            lease: None,
        });
        assert!(!first.has_waiters());
        let second = {
            let locks = &locks;
            async move {
                let mut g = locks.lock("pm\0a".into(), &mut || {}).await;
                (g.waited, g.take_cached().instance.map(|l| l.key))
            }
        };
        let other = locks.lock("pm\0b".into(), &mut || {}).await;
        assert!(!other.waited, "another instance does not wait");
        drop(other);
        let (waited, cached) = tokio::join!(second, async move { drop(first) }).0;
        assert!(waited);
        assert_eq!(cached.as_deref(), Some("a"));
        assert!(locks.slots.lock().unwrap().is_empty());
    }
}
