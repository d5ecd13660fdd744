//! The limit machine: what a flow-control limit decides, as a pure
//! function of its state, the request and the store's clock
//! (`backend/limits.rs` states the protocol it keeps).
//!
//! It touches no store and reads no clock, so it is tested exactly (every
//! time below is a number the test chose), and a store that keeps a
//! limit's state next to its own transaction runs it there: the memory
//! store under its lock, the SQLite store inside its write transaction
//! (the state serialized in a row).
//! Redis and PostgreSQL decide in the server instead (one script, one
//! function), because admission must be atomic with the shared state and
//! the limit is exactly where many workers contend: a read, a decision
//! here and a conditional write back would cost two round trips and a
//! retry for every writer that lost the race. Those mirrors are held to
//! this machine by the conformance suite, which replays a seeded run of
//! requests against a store and the machine side by side
//! (`limits_decide_as_the_machine_does`).
//!
//! Times are the store clock's, as a [`Duration`] since any epoch the
//! store keeps fixed (tokio's clock at the memory store's start, the Unix
//! epoch for a file).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::decision::{
    Acquired, LimitCause, LimitDecision, LimitRequest, LimitUsage, Released, BOOKING_GRACE, LATE,
};
use super::{LimitConfig, Rate};

/// A moment on the store's clock.
pub type Moment = Duration;

/// The state of one `(limit, key)`: who holds its slots, who waits in
/// line, and its rate's bucket and bookings.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LimitState {
    /// Held slots and reservations (`w:{waiter}`), by expiry.
    holders: HashMap<String, Moment>,
    /// The line: arrival number -> waiter.
    line: BTreeMap<u64, String>,
    waiters: HashMap<String, Waiter>,
    next_arrival: u64,
    /// The rate's theoretical arrival time (GCRA).
    tat: Option<Moment>,
    /// Booked tokens: waiter -> when due.
    bookings: HashMap<String, Moment>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Waiter {
    arrival: u64,
    /// It leaves the line unless it asks again by then.
    deadline: Moment,
    /// How long a slot reserved for it is held.
    hold_for: Duration,
    wake: String,
}

/// The holder name of the slot reserved for `waiter`.
fn reservation(waiter: &str) -> String {
    format!("w:{waiter}")
}

impl LimitState {
    /// Asks to start one attempt (see `Limits::limit_acquire`).
    pub fn acquire(&mut self, r: &LimitRequest<'_>, now: Moment) -> Acquired {
        self.prune(now);
        let wake = self.promote(r.config.concurrency, now);
        let decision = self.decide(r, now);
        Acquired { decision, wake }
    }

    /// Frees `holder`'s slot and reserves freed slots for the first in
    /// line (see `Limits::limit_release`).
    pub fn release(&mut self, holder: &str, config: LimitConfig, now: Moment) -> Released {
        self.prune(now);
        let released = self.holders.remove(holder).is_some();
        let wake = self.promote(config.concurrency, now);
        Released { released, wake }
    }

    /// `waiter` stops waiting: its place, its reservation and its booking
    /// go (see `Limits::limit_leave`).
    pub fn leave(&mut self, waiter: &str, config: LimitConfig, now: Moment) -> Released {
        self.prune(now);
        let in_line = self.waiters.contains_key(waiter);
        self.leave_line(waiter);
        let reserved = self.holders.remove(&reservation(waiter)).is_some();
        let booked = self.bookings.remove(waiter).is_some();
        let wake = self.promote(config.concurrency, now);
        Released {
            released: in_line || reserved || booked,
            wake,
        }
    }

    /// Extends `holder`'s slot to `hold_for` from now; false when it holds
    /// none (see `Limits::limit_renew`).
    pub fn renew(&mut self, holder: &str, hold_for: Duration, now: Moment) -> bool {
        self.prune(now);
        match self.holders.get_mut(holder) {
            Some(expiry) => {
                *expiry = now + hold_for;
                true
            }
            None => false,
        }
    }

    /// The use now, what ran out not counted.
    pub fn usage(&mut self, now: Moment) -> LimitUsage {
        self.prune(now);
        LimitUsage {
            in_use: self.holders.len() as u32,
            waiting: self.waiters.len() as u32,
            booked: self.bookings.len() as u32,
        }
    }

    /// Whether nothing is held, waits or is booked, and the bucket is
    /// full: the state may be dropped (a key used once is not kept).
    pub fn is_idle(&self, now: Moment) -> bool {
        self.holders.is_empty()
            && self.waiters.is_empty()
            && self.bookings.is_empty()
            && self.tat.is_none_or(|tat| tat <= now)
    }

    /// Drops expired slots, lapsed waiters and stale bookings.
    pub fn prune(&mut self, now: Moment) {
        self.holders.retain(|_, expiry| *expiry > now);
        let lapsed: Vec<String> = self
            .waiters
            .iter()
            .filter(|(_, w)| w.deadline < now)
            .map(|(name, _)| name.clone())
            .collect();
        for name in lapsed {
            self.leave_line(&name);
        }
        self.bookings.retain(|_, due| *due + BOOKING_GRACE > now);
    }

    fn leave_line(&mut self, waiter: &str) {
        if let Some(w) = self.waiters.remove(waiter) {
            self.line.remove(&w.arrival);
        }
    }

