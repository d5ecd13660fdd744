//! One task write, described once for every store: the guards a store
//! checks, every one before any effect, and the effects it then applies in
//! order. This is the shape of Temporal's persistence layer (the history
//! service decides; the store checks a condition and applies mutations):
//! the engine's machines decide what a write does, [`TaskCommit`],
//! [`NextAttempt`] and an attempt's record are lowered here into the
//! closed vocabulary below, and a store interprets it. No guard and no
//! effect decides anything: a store that implements each of them as
//! documented implements the protocol, and every store implements the
//! same one (the conformance suite holds them to it, guard by guard).
//!
//! The vocabulary is closed on purpose. A store's interpreter is a
//! `match` over [`Guard`] and [`Effect`]; a new kind of write is new
//! variants here and one arm per store, never a new hand-written script
//! that restates the checks.

use std::time::Duration;

use super::{Delivery, Lease, Next, NextAttempt, Settle, TaskCommit, TaskRefusal};
use crate::model::task::{TaskInstance, TaskStatus};

/// A condition of a write, checked before any effect; a failed one is the
/// write's [`TaskRefusal`], and nothing is written.
///
/// A store checks them in the order given, so that when several fail the
/// refusal is the same on every store: the fence first (a worker that
/// lost its lease learns that, not that the record moved on under its
/// successor), then the version, then the cancellation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// The write's lease holds the task's latest fence: no lease was taken
    /// since. Refused: [`TaskRefusal::LockLost`].
    Fence,
    /// The task exists and its stored version is the one the write was
    /// based on (`task.version`). Refused: [`TaskRefusal::Missing`] or
    /// [`TaskRefusal::Conflict`].
    Version,
    /// No cancellation of the task was requested. Refused:
    /// [`TaskRefusal::CancelRequested`].
    NotCancelled,
}

/// A change a write makes once every guard held, applied in the order
/// given, all or none (a store makes the write atomic).
#[derive(Debug, Clone, Copy)]
pub enum Effect<'a> {
    /// Store the task's record under the next version, append its
    /// unstored audit entries to the stored log (keeping the last
    /// [`AUDIT_LOG_CAP`](crate::model::task::AUDIT_LOG_CAP)), and move
    /// its entry in the per-status listing from `stored_status` to its
    /// status.
    Put {
        /// The record to store.
        task: &'a TaskInstance,
        /// The status stored under `task.version`.
        stored_status: TaskStatus,
    },
    /// Claim an attempt's name (unique per task, kept as long as the
    /// task): the write's reply says whether the claim is new. A lost
    /// claim refuses nothing.
    Claim(&'a str),
    /// Extend the lease by `ttl` and keep `delivery` from being delivered
    /// again, as a heartbeat does.
    Renew {
        /// The message held.
        delivery: &'a Delivery,
        /// The lease's new time to live.
        ttl: Duration,
    },
    /// Enqueue the task's next message after its delay.
    Enqueue(&'a Next),
    /// Settle the message handled.
    Settle(Settle<'a>),
    /// Remove every trace of the task this long after the write, or (with
    /// `None`) keep it and undo an earlier expiry (a requeued task).
    Retain(Option<Duration>),
    /// Release the lease. The fence guard held, so the lock is this
    /// write's or has expired, never another holder's.
    Unlock,
    /// Tell those waiting for the task to end that it did.
    Announce,
}

impl Effect<'_> {
    /// Where the effect stands in a write (see [`Write::effects`]).
    fn rank(&self) -> u8 {
        match self {
            Effect::Put { .. } => 0,
            Effect::Claim(_) => 1,
            Effect::Renew { .. } => 2,
            Effect::Enqueue(_) => 3,
            Effect::Settle(_) => 4,
            Effect::Retain(_) => 5,
            Effect::Unlock => 6,
            Effect::Announce => 7,
        }
    }
}

/// One atomic write of a task: its lease, the guards, the effects.
#[derive(Debug, Clone)]
pub struct Write<'a> {
    /// The task written, as the write leaves it (`version` is the stored
    /// one the [`Guard::Version`] compares).
    pub task: &'a TaskInstance,
    /// The lease the write is made under.
    pub lease: &'a Lease,
    /// The guards, in the order a store checks them. Every task write is
    /// fenced, then versioned (the lowerings below always begin so); the
    /// Redis and PostgreSQL interpreters refuse one that is not, as a
    /// corrupt request, rather than apply it unguarded. A task that is
    /// gone fails the fence on memory and Redis (its fence went with it),
    /// and reads as missing on PostgreSQL.
    pub guards: Vec<Guard>,
    /// The effects, in the order a store applies them: each kind at most
    /// once, in the order [`Effect`] declares them (the lowerings below
    /// always build them so). The Redis and PostgreSQL interpreters refuse
    /// any other as a corrupt request (PostgreSQL applies the effects on
    /// the task's own row in one update, so it could not keep another
    /// order); see [`Write::in_order`].
    pub effects: Vec<Effect<'a>>,
}

