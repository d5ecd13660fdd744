//! Task records, leases with fencing, attempt claims, commits and
//! cancellation flags: each write one call of a function of the schema.

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use serde_json::Value;
use sqlx::Row;
use uuid::Uuid;

use super::settling::located;
use super::{corrupt, failure, PostgresBackend};
use crate::backend::write::{Answer, Write};
use crate::backend::{
    BackendError, Created, Delivery, Heartbeat, Lease, Locked, QueueMessage, TaskQuery,
    TaskRefusal, TaskStore, WorkItem,
};
use crate::model::task::{
    AuditEntry, StoredRecord, TaskId, TaskInstance, TaskStatus, Timestamp, AUDIT_LOG_CAP,
};

/// Milliseconds, as the functions take them.
pub(super) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A task as stored (`task_record`): its head with its steps and audit log.
pub(super) fn parse_task(record: Value) -> Result<TaskInstance, BackendError> {
    let mut task: TaskInstance = serde_json::from_value(record).map_err(corrupt)?;
    task.audit_saved();
    Ok(task)
}

/// The head of a write: the task without its steps and audit log, stamped
/// with when it was written.
pub(super) fn head(task: &TaskInstance) -> Result<String, BackendError> {
    StoredRecord::of(task, Timestamp::now(), false)
        .json()
        .map_err(corrupt)
}

/// The audit entries a write appends, as a JSON array.
pub(super) fn audit(task: &TaskInstance) -> Result<String, BackendError> {
    let unstored = task.unstored_audit();
    serde_json::to_string(&unstored[unstored.len().saturating_sub(AUDIT_LOG_CAP)..])
        .map_err(corrupt)
}

/// A write function's refusal code as the write's answer.
pub(super) fn refused(
    code: i32,
    detail: Option<String>,
    task: &TaskInstance,
    lease: &Lease,
) -> Result<TaskRefusal, BackendError> {
    Ok(match code {
        -1 => TaskRefusal::LockLost { fence: lease.fence },
        -2 => TaskRefusal::Conflict {
            expected: task.version,
            actual: detail.and_then(|d| d.parse().ok()).unwrap_or(0),
        },
        -3 => TaskRefusal::Missing,
        -5 => TaskRefusal::CancelRequested {
            at: Timestamp(detail.and_then(|d| d.parse().ok()).unwrap_or(0)),
        },
        other => {
            return Err(corrupt(format!(
                "unexpected refusal code {other} from a task write"
            )))
        }
    })
}

impl PostgresBackend {
    /// Loads the tasks `ids` (those that exist and have not expired), each
    /// read on its own: a record this version cannot parse is an error of
    /// its own, not of its neighbours.
    async fn load_many(
        &self,
        ids: &[Uuid],
    ) -> Result<Vec<(Uuid, Result<TaskInstance, BackendError>)>, BackendError> {
        let rows = run!(
            self,
            sqlx::query(sql!(
                "SELECT t.id, {}(t.id) FROM {} t WHERE t.id = ANY($1) \
             AND (t.expires_at IS NULL OR t.expires_at > clock_timestamp())",
                self.q("task_record"),
                self.q("tasks")
            ))
            .bind(ids),
            fetch_all
        )
        .map_err(failure)?;
        rows.into_iter()
            .map(|row| {
                let id: Uuid = row.try_get(0).map_err(corrupt)?;
                let task = row.try_get(1).map_err(corrupt).and_then(parse_task);
                Ok((id, task))
            })
            .collect()
    }

