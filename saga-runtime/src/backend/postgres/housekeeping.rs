//! Retention by batched deletes: expired tasks with their rows, old dead
//! letters, and dead letters beyond the cap (`housekeep`); expired
//! tombstones, and expired tallies with their items (`housekeep_process`).
//! Both in one statement.

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
        let row = sqlx::query(sql!(
            "SELECT h.tasks, h.dead_letters, p.tombstones, p.tallies \
             FROM {}($1, $2, $3) h, {}($1) p",
            self.q("housekeep"),
            self.q("housekeep_process")
        ))
        .bind(i32::try_from(retention.batch.max(1)).unwrap_or(i32::MAX))
        .bind(retention.dead_letters.map(ms))
        .bind(i64::try_from(retention.dead_letters_max).unwrap_or(i64::MAX))
        .fetch_one(self.pool_ref())
        .await
        .map_err(failure)?;
        let (tombstones, tallies) = (count(&row, 2)?, count(&row, 3)?);
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
