//! Flow-control limits shared by every engine on the backend
//! (`#[limit(..)]`): concurrency slots and start rates, per limit name and
//! optionally per key.
//!
//! ## The protocol every implementation keeps
//!
//! State is per `(limit, key)`; different keys (and a keyed and an
//! unkeyed use of one name) never affect each other.
//!
//! **Concurrency** (`config.concurrency = N`): a slot is held by a
//! *holder* (a token unique to one attempt) until it is released or its
//! `hold_for` runs out (renewed by [`Limits::limit_renew`] while the
//! attempt runs). At most N slots are held at once. Releasing is
//! idempotent and by token only: a second release, or the release of a
//! slot that expired and was given to another holder, frees nothing.
//!
//! A refused request with a `wake` joins the line of *waiters* (by
//! `waiter`, a name stable across its parks: the same waiter asking again
//! keeps its place). When a slot frees (a release, or an expiry noticed by
//! any call), the first waiters in line get a *reservation*: the slot is
//! held for them for their `hold_for`, and their `wake` strings are
//! handed back to the caller who freed it, which wakes them. A waiter that
//! asks while it has a reservation is granted that slot; nobody else can
//! take a reserved slot, and a newcomer cannot pass the line. A waiter that
//! does not come back by its deadline leaves the line; a reservation not
//! taken expires like a slot. A request without `wake` does not queue: it
//! is refused while the limit is full or others wait, and comes back when
//! told.
//!
//! **Rate** (`config.rate`): a token bucket of `burst` tokens refilled at
//! `count / per` (GCRA over the moments starts are *granted*, `tat`), so
//! starts never exceed `burst + count * T / per` over any window `T`,
//! however late waiters come back. A request that finds no token, or finds
//! a booking that fell due within [`LATE`] ahead of it (a waiter owed its
//! token), *books* a start time for its waiter, the next free time after
//! the last booking, and is told when it is due. Asking again before then
//! keeps the booking (and is told the rest of the wait). Asking at or after
//! it starts if the bucket allows; if not (waiters that came back late all
//! at once), it keeps the booking and is told to come back after the
//! bucket's next token plus one interval per due booking ahead of it. A
//! booking not claimed within [`BOOKING_GRACE`] of its due time is dropped.
//!
//! With both, concurrency is decided first: a request refused a slot
//! spends no token.
//!
//! Time is the store's clock (Redis `TIME`, PostgreSQL `clock_timestamp()`,
//! tokio's clock in memory), so engines with skewed clocks agree.

use std::time::Duration;

use async_trait::async_trait;

use super::BackendError;
pub use crate::limit::decision::{
    Acquired, LimitCause, LimitDecision, LimitRequest, LimitUsage, Released, BOOKING_GRACE, LATE,
};
use crate::limit::LimitConfig;

// The Redis scripts' own tests use it too.
#[cfg(any(all(test, feature = "redis"), feature = "conformance"))]
#[doc(hidden)]
pub mod twins;

/// Concurrency slots and start rates shared by every engine on the backend.
/// See the module documentation for the protocol.
#[async_trait]
pub trait Limits: Send + Sync + 'static {
    /// Asks to start one attempt under one limit.
    async fn limit_acquire(&self, request: &LimitRequest<'_>) -> Result<Acquired, BackendError>;

    /// Frees `holder`'s slot, and reserves freed slots for the first
    /// waiters in line (whose wakes it returns).
    async fn limit_release(
        &self,
        limit: &str,
        key: Option<&str>,
        holder: &str,
        config: LimitConfig,
    ) -> Result<Released, BackendError>;

    /// `waiter` stops waiting (its task was cancelled, or ended, while
    /// parked): it leaves the line, a slot reserved for it is freed (and
    /// reserved for the next in line, whose wakes it returns), and its
    /// booked token is dropped. `released`: it was waiting.
    async fn limit_leave(
        &self,
        limit: &str,
        key: Option<&str>,
        waiter: &str,
        config: LimitConfig,
    ) -> Result<Released, BackendError>;

    /// Extends `holder`'s slot to `hold_for` from now; false when it holds
    /// none (released, or expired: the attempt runs beyond the limit).
    async fn limit_renew(
        &self,
        limit: &str,
        key: Option<&str>,
        holder: &str,
        hold_for: Duration,
    ) -> Result<bool, BackendError>;

    /// The limit's use now (expired slots and lapsed waiters not counted).
    async fn limit_usage(
        &self,
        limit: &str,
        key: Option<&str>,
        config: LimitConfig,
    ) -> Result<LimitUsage, BackendError>;
}
