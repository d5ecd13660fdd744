//! Retention: expired tasks, old dead letters, limits that ran out.

use async_trait::async_trait;

use super::{failure, ms, now_ms, SqliteBackend};
use crate::backend::{BackendError, Housekeeping, Housekept, Retention};
use crate::model::task::TaskStatus;

#[async_trait]
impl Housekeeping for SqliteBackend {
    async fn housekeep(&self, retention: &Retention) -> Result<Housekept, BackendError> {
        let now = now_ms();
        let mut tx = self.begin().await?;
        let expired: Vec<String> =
            sqlx::query_scalar("SELECT id FROM tasks WHERE expires_ms <= ? LIMIT ?")
                .bind(now)
                .bind(i64::try_from(retention.batch).unwrap_or(i64::MAX))
                .fetch_all(tx.c())
                .await
                .map_err(failure)?;
        for id in &expired {
            for table in [
                "tasks WHERE id",
                "claims WHERE task_id",
                "audit WHERE task_id",
            ] {
                sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table} = ?")))
                    .bind(id)
                    .execute(tx.c())
                    .await
                    .map_err(failure)?;
            }
        }
        let mut dead_letters = 0;
        if let Some(keep) = retention.dead_letters {
            dead_letters += sqlx::query("DELETE FROM dead_letters WHERE at_ms < ?")
                .bind(now.saturating_sub(ms(keep)))
                .execute(tx.c())
                .await
                .map_err(failure)?
                .rows_affected();
        }
        // Oldest first, but the letter of a task still parked stays: it is
        // what an operator requeues the task by.
        let max = i64::try_from(retention.dead_letters_max).unwrap_or(i64::MAX);
        dead_letters += sqlx::query(
            "DELETE FROM dead_letters WHERE id IN ( \
               SELECT d.id FROM dead_letters d \
                WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = d.task_id AND t.status = ?1) \
                ORDER BY d.id \
                LIMIT MAX(0, (SELECT COUNT(*) FROM dead_letters) - ?2))",
        )
        .bind(TaskStatus::DeadLettered.as_str())
        .bind(max)
        .execute(tx.c())
        .await
        .map_err(failure)?
        .rows_affected();
        super::limits::sweep(tx.c()).await?;
        tx.commit().await?;
        Ok(Housekept {
            tasks: expired.len(),
            dead_letters: usize::try_from(dead_letters).unwrap_or(usize::MAX),
            consumers: 0,
            tallies: 0,
            relayed: 0,
        })
    }
}
