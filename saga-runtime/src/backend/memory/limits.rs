//! Flow-control limits for the engines on this store (the protocol is in
//! `backend/limits.rs`; the Redis scripts and the PostgreSQL functions
//! mirror this file).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryBackend;
use crate::backend::limits::{BOOKING_GRACE, LATE};
use crate::backend::{
    Acquired, BackendError, LimitCause, LimitDecision, LimitRequest, LimitUsage, Limits, Released,
};
use crate::limit::{LimitConfig, Rate};

/// The state of one `(limit, key)`.
#[derive(Default)]
pub(super) struct MemLimit {
    /// Held slots and reservations (`w:{waiter}`), by expiry.
    holders: HashMap<String, Instant>,
    /// The line: arrival number -> waiter.
    line: BTreeMap<u64, String>,
    waiters: HashMap<String, Waiter>,
    next_arrival: u64,
    /// The rate's theoretical arrival time (GCRA).
    tat: Option<Instant>,
    /// Booked tokens: waiter -> when due.
    bookings: HashMap<String, Instant>,
}

struct Waiter {
    arrival: u64,
    deadline: Instant,
    hold_for: Duration,
    wake: String,
}

fn reservation(waiter: &str) -> String {
    format!("w:{waiter}")
}

impl MemLimit {
    /// Drops expired slots, lapsed waiters and stale bookings.
    fn prune(&mut self, now: Instant) {
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
    fn promote(&mut self, concurrency: Option<u32>, now: Instant) -> Vec<String> {
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

    /// When the first held slot (or reservation) expires.
    fn first_expiry(&self, now: Instant) -> Duration {
        self.holders
            .values()
            .min()
            .map_or(Duration::from_millis(1), |at| {
                at.saturating_duration_since(now)
            })
            .max(Duration::from_millis(1))
    }

    fn acquire(&mut self, r: &LimitRequest<'_>, now: Instant) -> Acquired {
        self.prune(now);
        let wake = self.promote(r.config.concurrency, now);
        let decision = self.decide(r, now);
        Acquired { decision, wake }
    }

    fn decide(&mut self, r: &LimitRequest<'_>, now: Instant) -> LimitDecision {
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
            let refused = self.rate(r.waiter, rate, now);
            if let Some(retry_after) = refused {
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
    fn rate(&mut self, waiter: &str, rate: Rate, now: Instant) -> Option<Duration> {
        let interval = rate.interval();
        let tolerance = interval * rate.burst.saturating_sub(1);
        let free_at = self
            .tat
            .map_or(now, |tat| tat.checked_sub(tolerance).unwrap_or(now))
            .max(now);
        let owed = |due: Instant| due <= now && now.saturating_duration_since(due) < LATE;
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
    fn queue(&mut self, r: &LimitRequest<'_>, now: Instant) -> LimitDecision {
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

    fn is_idle(&self, now: Instant) -> bool {
        self.holders.is_empty()
            && self.waiters.is_empty()
            && self.bookings.is_empty()
            && self.tat.is_none_or(|tat| tat <= now)
    }
}

type LimitId = (String, Option<String>);

fn id(limit: &str, key: Option<&str>) -> LimitId {
    (limit.to_owned(), key.map(str::to_owned))
}

impl super::State {
    /// Drops the limits whose every slot, waiter and booking ran out.
    pub(super) fn sweep_limits(&mut self, now: Instant) {
        self.limits.retain(|_, l| {
            l.prune(now);
            !l.is_idle(now)
        });
    }
}

impl MemoryBackend {
    /// Runs `f` on the limit's state, dropping it once idle (a key used
    /// once must not be kept for ever).
    fn with_limit<T>(&self, id: LimitId, f: impl FnOnce(&mut MemLimit, Instant) -> T) -> T {
        let now = Instant::now();
        let mut state = self.state();
        let limit = state.limits.entry(id.clone()).or_default();
        let out = f(limit, now);
        if limit.is_idle(now) {
            state.limits.remove(&id);
        }
        out
    }
}

#[async_trait]
impl Limits for MemoryBackend {
    async fn limit_acquire(&self, request: &LimitRequest<'_>) -> Result<Acquired, BackendError> {
        Ok(self.with_limit(id(request.limit, request.key), |l, now| {
            l.acquire(request, now)
        }))
    }

    async fn limit_release(
        &self,
        limit: &str,
        key: Option<&str>,
        holder: &str,
        config: LimitConfig,
    ) -> Result<Released, BackendError> {
        Ok(self.with_limit(id(limit, key), |l, now| {
            l.prune(now);
            let released = l.holders.remove(holder).is_some();
            let wake = l.promote(config.concurrency, now);
            Released { released, wake }
        }))
    }

    async fn limit_leave(
        &self,
        limit: &str,
        key: Option<&str>,
        waiter: &str,
        config: LimitConfig,
    ) -> Result<Released, BackendError> {
        Ok(self.with_limit(id(limit, key), |l, now| {
            l.prune(now);
            let in_line = l.waiters.contains_key(waiter);
            l.leave_line(waiter);
            let reserved = l.holders.remove(&reservation(waiter)).is_some();
            let booked = l.bookings.remove(waiter).is_some();
            let wake = l.promote(config.concurrency, now);
            Released {
                released: in_line || reserved || booked,
                wake,
            }
        }))
    }

    async fn limit_renew(
        &self,
        limit: &str,
        key: Option<&str>,
        holder: &str,
        hold_for: Duration,
    ) -> Result<bool, BackendError> {
        Ok(self.with_limit(id(limit, key), |l, now| {
            l.prune(now);
            match l.holders.get_mut(holder) {
                Some(expiry) => {
                    *expiry = now + hold_for;
                    true
                }
                None => false,
            }
        }))
    }

    async fn limit_usage(
        &self,
        limit: &str,
        key: Option<&str>,
        _config: LimitConfig,
    ) -> Result<LimitUsage, BackendError> {
        Ok(self.with_limit(id(limit, key), |l, now| {
            l.prune(now);
            LimitUsage {
                in_use: l.holders.len() as u32,
                waiting: l.waiters.len() as u32,
                booked: l.bookings.len() as u32,
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Housekeeping, Retention};

    /// A key whose holder died and that nobody asks for again is dropped
    /// by housekeeping, once its slot ran out; one still held stays.
    #[tokio::test(start_paused = true)]
    async fn housekeeping_drops_the_keys_that_ran_out() {
        let b = MemoryBackend::new();
        let config = LimitConfig {
            concurrency: Some(1),
            rate: None,
        };
        for (key, hold) in [("dead", 1), ("alive", 60)] {
            let request = LimitRequest {
                limit: "psp",
                key: Some(key),
                config,
                holder: key,
                waiter: key,
                hold_for: Duration::from_secs(hold),
                wake: None,
            };
            b.limit_acquire(&request).await.unwrap();
        }
        assert_eq!(b.state().limits.len(), 2);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let retention = Retention {
            dead_letters: None,
            dead_letters_max: 100,
            idle_consumers: Duration::from_secs(60),
            batch: 100,
        };
        b.housekeep(&retention).await.unwrap();
        let kept: Vec<_> = b.state().limits.keys().cloned().collect();
        assert_eq!(kept, [("psp".to_owned(), Some("alive".to_owned()))]);
    }
}
