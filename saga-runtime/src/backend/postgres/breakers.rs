//! Circuit breakers shared by the deployment (`scope = shared`): a row
//! per breaker while it counts failures or is open (`breaker_acquire`,
//! `breaker_report` in `migrations/0003_coordination.sql`), each decision
//! one function call on the server's clock.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;

use super::tasks::ms;
use super::{corrupt, failure, PostgresBackend};
use crate::backend::{BackendError, BreakerChange, BreakerDecision, Breakers};

/// How long a breaker's state outlives its break without a report: then
/// it is forgotten, as the Redis backend lets its key expire (a count of
/// failures a day old says nothing about the dependency now).
const KEEP: Duration = Duration::from_secs(24 * 60 * 60);

#[async_trait]
impl Breakers for PostgresBackend {
    async fn breaker_acquire(
        &self,
        name: &str,
        probe_ttl: Duration,
        token: &str,
    ) -> Result<BreakerDecision, BackendError> {
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT admitted, probe, counting, retry_after_ms FROM {}($1, $2, $3)",
                self.q("breaker_acquire")
            ))
            .bind(name)
            .bind(ms(probe_ttl))
            .bind(token),
            fetch_one
        )
        .map_err(failure)?;
        let admitted: bool = row.try_get(0).map_err(corrupt)?;
        if !admitted {
            let retry_after: Option<i64> = row.try_get(3).map_err(corrupt)?;
            let retry_after =
                retry_after.ok_or_else(|| corrupt("an open breaker without a time"))?;
            return Ok(BreakerDecision::Open {
                retry_after: Duration::from_millis(u64::try_from(retry_after).unwrap_or(1)),
            });
        }
        Ok(BreakerDecision::Call {
            probe: row.try_get(1).map_err(corrupt)?,
            counting: row.try_get(2).map_err(corrupt)?,
        })
    }

    async fn breaker_report(
        &self,
        name: &str,
        probe: Option<&str>,
        failed: Option<bool>,
        threshold: u32,
        open_for: Duration,
    ) -> Result<Option<BreakerChange>, BackendError> {
        let change: i32 = run!(
            self,
            sqlx::query_scalar(sql!(
                "SELECT {}($1, $2, $3, $4, $5, $6)",
                self.q("breaker_report")
            ))
            .bind(name)
            .bind(probe)
            .bind(failed)
            .bind(i32::try_from(threshold).unwrap_or(i32::MAX))
            .bind(ms(open_for))
            .bind(ms(open_for.saturating_add(KEEP))),
            fetch_one
        )
        .map_err(failure)?;
        Ok(match change {
            1 => Some(BreakerChange::Opened),
            2 => Some(BreakerChange::Closed),
            _ => None,
        })
    }
}