    /// Up to `limit` ids `(created ms, id)` of the tasks `query` selects,
    /// newest first, strictly after `after`.
    async fn task_ids(
        &self,
        query: &TaskQuery,
        after: Option<(i64, Uuid)>,
        limit: usize,
    ) -> Result<Vec<(i64, Uuid)>, BackendError> {
        let ms_of = |t: Timestamp| i64::try_from(t.0).unwrap_or(i64::MAX);
        let rows = run!(
            self,
            sqlx::query(sql!(
                "SELECT created_ms, id FROM {} WHERE saga = $1 \
             AND ($2::text IS NULL OR status = $2) \
             AND ($3::bigint IS NULL OR created_ms >= $3) \
             AND ($4::bigint IS NULL OR created_ms < $4) \
             AND ($5::bigint IS NULL OR (created_ms, id) < ($5, $6)) \
             AND (expires_at IS NULL OR expires_at > clock_timestamp()) \
             ORDER BY created_ms DESC, id DESC LIMIT $7",
                self.q("tasks")
            ))
            .bind(&query.saga)
            .bind(query.status.map(TaskStatus::as_str))
            .bind(query.created_from.map(ms_of))
            .bind(query.created_to.map(ms_of))
            .bind(after.map(|a| a.0))
            .bind(after.map(|a| a.1))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX)),
            fetch_all
        )
        .map_err(failure)?;
        rows.iter()
            .map(|row| {
                let created: i64 = row.try_get(0).map_err(corrupt)?;
                let id: Uuid = row.try_get(1).map_err(corrupt)?;
                Ok((created, id))
            })
            .collect()
    }
}

#[async_trait]
impl TaskStore for PostgresBackend {
    async fn create_task(
        &self,
        task: &TaskInstance,
        first: &QueueMessage,
    ) -> Result<Created, BackendError> {
        let mut session = self.session().await.map_err(failure)?;
        let created = self.create_task_on(session.conn(), task, first).await?;
        session.done().await.map_err(failure)?;
        match created {
            true => Ok(Created::New),
            false => match self.load_task(task.id).await? {
                Some(existing) => Ok(Created::Existing(Box::new(existing))),
                // Gone between the two reads (it expired): as good as new
                // to try again.
                None => Err(BackendError::unavailable(format!(
                    "task {} existed, then expired; start it again",
                    task.id
                ))),
            },
        }
    }

    async fn load_task(&self, id: TaskId) -> Result<Option<TaskInstance>, BackendError> {
        self.load_many(&[id.0])
            .await?
            .pop()
            .map(|(_, task)| task)
            .transpose()
    }

    /// A record this version cannot read (a newer version's, during a
    /// rolling deploy) is left out with a warning naming it, and reading
    /// goes on past it: one such task must not hide the saga's others,
    /// nor end a page early (a short page reads as the last). Loading it
    /// by its id answers the error.
    async fn list_tasks(&self, query: &TaskQuery) -> Result<Vec<TaskInstance>, BackendError> {
        let limit = query.limit.max(1);
        let mut after = query
            .after
            .map(|c| (i64::try_from(c.created_at.0).unwrap_or(i64::MAX), c.id.0));
        let mut tasks = Vec::new();
        loop {
            let ids = self.task_ids(query, after, limit).await?;
            let Some(&last) = ids.last() else { break };
            let full = ids.len() == limit;
            let wanted: Vec<Uuid> = ids.iter().map(|(_, id)| *id).collect();
            for (id, task) in self.load_many(&wanted).await? {
                match task {
                    Ok(task) => tasks.push(task),
                    Err(error) => {
                        tracing::warn!(task_id = %id, %error, "a task record this version cannot read is left out of the listing")
                    }
                }
            }
            if tasks.len() >= limit || !full {
                break;
            }
            after = Some(last);
        }
        tasks.sort_by_key(|t| std::cmp::Reverse((t.created_at, t.id)));
        tasks.truncate(limit);
        Ok(tasks)
    }

    async fn saga_names(&self) -> Result<Option<Vec<String>>, BackendError> {
        let rows = run!(
            self,
            sqlx::query(sql!(
                "SELECT DISTINCT saga FROM {} \
             WHERE expires_at IS NULL OR expires_at > clock_timestamp() ORDER BY saga",
                self.q("tasks")
            )),
            fetch_all
        )
        .map_err(failure)?;
        let names = rows
            .iter()
            .map(|row| row.try_get::<String, _>(0).map_err(corrupt))
            .collect::<Result<_, _>>()?;
        Ok(Some(names))
    }

