//! Flow-control limits: a row per `(limit, key)` that every call locks
//! first, with its slots, line and booked tokens in tables of their own
//! (`limit_acquire`, `limit_release`, `limit_leave`, `limit_renew`,
//! `limit_usage` in `migrations/0004_limits.sql`). Each method is one function call, on the
//! server's clock, deciding exactly as the limit machine does
//! (`limit/machine.rs`; the conformance case
//! `limits_decide_as_the_machine_does` holds the two together).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;

use super::{corrupt, failure, PostgresBackend};
use crate::backend::limits::{BOOKING_GRACE, LATE};
use crate::backend::{
    Acquired, BackendError, LimitCause, LimitDecision, LimitRequest, LimitUsage, Limits, Released,
};
use crate::limit::LimitConfig;

/// `d` in microseconds (the resolution of a PostgreSQL time), rounded up:
/// a rate's interval rounded down would let starts run ahead of it.
pub(super) fn us(d: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(i64::MAX)
}

/// A wait in microseconds as the functions answer it.
fn wait_of(micros: Option<i64>) -> Result<Duration, BackendError> {
    let micros = micros.ok_or_else(|| corrupt("a limit's wait without a time"))?;
    Ok(Duration::from_micros(u64::try_from(micros).unwrap_or(0)))
}

/// A count as the functions answer it.
fn count(row: &sqlx::postgres::PgRow, i: usize) -> Result<u32, BackendError> {
    let n: i64 = row.try_get(i).map_err(corrupt)?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// The slots of a limit as the functions take them (NULL: no slots).
fn concurrency(config: LimitConfig) -> Option<i32> {
    config
        .concurrency
        .map(|n| i32::try_from(n).unwrap_or(i32::MAX))
}

/// What `limit_release` and `limit_leave` answer.
fn released_of(row: &sqlx::postgres::PgRow) -> Result<Released, BackendError> {
    Ok(Released {
        released: row.try_get(0).map_err(corrupt)?,
        wake: row.try_get(1).map_err(corrupt)?,
    })
}

#[async_trait]
impl Limits for PostgresBackend {
    async fn limit_acquire(&self, r: &LimitRequest<'_>) -> Result<Acquired, BackendError> {
        // The rate's interval and its burst's tolerance, as GCRA counts
        // them (`limit/machine.rs`).
        let interval = r.config.rate.map(|rate| us(rate.interval()));
        let tolerance = r.config.rate.zip(interval).map(|(rate, interval)| {
            interval.saturating_mul(i64::from(rate.burst.saturating_sub(1)))
        });
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT decision, retry_us, ahead, wakes \
             FROM {}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                self.q("limit_acquire")
            ))
            .bind(r.limit)
            .bind(r.key)
            .bind(concurrency(r.config))
            .bind(interval)
            .bind(tolerance)
            .bind(r.holder)
            .bind(r.waiter)
            .bind(us(r.hold_for))
            .bind(r.wake)
            .bind(us(BOOKING_GRACE))
            .bind(us(LATE)),
            fetch_one
        )
        .map_err(failure)?;
        let decision: i16 = row.try_get(0).map_err(corrupt)?;
        let retry: Option<i64> = row.try_get(1).map_err(corrupt)?;
        let ahead: i64 = row.try_get(2).map_err(corrupt)?;
        let wake: Vec<String> = row.try_get(3).map_err(corrupt)?;
        let decision = match decision {
            0 => LimitDecision::Granted,
            1 | 2 => LimitDecision::Wait {
                retry_after: wait_of(retry)?,
                ahead: u64::try_from(ahead).unwrap_or(0),
                cause: match decision {
                    1 => LimitCause::Concurrency,
                    _ => LimitCause::Rate,
                },
            },
            other => return Err(corrupt(format!("`{other}` is not a limit's decision"))),
        };
        Ok(Acquired { decision, wake })
    }

    async fn limit_release(
        &self,
        limit: &str,
        key: Option<&str>,
        holder: &str,
        config: LimitConfig,
    ) -> Result<Released, BackendError> {
        self.free_up("limit_release", limit, key, holder, config)
            .await
    }

    async fn limit_leave(
        &self,
        limit: &str,
        key: Option<&str>,
        waiter: &str,
        config: LimitConfig,
    ) -> Result<Released, BackendError> {
        self.free_up("limit_leave", limit, key, waiter, config)
            .await
    }

    async fn limit_renew(
        &self,
        limit: &str,
        key: Option<&str>,
        holder: &str,
        hold_for: Duration,
    ) -> Result<bool, BackendError> {
        run!(
            self,
            sqlx::query_scalar(sql!("SELECT {}($1, $2, $3, $4, $5)", self.q("limit_renew")))
                .bind(limit)
                .bind(key)
                .bind(holder)
                .bind(us(hold_for))
                .bind(us(BOOKING_GRACE)),
            fetch_one
        )
        .map_err(failure)
    }

    async fn limit_usage(
        &self,
        limit: &str,
        key: Option<&str>,
        _config: LimitConfig,
    ) -> Result<LimitUsage, BackendError> {
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT in_use, waiting, booked FROM {}($1, $2, $3)",
                self.q("limit_usage")
            ))
            .bind(limit)
            .bind(key)
            .bind(us(BOOKING_GRACE)),
            fetch_one
        )
        .map_err(failure)?;
        Ok(LimitUsage {
            in_use: count(&row, 0)?,
            waiting: count(&row, 1)?,
            booked: count(&row, 2)?,
        })
    }
}

impl PostgresBackend {
    /// Frees what `who` holds or waits for, by `function` (`limit_release`
    /// for a holder, `limit_leave` for a waiter): both answer whether
    /// anything was freed and the wakes of whom it went to.
    async fn free_up(
        &self,
        function: &str,
        limit: &str,
        key: Option<&str>,
        who: &str,
        config: LimitConfig,
    ) -> Result<Released, BackendError> {
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT released, wakes FROM {}($1, $2, $3, $4, $5)",
                self.q(function)
            ))
            .bind(limit)
            .bind(key)
            .bind(who)
            .bind(concurrency(config))
            .bind(us(BOOKING_GRACE)),
            fetch_one
        )
        .map_err(failure)?;
        released_of(&row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up_to_the_microsecond() {
        assert_eq!(us(Duration::from_nanos(1)), 1);
        assert_eq!(us(Duration::from_nanos(1000)), 1);
        assert_eq!(us(Duration::from_secs(1) / 3), 333_334);
        assert_eq!(us(Duration::from_millis(200)), 200_000);
        assert_eq!(us(Duration::MAX), i64::MAX);
    }
}
