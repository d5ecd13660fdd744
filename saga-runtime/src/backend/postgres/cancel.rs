//! A cancellation request that says who asked: the request
//! (`request_cancel`) and the operator's audit entry in one transaction.
//! Unlike the protocol's writes it takes a few statements (an operator's
//! action, rare), so that it needs no new function in the schema: a
//! deployment keeps its schema version.

use sqlx::Row;

use super::{corrupt, failure, PostgresBackend};
use crate::backend::{BackendError, QueueMessage, WorkItem};
use crate::model::task::{AuditEntry, TaskId, Timestamp, AUDIT_LOG_CAP};

impl PostgresBackend {
    /// Records a cancellation request; `entry` joins the audit log only
    /// if this call recorded it (not a retry of it, not when an earlier
    /// one stands). The audit row takes the task's next sequence number
    /// under the row lock, as a worker's write does, so the two cannot
    /// collide whoever holds the lease.
    pub(super) async fn cancel_request(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
        entry: Option<&AuditEntry>,
    ) -> Result<Option<Timestamp>, BackendError> {
        let Some(entry) = entry else {
            let mut session = self.session().await.map_err(failure)?;
            let earlier = self.request(session.conn(), id, token, wake).await?;
            session.done().await.map_err(failure)?;
            return Ok(earlier);
        };
        let mut tx = self.begin().await?;
        // Whether a request stands already: `None` for no task.
        let before: Option<Option<String>> = sqlx::query_scalar(sql!(
            "SELECT cancel_token FROM {} WHERE id = $1 FOR UPDATE",
            self.q("tasks")
        ))
        .bind(id.0)
        .fetch_optional(&mut *tx)
        .await
        .map_err(failure)?;
        let earlier = self.request(&mut *tx, id, token, wake).await?;
        if before == Some(None) {
            let entries = serde_json::to_string(&[entry]).map_err(corrupt)?;
            let seq: i64 = sqlx::query_scalar(sql!(
                "UPDATE {} SET audit_seq = audit_seq + 1 WHERE id = $1 RETURNING audit_seq",
                self.q("tasks")
            ))
            .bind(id.0)
            .fetch_one(&mut *tx)
            .await
            .map_err(failure)?;
            sqlx::query(sql!(
                "SELECT {}($1, '[]'::jsonb, $2::jsonb, $3, $4)",
                self.q("write_rows")
            ))
            .bind(id.0)
            .bind(entries)
            .bind(seq)
            .bind(i32::try_from(AUDIT_LOG_CAP).unwrap_or(i32::MAX))
            .execute(&mut *tx)
            .await
            .map_err(failure)?;
        }
        tx.commit().await.map_err(failure)?;
        Ok(earlier)
    }

    /// `request_cancel`: the flag and the wake-up message, unless a
    /// request stands (then its time).
    async fn request(
        &self,
        executor: impl sqlx::PgExecutor<'_>,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
    ) -> Result<Option<Timestamp>, BackendError> {
        let row = sqlx::query(sql!(
            "SELECT exists_, earlier_ms FROM {}($1, $2, $3, $4)",
            self.q("request_cancel")
        ))
        .bind(id.0)
        .bind(token)
        .bind(i64::try_from(Timestamp::now().0).unwrap_or(i64::MAX))
        .bind(WorkItem::Saga(wake.clone()).encode())
        .fetch_one(executor)
        .await
        .map_err(failure)?;
        let earlier: Option<i64> = row.try_get(1).map_err(corrupt)?;
        Ok(earlier.map(|t| Timestamp(u64::try_from(t).unwrap_or(0))))
    }
}
