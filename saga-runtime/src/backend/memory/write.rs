//! The interpreter of the write vocabulary (`backend/write.rs`): every
//! guard checked, then every effect applied, under the state's one lock,
//! so a write is atomic. Each arm does what its variant's documentation
//! says and nothing else: what a write does was decided before it got here.

use std::time::Duration;

use tokio::time::Instant;

use super::{later, MemoryBackend, State};
use crate::backend::write::{Answer, Applied, Effect, Guard, Write};
use crate::backend::{TaskRefusal, WorkItem};

impl State {
    /// Why `guard` refuses `write`, if it does.
    fn refuses(&self, write: &Write<'_>, guard: Guard) -> Option<TaskRefusal> {
        let (task, lease) = (write.task, write.lease);
        match guard {
            Guard::Fence => (lease.task_id != task.id
                || self.fences.get(&task.id).copied() != Some(lease.fence))
            .then_some(TaskRefusal::LockLost { fence: lease.fence }),
            Guard::Version => match self.tasks.get(&task.id).map(|t| t.version) {
                None => Some(TaskRefusal::Missing),
                Some(actual) if actual != task.version => Some(TaskRefusal::Conflict {
                    expected: task.version,
                    actual,
                }),
                Some(_) => None,
            },
            Guard::NotCancelled => self
                .cancels
                .get(&task.id)
                .map(|(at, _)| TaskRefusal::CancelRequested { at: *at }),
        }
    }

    /// Applies `effect` of `write`, recording what the reply carries in
    /// `applied`.
    fn effect(
        &mut self,
        write: &Write<'_>,
        effect: &Effect<'_>,
        applied: &mut Applied,
        shared: (Duration, usize),
    ) {
        let (visibility_timeout, payload_limit) = shared;
        let id = write.task.id;
        match effect {
            Effect::Put { task, .. } => applied.version = self.write(task),
            Effect::Claim(claim) => {
                applied.claimed = self
                    .claims
                    .entry(id)
                    .or_default()
                    .insert((*claim).to_owned())
            }
            Effect::Renew { delivery, ttl } => {
                let now = Instant::now();
                self.locks
                    .insert(id, (write.lease.token.clone(), now + *ttl));
                if let Some(entry) = self.in_flight.get_mut(&delivery.id) {
                    entry.1 = now + visibility_timeout;
                }
            }
            Effect::Enqueue(next) => {
                self.push_item(&WorkItem::Saga(next.message.clone()), next.delay)
            }
            Effect::Settle(settle) => self.settle(*settle, Some(id), payload_limit),
            Effect::Retain(Some(after)) => {
                self.expiry.insert(id, later(*after));
            }
            Effect::Retain(None) => {
                self.expiry.remove(&id);
            }
            Effect::Unlock => {
                if self.lock_held_by(write.lease, Instant::now()) {
                    self.locks.remove(&id);
                }
            }
            // Waiters are woken by every write of a task (`task_changed`).
            Effect::Announce => {}
        }
    }
}

impl MemoryBackend {
    /// Checks `write`'s guards and applies its effects, atomically, then
    /// wakes what waits on the queue or the task.
    pub(super) fn interpret(&self, write: &Write<'_>) -> Answer {
        let shared = (self.shared.visibility_timeout, self.shared.payload_limit);
        let mut applied = Applied {
            version: write.task.version,
            claimed: false,
        };
        {
            let mut state = self.state();
            if let Some(refusal) = write.guards.iter().find_map(|g| state.refuses(write, *g)) {
                return Err(refusal);
            }
            for effect in &write.effects {
                state.effect(write, effect, &mut applied, shared);
            }
        }
        if write
            .effects
            .iter()
            .any(|e| matches!(e, Effect::Enqueue(_) | Effect::Settle(_)))
        {
            self.queue_changed();
        }
        self.task_changed();
        Ok(applied)
    }
}
