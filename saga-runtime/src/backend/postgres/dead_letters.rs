//! Dead letters: a table, newest first by id; requeued by one function
//! that moves the letter back onto the queue.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::{corrupt, failure, PostgresBackend};
use crate::backend::{BackendError, DeadLetter, DeadLetterQuery, DeadLetters, Page};
use crate::model::task::{TaskId, Timestamp};

/// A letter from a row of `(id, payload, reason, task_id, at_ms, size)`.
fn letter(row: &PgRow) -> Result<DeadLetter, BackendError> {
    let id: i64 = row.try_get(0).map_err(corrupt)?;
    let task: Option<uuid::Uuid> = row.try_get(3).map_err(corrupt)?;
    let at: i64 = row.try_get(4).map_err(corrupt)?;
    let size: Option<i64> = row.try_get(5).map_err(corrupt)?;
    Ok(DeadLetter {
        id: id.to_string(),
        payload: row.try_get(1).map_err(corrupt)?,
        reason: row.try_get(2).map_err(corrupt)?,
        task_id: task.map(TaskId),
        at: Timestamp(u64::try_from(at).unwrap_or(0)),
        truncated: size.and_then(|s| usize::try_from(s).ok()),
    })
}

/// A letter's id as the table keys it; `None` for an id this backend did
/// not hand out.
fn row_id(id: &str) -> Option<i64> {
    id.parse().ok()
}

#[async_trait]
impl DeadLetters for PostgresBackend {
    async fn dead_letters(
        &self,
        query: &DeadLetterQuery,
    ) -> Result<Page<DeadLetter>, BackendError> {
        let before = match &query.after {
            Some(after) => {
                Some(row_id(after).ok_or_else(|| BackendError::InvalidCursor(after.clone()))?)
            }
            None => None,
        };
        let limit = query.limit.max(1);
        let rows = run!(
            self,
            sqlx::query(sql!(
                "SELECT id, payload, reason, task_id, at_ms, size FROM {} \
             WHERE ($1::bigint IS NULL OR id < $1) ORDER BY id DESC LIMIT $2",
                self.q("dead_letters")
            ))
            .bind(before)
            .bind(i64::try_from(limit + 1).unwrap_or(i64::MAX)),
            fetch_all
        )
        .map_err(failure)?;
        let more = rows.len() > limit;
        let items = rows
            .iter()
            .take(limit)
            .map(letter)
            .collect::<Result<Vec<_>, _>>()?;
        let next = more.then(|| items.last().map(|d| d.id.clone())).flatten();
        Ok(Page { items, next })
    }

    async fn dead_letter_by_id(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        let Some(id) = row_id(id) else {
            return Ok(None);
        };
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT id, payload, reason, task_id, at_ms, size FROM {} WHERE id = $1",
                self.q("dead_letters")
            ))
            .bind(id),
            fetch_optional
        )
        .map_err(failure)?;
        row.as_ref().map(letter).transpose()
    }

    async fn requeue_dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        let Some(row_id) = row_id(id) else {
            return Ok(None);
        };
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT $1::bigint, payload, reason, task_id, at_ms, size, exists_ FROM {}($1)",
                self.q("requeue_dead_letter")
            ))
            .bind(row_id),
            fetch_one
        )
        .map_err(failure)?;
        let found: bool = row.try_get(6).map_err(corrupt)?;
        match found {
            true => letter(&row).map(Some),
            false => Ok(None),
        }
    }

    async fn discard_dead_letter(&self, id: &str) -> Result<bool, BackendError> {
        let Some(id) = row_id(id) else {
            return Ok(false);
        };
        let done = run!(
            self,
            sqlx::query(sql!("DELETE FROM {} WHERE id = $1", self.q("dead_letters"))).bind(id),
            execute
        )
        .map_err(failure)?;
        Ok(done.rows_affected() > 0)
    }

    async fn dead_letter_count(&self) -> Result<usize, BackendError> {
        let n: i64 = run!(
            self,
            sqlx::query_scalar(sql!("SELECT count(*) FROM {}", self.q("dead_letters"))),
            fetch_one
        )
        .map_err(failure)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }
}
