//! What a flow-control request asks and what it gets: the terms of the
//! protocol (`backend/limits.rs`) that the [limit machine](super::machine)
//! and every store's [`Limits`](crate::backend::Limits) answer in.

use std::time::Duration;

use super::LimitConfig;

/// How long after it was due a rate booking is kept for its waiter: one
/// that did not come back by then (cancelled, or its task ended) frees
/// nothing but its entry, and asks anew if it ever comes.
pub const BOOKING_GRACE: Duration = Duration::from_secs(60);

/// How long after its due time a booked token is still owed to its waiter:
/// a newcomer finding such a booking books behind it rather than take the
/// token. A waiter later than that may find its token spent, and is told
/// when to come back.
pub const LATE: Duration = Duration::from_secs(1);

/// A request for one attempt's start under one limit.
#[derive(Debug, Clone, Copy)]
pub struct LimitRequest<'a> {
    /// The limit's name.
    pub limit: &'a str,
    /// The key's value, for a keyed limit.
    pub key: Option<&'a str>,
    /// What the limit allows.
    pub config: LimitConfig,
    /// Unique to this attempt: what [`Limits::limit_release`](crate::backend::Limits::limit_release) and
    /// [`Limits::limit_renew`](crate::backend::Limits::limit_renew) name.
    pub holder: &'a str,
    /// Stable across this waiter's parks (the task and its step): its
    /// place in line and its booked token.
    pub waiter: &'a str,
    /// How long a slot (or a reservation for this waiter) is held unless
    /// renewed.
    pub hold_for: Duration,
    /// Handed to whoever frees a slot for this waiter, to wake it; `None`:
    /// the requester does not queue (it comes back when told).
    pub wake: Option<&'a str>,
}

/// Why a request must wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitCause {
    /// Every slot is held (or reserved for waiters ahead).
    Concurrency,
    /// No token until the booked one is due.
    Rate,
}

/// What [`Limits::limit_acquire`](crate::backend::Limits::limit_acquire) decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitDecision {
    /// Start: the holder holds a slot (for a concurrency limit) and a
    /// token was spent (for a rate).
    Granted,
    /// Not now.
    Wait {
        /// Come back after this, at the latest (a wake may come sooner):
        /// for a rate, when the booked token is due; for concurrency, when
        /// the first held slot expires unless renewed.
        retry_after: Duration,
        /// How many waiters are ahead in line (0 for a rate booking).
        ahead: u64,
        /// Why.
        cause: LimitCause,
    },
}

/// A decision, and the waiters to wake whom this call gave a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    /// Granted, or wait.
    pub decision: LimitDecision,
    /// The `wake` strings of waiters this call gave a reservation to (a
    /// slot it found expired).
    pub wake: Vec<String>,
}

/// What [`Limits::limit_release`](crate::backend::Limits::limit_release) did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Released {
    /// Whether the holder held a slot (false: released before, expired,
    /// or never held); for [`Limits::limit_leave`](crate::backend::Limits::limit_leave), whether the waiter was
    /// waiting.
    pub released: bool,
    /// The `wake` strings of waiters given a reservation.
    pub wake: Vec<String>,
}

/// A limit's use now, for one key (or the unkeyed limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct LimitUsage {
    /// Slots held or reserved.
    pub in_use: u32,
    /// Waiters in line.
    pub waiting: u32,
    /// Rate tokens booked ahead (waiters told to come back).
    pub booked: u32,
}
