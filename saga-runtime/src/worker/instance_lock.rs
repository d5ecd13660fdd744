//! One handler per process-manager instance at a time in this process.
//!
//! Workers of one process that take messages for the same instance would
//! otherwise run them side by side and all but one would lose the
//! optimistic save and run again: a hot instance got slower with every
//! worker added. Here they queue on a lock per instance (per what the
//! message finds it by), and each hands the next the instance as it saved
//! it, so the next one does not read it again. Across processes the
//! optimistic version check (or the pessimistic lease) still decides.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

use crate::backend::LoadedInstance;

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

type Slot = Arc<tokio::sync::Mutex<Cached>>;

#[derive(Default)]
pub(crate) struct InstanceLocks {
    slots: Mutex<HashMap<String, Slot>>,
}

/// A held instance lock, with the instance its previous holder saved.
pub(crate) struct InstanceGuard<'a> {
    locks: &'a InstanceLocks,
    key: String,
    guard: Option<OwnedMutexGuard<Cached>>,
    /// Whether another handler of the instance held the lock when this one
    /// asked (the instance the backend read with the message is then
    /// stale).
    pub waited: bool,
}

impl InstanceLocks {
    /// Waits for the lock of `key`.
    pub async fn lock(&self, key: String) -> InstanceGuard<'_> {
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        let (guard, waited) = match slot.clone().try_lock_owned() {
            Ok(guard) => (guard, false),
            Err(_) => (slot.lock_owned().await, true),
        };
        InstanceGuard {
            locks: self,
            key,
            guard: Some(guard),
            waited,
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

    /// Whether another handler waits for this lock now.
    pub fn has_waiters(&self) -> bool {
        let slots = self.locks.slots.lock().unwrap_or_else(|p| p.into_inner());
        // The map's reference, the held guard's, and one per waiter.
        slots
            .get(&self.key)
            .is_some_and(|slot| Arc::strong_count(slot) > 2)
    }
}

impl Drop for InstanceGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        // Forget the slot once nobody holds or waits for it (the map's
        // own reference is the last), so the map stays as small as the
        // set of instances being handled.
        let mut slots = self.locks.slots.lock().unwrap_or_else(|p| p.into_inner());
        if slots
            .get(&self.key)
            .is_some_and(|slot| Arc::strong_count(slot) == 1)
        {
            slots.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn holders_queue_hand_over_the_instance_and_leave_no_slot_behind() {
        let locks = InstanceLocks::default();
        let mut first = locks.lock("pm\0a".into()).await;
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
                let mut g = locks.lock("pm\0a".into()).await;
                (g.waited, g.take_cached().instance.map(|l| l.key))
            }
        };
        let other = locks.lock("pm\0b".into()).await;
        assert!(!other.waited, "another instance does not wait");
        drop(other);
        let (waited, cached) = tokio::join!(second, async move { drop(first) }).0;
        assert!(waited);
        assert_eq!(cached.as_deref(), Some("a"));
        assert!(locks.slots.lock().unwrap().is_empty());
    }
}