    async fn count_tasks(&self, saga: &str) -> Result<Vec<(TaskStatus, usize)>, BackendError> {
        let rows = run!(
            self,
            sqlx::query(sql!(
                "SELECT status, count(*) FROM {} WHERE saga = $1 \
             AND (expires_at IS NULL OR expires_at > clock_timestamp()) GROUP BY status",
                self.q("tasks")
            ))
            .bind(saga),
            fetch_all
        )
        .map_err(failure)?;
        let mut counts = Vec::new();
        for row in rows {
            let name: String = row.try_get(0).map_err(corrupt)?;
            let n: i64 = row.try_get(1).map_err(corrupt)?;
            if let Some(status) = TaskStatus::ALL.into_iter().find(|s| s.as_str() == name) {
                counts.push((status, usize::try_from(n).unwrap_or(0)));
            }
        }
        Ok(counts)
    }

    /// One index-only count over `tasks_by_status` (saga and status lead
    /// it), however many tasks the sagas keep in other statuses.
    async fn count_in_statuses(
        &self,
        sagas: &[&str],
        statuses: &[TaskStatus],
    ) -> Result<Vec<(String, TaskStatus, usize)>, BackendError> {
        let names: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
        let rows = run!(
            self,
            sqlx::query(sql!(
                "SELECT saga, status, count(*) FROM {} WHERE saga = ANY($1) AND status = ANY($2) \
             AND (expires_at IS NULL OR expires_at > clock_timestamp()) GROUP BY saga, status",
                self.q("tasks")
            ))
            .bind(sagas)
            .bind(&names),
            fetch_all
        )
        .map_err(failure)?;
        let mut counts = Vec::new();
        for row in rows {
            let saga: String = row.try_get(0).map_err(corrupt)?;
            let name: String = row.try_get(1).map_err(corrupt)?;
            let n: i64 = row.try_get(2).map_err(corrupt)?;
            if let Some(status) = statuses.iter().find(|s| s.as_str() == name) {
                counts.push((saga, *status, usize::try_from(n).unwrap_or(0)));
            }
        }
        Ok(counts)
    }