    /// Reserves free slots for the first waiters in line; their wakes.
    fn promote(&mut self, concurrency: Option<u32>, now: Moment) -> Vec<String> {
        let Some(n) = concurrency else {
            return Vec::new();
        };
        let mut wake = Vec::new();
        while self.holders.len() < n as usize {
            let Some((_, name)) = self.line.pop_first() else {
                break;
            };
            let Some(w) = self.waiters.remove(&name) else {
                continue;
            };
            self.holders.insert(reservation(&name), now + w.hold_for);
            wake.push(w.wake);
        }
        wake
    }

    /// How long until the first held slot (or reservation) expires, at
    /// least a millisecond.
    fn first_expiry(&self, now: Moment) -> Duration {
        self.holders
            .values()
            .min()
            .map_or(Duration::from_millis(1), |at| at.saturating_sub(now))
            .max(Duration::from_millis(1))
    }

    fn decide(&mut self, r: &LimitRequest<'_>, now: Moment) -> LimitDecision {
        if r.config.concurrency.is_some() && self.holders.contains_key(r.holder) {
            return LimitDecision::Granted;
        }
        let mut reserved = None;
        if let Some(n) = r.config.concurrency {
            reserved = self.holders.remove_entry(&reservation(r.waiter));
            if reserved.is_none() && self.holders.len() >= n as usize {
                return self.queue(r, now);
            }
        }
        if let Some(rate) = r.config.rate {
            if let Some(retry_after) = self.rate(r.waiter, rate, now) {
                // Refused a token: the reservation stays its.
                if let Some((name, expiry)) = reserved {
                    self.holders.insert(name, expiry);
                }
                return LimitDecision::Wait {
                    retry_after,
                    ahead: 0,
                    cause: LimitCause::Rate,
                };
            }
        }
        if r.config.concurrency.is_some() {
            self.leave_line(r.waiter);
            self.holders.insert(r.holder.to_owned(), now + r.hold_for);
        }
        LimitDecision::Granted
    }

    /// The rate's decision for `waiter`: `None` to start now (a token is
    /// spent), else how long until its booked token is due.
    ///
    /// The bucket (`tat`, GCRA) counts starts only, at the moment they are
    /// granted, so that however late a waiter comes back for its token,
    /// starts never exceed `burst + count * T / per` over any window `T`.
    /// Bookings only order the waiters: each refused newcomer books the
    /// next free time after the last booking; a waiter whose booking is due
    /// starts if the bucket allows, else (waiters that came back late, all
    /// at once) it keeps its booking and is told to come back spaced after
    /// the due waiters ahead of it. A newcomer does not take the token of a
    /// waiter whose booking fell due within [`LATE`].
    fn rate(&mut self, waiter: &str, rate: Rate, now: Moment) -> Option<Duration> {
        let interval = rate.interval();
        let tolerance = interval * rate.burst.saturating_sub(1);
        let free_at = self
            .tat
            .map_or(now, |tat| tat.checked_sub(tolerance).unwrap_or(now))
            .max(now);
        let owed = |due: Moment| due <= now && now.saturating_sub(due) < LATE;
        let retry = match self.bookings.get(waiter).copied() {
            Some(due) if due > now => Some(due - now),
            Some(due) if free_at > now => {
                let ahead = self
                    .bookings
                    .values()
                    .filter(|d| **d < due && owed(**d))
                    .count();
                Some(free_at - now + interval * ahead as u32)
            }
            Some(_) => None,
            None if free_at <= now && !self.bookings.values().any(|d| owed(*d)) => None,
            None => {
                let last = self.bookings.values().max().map(|d| *d + interval);
                let mut due = last.map_or(free_at, |last| last.max(free_at));
                if due <= now {
                    due = now + interval;
                }
                self.bookings.insert(waiter.to_owned(), due);
                Some(due - now)
            }
        };
        if retry.is_none() {
            self.bookings.remove(waiter);
            self.tat = Some(self.tat.map_or(now, |tat| tat.max(now)) + interval);
        }
        retry
    }

    /// Refused a slot: joins the line (or keeps its place) when it can be
    /// woken.
    fn queue(&mut self, r: &LimitRequest<'_>, now: Moment) -> LimitDecision {
        let retry_after = self.first_expiry(now);
        let Some(wake) = r.wake else {
            return LimitDecision::Wait {
                retry_after,
                ahead: self.line.len() as u64,
                cause: LimitCause::Concurrency,
            };
        };
        let deadline = now + retry_after + r.hold_for;
        let arrival = match self.waiters.get(r.waiter) {
            Some(w) => w.arrival,
            None => {
                self.next_arrival += 1;
                self.line.insert(self.next_arrival, r.waiter.to_owned());
                self.next_arrival
            }
        };
        self.waiters.insert(
            r.waiter.to_owned(),
            Waiter {
                arrival,
                deadline,
                hold_for: r.hold_for,
                wake: wake.to_owned(),
            },
        );
        LimitDecision::Wait {
            retry_after,
            ahead: self.line.range(..arrival).count() as u64,
            cause: LimitCause::Concurrency,
        }
    }
}

#[cfg(test)]
mod tests;
