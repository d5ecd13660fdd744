//! Dead letters: parked messages, newest first (ids grow in parking order,
//! so a cursor still says where a page ended after its letter went).

use async_trait::async_trait;
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use super::tasks::{id_of, push};
use super::{corrupt, failure, SqliteBackend};
use crate::backend::{BackendError, DeadLetter, DeadLetterQuery, DeadLetters, Page};
use crate::model::task::Timestamp;

/// The row of a dead letter's id (`dl-<row>`); `None` for an id this
/// store did not hand out.
pub(super) fn row_of(id: &str) -> Option<i64> {
    id.strip_prefix("dl-").and_then(|n| n.parse().ok())
}

const COLUMNS: &str = "id, payload, reason, task_id, at_ms, truncated";

fn letter(row: &SqliteRow) -> Result<DeadLetter, BackendError> {
    let id: i64 = row.try_get(0).map_err(corrupt)?;
    let task: Option<String> = row.try_get(3).map_err(corrupt)?;
    let at: i64 = row.try_get(4).map_err(corrupt)?;
    let truncated: Option<i64> = row.try_get(5).map_err(corrupt)?;
    Ok(DeadLetter {
        id: format!("dl-{id}"),
        payload: row.try_get(1).map_err(corrupt)?,
        reason: row.try_get(2).map_err(corrupt)?,
        task_id: task.as_deref().map(id_of).transpose()?,
        at: Timestamp(u64::try_from(at).unwrap_or(0)),
        truncated: truncated.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
    })
}

#[async_trait]
impl DeadLetters for SqliteBackend {
    async fn dead_letters(
        &self,
        query: &DeadLetterQuery,
    ) -> Result<Page<DeadLetter>, BackendError> {
        let before = match &query.after {
            Some(after) => {
                Some(row_of(after).ok_or_else(|| BackendError::InvalidCursor(after.clone()))?)
            }
            None => None,
        };
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM dead_letters WHERE (?1 IS NULL OR id < ?1) \
              ORDER BY id DESC LIMIT ?2"
        )))
        .bind(before)
        .bind(i64::try_from(query.limit).unwrap_or(i64::MAX - 1) + 1)
        .fetch_all(&mut self.read().await?.conn)
        .await
        .map_err(failure)?;
        let more = rows.len() > query.limit;
        let items = rows
            .iter()
            .take(query.limit)
            .map(letter)
            .collect::<Result<Vec<_>, _>>()?;
        let next = more.then(|| items.last().map(|d| d.id.clone())).flatten();
        Ok(Page { items, next })
    }

    async fn dead_letter_by_id(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        let Some(row) = row_of(id) else {
            return Ok(None);
        };
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM dead_letters WHERE id = ?"
        )))
        .bind(row)
        .fetch_optional(&mut self.read().await?.conn)
        .await
        .map_err(failure)?;
        row.as_ref().map(letter).transpose()
    }

    async fn requeue_dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        let Some(row) = row_of(id) else {
            return Ok(None);
        };
        let mut tx = self.begin().await?;
        let found = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM dead_letters WHERE id = ? RETURNING {COLUMNS}"
        )))
        .bind(row)
        .fetch_optional(tx.c())
        .await
        .map_err(failure)?;
        let Some(found) = found else {
            tx.commit().await?;
            return Ok(None);
        };
        let letter = letter(&found)?;
        push(tx.c(), letter.payload.as_bytes(), std::time::Duration::ZERO).await?;
        tx.commit().await?;
        self.queue_changed();
        Ok(Some(letter))
    }

    async fn discard_dead_letter(&self, id: &str) -> Result<bool, BackendError> {
        let Some(row) = row_of(id) else {
            return Ok(false);
        };
        let mut tx = self.begin().await?;
        let done = sqlx::query("DELETE FROM dead_letters WHERE id = ?")
            .bind(row)
            .execute(tx.c())
            .await
            .map_err(failure)?;
        tx.commit().await?;
        Ok(done.rows_affected() > 0)
    }

    async fn dead_letter_count(&self) -> Result<usize, BackendError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM dead_letters")
            .fetch_one(&mut self.read().await?.conn)
            .await
            .map_err(failure)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }
}