/// What a write that held its guards did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// The task's new version.
    pub version: u64,
    /// Whether the write's [`Effect::Claim`] took a new claim (`false`
    /// when it carried none).
    pub claimed: bool,
}

/// A write's answer: applied, or refused by its first failed guard.
pub type Answer = Result<Applied, TaskRefusal>;

impl<'a> Write<'a> {
    /// The record of an attempt before its call (`TaskStore::record_attempt`):
    /// the record and the attempt's claim, under the lease held.
    pub fn attempt(
        task: &'a TaskInstance,
        stored_status: TaskStatus,
        lease: &'a Lease,
        claim: &'a str,
    ) -> Self {
        Write {
            task,
            lease,
            guards: vec![Guard::Fence, Guard::Version],
            effects: vec![
                Effect::Put {
                    task,
                    stored_status,
                },
                Effect::Claim(claim),
            ],
        }
    }

    /// The status stored before the write, when it puts the record.
    pub fn stored_status(&self) -> Option<TaskStatus> {
        self.effects.iter().find_map(|e| match e {
            Effect::Put { stored_status, .. } => Some(*stored_status),
            _ => None,
        })
    }

    /// Whether the write is fenced, then versioned, and carries each kind
    /// of effect at most once, in the order [`Effect`] declares them:
    /// the shape every store can apply alike.
    pub fn in_order(&self) -> bool {
        self.guards.starts_with(&[Guard::Fence, Guard::Version])
            && self.effects.windows(2).all(|w| w[0].rank() < w[1].rank())
    }

    /// Whether the write checks `guard`.
    pub fn guarded_by(&self, guard: Guard) -> bool {
        self.guards.contains(&guard)
    }
}

impl<'a> NextAttempt<'a> {
    /// The write that goes on with the task: the last outcome and the next
    /// attempt's record and claim, the lease renewed and the message kept
    /// (when asked), refused by a cancellation when asked.
    pub fn write(&self) -> Write<'a> {
        let mut write = Write::attempt(self.task, self.stored_status, self.lease, self.claim);
        if self.unless_cancelled {
            write.guards.push(Guard::NotCancelled);
        }
        if let Some(ttl) = self.renew {
            write.effects.push(Effect::Renew {
                delivery: self.delivery,
                ttl,
            });
        }
        write
    }
}

impl<'a> TaskCommit<'a> {
    /// The write that commits a step: the record, the next message, the
    /// settling of the one handled, the retention, the lease released,
    /// and the end announced when the task ends.
    pub fn write(&self) -> Write<'_> {
        let mut guards = vec![Guard::Fence, Guard::Version];
        if self.unless_cancelled {
            guards.push(Guard::NotCancelled);
        }
        let mut effects = Vec::with_capacity(6);
        effects.push(Effect::Put {
            task: self.task,
            stored_status: self.stored_status,
        });
        if let Some(next) = &self.next {
            effects.push(Effect::Enqueue(next));
        }
        effects.push(Effect::Settle(self.settle));
        effects.push(Effect::Retain(self.expire_after));
        effects.push(Effect::Unlock);
        if self.task.status.is_terminal() {
            effects.push(Effect::Announce);
        }
        Write {
            task: self.task,
            lease: self.lease,
            guards,
            effects,
        }
    }
}

#[cfg(test)]
mod tests;