    async fn lock_and_load(
        &self,
        id: TaskId,
        ttl: Duration,
    ) -> Result<Option<Locked>, BackendError> {
        let token = Uuid::new_v4().simple().to_string();
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT code, fence, record, cancel_ms FROM {}($1, $2, $3)",
                self.q("lock_task")
            ))
            .bind(id.0)
            .bind(&token)
            .bind(ms(ttl)),
            fetch_one
        )
        .map_err(failure)?;
        let code: i32 = row.try_get(0).map_err(corrupt)?;
        match code {
            -4 => Ok(None),
            -3 => Ok(Some(Locked::missing(id))),
            _ => {
                let fence: i64 = row.try_get(1).map_err(corrupt)?;
                let lease = Lease {
                    task_id: id,
                    token,
                    fence: u64::try_from(fence).unwrap_or(0),
                };
                let cancel: Option<i64> = row.try_get(3).map_err(corrupt)?;
                let task = match row.try_get(2).map_err(corrupt).and_then(parse_task) {
                    Ok(task) => task,
                    // Not held for a task nobody here can advance: a
                    // version that can read it may take it at once.
                    Err(error) => {
                        if let Err(unlock) = self.unlock(&lease).await {
                            tracing::debug!(error = %unlock, "unlock failed; the lease expires on its own");
                        }
                        return Err(error);
                    }
                };
                self.shared.steps.loaded(&task);
                Ok(Some(Locked {
                    lease,
                    task: Some(task),
                    cancel_requested: cancel.map(|c| Timestamp(u64::try_from(c).unwrap_or(0))),
                }))
            }
        }
    }

    async fn apply(&self, write: &Write<'_>) -> Result<Answer, BackendError> {
        self.interpret(write).await
    }

    async fn heartbeat(
        &self,
        lease: &Lease,
        delivery: &Delivery,
        ttl: Duration,
    ) -> Result<Heartbeat, BackendError> {
        let (row_id, claim) = located(delivery)?;
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT held, cancel_ms FROM {}($1, $2, $3, $4, $5, $6)",
                self.q("heartbeat")
            ))
            .bind(lease.task_id.0)
            .bind(&lease.token)
            .bind(ms(ttl))
            .bind(row_id)
            .bind(claim)
            .bind(ms(self.shared.config.visibility_timeout)),
            fetch_one
        )
        .map_err(failure)?;
        let held: bool = row.try_get(0).map_err(corrupt)?;
        let cancel: Option<i64> = row.try_get(1).map_err(corrupt)?;
        Ok(Heartbeat {
            lock_held: held,
            cancel_requested: cancel.map(|c| Timestamp(u64::try_from(c).unwrap_or(0))),
        })
    }

    async fn unlock(&self, lease: &Lease) -> Result<bool, BackendError> {
        let done = run!(
            self,
            sqlx::query(sql!(
                "UPDATE {} SET lock_token = NULL, lock_until = NULL WHERE id = $1 AND lock_token = $2",
                self.q("tasks")
            ))
            .bind(lease.task_id.0)
            .bind(&lease.token),
            execute
        )
        .map_err(failure)?;
        Ok(done.rows_affected() > 0)
    }

    async fn request_cancel(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
    ) -> Result<Option<Timestamp>, BackendError> {
        self.cancel_request(id, token, wake, None).await
    }

    async fn request_cancel_audited(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
        entry: &AuditEntry,
    ) -> Result<Option<Timestamp>, BackendError> {
        self.cancel_request(id, token, wake, Some(entry)).await
    }

    async fn cancel_requested(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError> {
        let at: Option<Option<i64>> = run!(
            self,
            sqlx::query_scalar(sql!(
                "SELECT cancel_ms FROM {} WHERE id = $1",
                self.q("tasks")
            ))
            .bind(id.0),
            fetch_optional
        )
        .map_err(failure)?;
        Ok(at
            .flatten()
            .map(|t| Timestamp(u64::try_from(t).unwrap_or(0))))
    }

    async fn cancellations(&self) -> Result<BoxStream<'static, TaskId>, BackendError> {
        let rx = self.shared.signals.cancellations.subscribe();
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(id) => return Some((id, rx)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        Ok(stream.boxed())
    }

    async fn wait_for_change(&self, id: TaskId, timeout: Duration) {
        let mut finished = self.shared.signals.finished.subscribe();
        let wait = async {
            loop {
                match finished.recv().await {
                    // This task, or any (the nil id), or notices were
                    // missed: look.
                    Ok(done) if done == id || done.0.is_nil() => return,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
                    Ok(_) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        std::future::pending::<()>().await
                    }
                }
            }
        };
        let _ = tokio::time::timeout(timeout, wait).await;
    }
}

impl PostgresBackend {
    /// Creates `task` with its first message on `executor` (the pool, or a
    /// caller's transaction); `false` when a task with its id exists.
    pub(super) async fn create_task_on<'e, E>(
        &self,
        executor: E,
        task: &TaskInstance,
        first: &QueueMessage,
    ) -> Result<bool, BackendError>
    where
        E: sqlx::Executor<'e, Database = sqlx::Postgres>,
    {
        let steps = serde_json::to_string(&task.steps).map_err(corrupt)?;
        let mut stored = task.clone();
        stored.version = 1;
        let created: bool = sqlx::query_scalar(sql!(
            "SELECT {}($1, $2, $3, $4::jsonb, $5::jsonb, $6::jsonb, $7, $8)",
            self.q("create_task")
        ))
        .bind(task.id.0)
        .bind(&task.saga)
        .bind(task.status.as_str())
        .bind(head(&stored)?)
        .bind(steps)
        .bind(audit(task)?)
        .bind(i64::try_from(task.created_at.0).unwrap_or(i64::MAX))
        .bind(WorkItem::Saga(first.clone()).encode())
        .fetch_one(executor)
        .await
        .map_err(failure)?;
        Ok(created)
    }
}
