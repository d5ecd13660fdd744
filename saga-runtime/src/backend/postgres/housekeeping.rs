//! Retention by batched deletes: expired tasks with their rows, old dead
//! letters, and dead letters beyond the cap.

use async_trait::async_trait;
use sqlx::Row;

use super::tasks::ms;
use super::{corrupt, failure, PostgresBackend};
use crate::backend::{BackendError, Housekeeping, Housekept, Retention};

#[async_trait]
impl Housekeeping for PostgresBackend {
    async fn housekeep(&self, retention: &Retention) -> Result<Housekept, BackendError> {
        let row = sqlx::query(sql!(
            "SELECT tasks, dead_letters FROM {}($1, $2, $3)",
            self.q("housekeep")
        ))
        .bind(i32::try_from(retention.batch.max(1)).unwrap_or(i32::MAX))
        .bind(retention.dead_letters.map(ms))
        .bind(i64::try_from(retention.dead_letters_max).unwrap_or(i64::MAX))
        .fetch_one(self.pool_ref())
        .await
        .map_err(failure)?;
        let tasks: i32 = row.try_get(0).map_err(corrupt)?;
        let dead: i32 = row.try_get(1).map_err(corrupt)?;
        let mut housekept = Housekept {
            tasks: usize::try_from(tasks).unwrap_or(0),
            dead_letters: usize::try_from(dead).unwrap_or(0),
            ..Housekept::default()
        };
        housekept.consumers = 0;
        Ok(housekept)
    }
}
