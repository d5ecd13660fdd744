//! Retention by batched deletes: expired tasks with their rows, old dead
//! letters, and dead letters beyond the cap (`housekeep`); expired
//! tombstones, and expired tallies with their items (`housekeep_process`);
//! limit keys that ran out (`limits_sweep`). All in one statement.

use async_trait::async_trait;
use sqlx::Row;

use super::tasks::ms;
use super::{corrupt, failure, PostgresBackend};
use crate::backend::{BackendError, Housekeeping, Housekept, Retention};

/// A count as the functions answer it.
fn count(row: &sqlx::postgres::PgRow, i: usize) -> Result<usize, BackendError> {
    let n: i32 = row.try_get(i).map_err(corrupt)?;
    Ok(usize::try_from(n).unwrap_or(0))
}

#[async_trait]
impl Housekeeping for PostgresBackend {
    async fn housekeep(&self, retention: &Retention) -> Result<Housekept, BackendError> {
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT h.tasks, h.dead_letters, p.tombstones, p.tallies, s.limits \
             FROM {}($1, $2, $3) h, {}($1) p, {}($1, $4) AS s(limits)",
                self.q("housekeep"),
                self.q("housekeep_process"),
                self.q("limits_sweep")
            ))
            .bind(i32::try_from(retention.batch.max(1)).unwrap_or(i32::MAX))
            .bind(retention.dead_letters.map(ms))
            .bind(i64::try_from(retention.dead_letters_max).unwrap_or(i64::MAX))
            // A limit's key whose holders died and that nobody asked for since
            // is swept once everything in it ran out.
            .bind(super::limits::us(crate::backend::BOOKING_GRACE)),
            fetch_one
        )
        .map_err(failure)?;
        let (tombstones, tallies) = (count(&row, 2)?, count(&row, 3)?);
        let limits = count(&row, 4)?;
        if limits > 0 {
            tracing::debug!(limits, "limit keys that ran out removed");
        }
        if tombstones + tallies > 0 {
            // `Housekept` has no place for these: its `tallies` counts
            // completions sent by housekeeping, which never happens here
            // (a check sends its completion itself).
            tracing::debug!(tombstones, tallies, "expired process-manager rows removed");
        }
        Ok(Housekept {
            tasks: count(&row, 0)?,
            dead_letters: count(&row, 1)?,
            // Idle consumers hold nothing (no registry of them), no
            // completion is left unsent, no endpoint message is relayed.
            ..Housekept::default()
        })
    }
}
