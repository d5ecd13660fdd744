//! Task records, leases with fencing, attempt claims, cancellation flags
//! (the guarded writes through the interpreter, `write.rs`).

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::Row;
use uuid::Uuid;

use super::{corrupt, failure, ms, now_ms, SqliteBackend};
use crate::backend::write::{Answer, Write};
use crate::backend::{
    BackendError, Created, Delivery, Heartbeat, Lease, Locked, QueueMessage, TaskQuery, TaskStore,
    WorkItem,
};
use crate::model::task::{AuditEntry, TaskId, TaskInstance, TaskStatus, Timestamp, AUDIT_LOG_CAP};

/// A task's key in the tables: its id, hyphenated (text order is the id's
/// order, as the listing needs).
pub(super) fn key(id: TaskId) -> String {
    id.0.hyphenated().to_string()
}

pub(super) fn id_of(text: &str) -> Result<TaskId, BackendError> {
    Uuid::parse_str(text).map(TaskId).map_err(corrupt)
}

fn timestamp(ms: Option<i64>) -> Option<Timestamp> {
    ms.map(|ms| Timestamp(u64::try_from(ms).unwrap_or(0)))
}

/// Reads a task: its record, its version and its audit log, every entry
/// of which the store holds.
pub(super) async fn load(
    c: &mut SqliteConnection,
    id: TaskId,
) -> Result<Option<TaskInstance>, BackendError> {
    let row = sqlx::query("SELECT record, version FROM tasks WHERE id = ?")
        .bind(key(id))
        .fetch_optional(&mut *c)
        .await
        .map_err(failure)?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(read(c, &row).await?))
}

/// The task of a row of `record, version`, with its audit log.
async fn read(c: &mut SqliteConnection, row: &SqliteRow) -> Result<TaskInstance, BackendError> {
    let record: String = row.try_get(0).map_err(corrupt)?;
    let version: i64 = row.try_get(1).map_err(corrupt)?;
    let mut task: TaskInstance = serde_json::from_str(&record).map_err(corrupt)?;
    task.version = u64::try_from(version).map_err(corrupt)?;
    let entries: Vec<String> =
        sqlx::query_scalar("SELECT entry FROM audit WHERE task_id = ? ORDER BY seq")
            .bind(key(task.id))
            .fetch_all(&mut *c)
            .await
            .map_err(failure)?;
    task.audit_log = entries
        .iter()
        .map(|e| serde_json::from_str(e).map_err(corrupt))
        .collect::<Result<_, _>>()?;
    task.audit_saved();
    Ok(task)
}

/// Appends `entries` to the task's audit log, keeping the last
/// [`AUDIT_LOG_CAP`].
pub(super) async fn append_audit(
    c: &mut SqliteConnection,
    id: TaskId,
    entries: &[AuditEntry],
) -> Result<(), BackendError> {
    if entries.is_empty() {
        return Ok(());
    }
    // Two statements whatever the number of entries: each statement is a
    // round trip to the connection's thread, which is what a write costs
    // most (the entries go as one JSON array of their texts).
    let texts = entries
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<Vec<_>, _>>()
        .map_err(corrupt)?;
    let texts = serde_json::to_string(&texts).map_err(corrupt)?;
    sqlx::query(
        "INSERT INTO audit (task_id, seq, entry) \
         SELECT ?1, COALESCE((SELECT MAX(seq) FROM audit WHERE task_id = ?1), 0) + e.key + 1, \
                e.value \
           FROM json_each(?2) AS e",
    )
    .bind(key(id))
    .bind(texts)
    .execute(&mut *c)
    .await
    .map_err(failure)?;
    let cap = i64::try_from(AUDIT_LOG_CAP).unwrap_or(i64::MAX);
    sqlx::query(
        "DELETE FROM audit WHERE task_id = ?1 \
            AND seq <= (SELECT MAX(seq) FROM audit WHERE task_id = ?1) - ?2",
    )
    .bind(key(id))
    .bind(cap)
    .execute(&mut *c)
    .await
    .map_err(failure)?;
    Ok(())
}

/// The record as stored: the task without its audit log (kept apart),
/// under `version`, updated now.
pub(super) fn record(task: &TaskInstance, version: u64) -> Result<String, BackendError> {
    let mut stored = task.clone();
    stored.audit_log = Vec::new();
    stored.version = version;
    stored.updated_at = Timestamp::now();
    serde_json::to_string(&stored).map_err(corrupt)
}

/// Puts `raw` on the queue, due after `delay`.
pub(super) async fn push(
    c: &mut SqliteConnection,
    raw: &[u8],
    delay: Duration,
) -> Result<(), BackendError> {
    let kind = match WorkItem::decode(raw) {
        Ok(WorkItem::Saga(_)) => 0,
        Ok(WorkItem::Process(_)) => 1,
        Err(_) => 2,
    };
    let due = now_ms().saturating_add(ms(delay));
    sqlx::query("INSERT INTO queue (raw, kind, due_ms, since_ms) VALUES (?, ?, ?, ?)")
        .bind(raw)
        .bind(kind)
        .bind(due)
        .bind(due)
        .execute(&mut *c)
        .await
        .map_err(failure)?;
    Ok(())
}

impl SqliteBackend {
    /// Records a cancellation request (and `entry` in the task's audit
    /// log, as the log's own append: the task may be leased to a worker)
    /// unless one stands; answers an earlier request's time.
    async fn cancel_request(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
        entry: Option<&AuditEntry>,
    ) -> Result<Option<Timestamp>, BackendError> {
        let mut tx = self.begin().await?;
        let row = sqlx::query("SELECT cancel_ms, cancel_token FROM tasks WHERE id = ?")
            .bind(key(id))
            .fetch_optional(tx.c())
            .await
            .map_err(failure)?;
        // Nothing is recorded for a task that does not exist. (Each answer
        // waits for what it read to be on the disk: see `commit.rs`.)
        let Some(row) = row else {
            tx.commit().await?;
            return Ok(None);
        };
        let at: Option<i64> = row.try_get(0).map_err(corrupt)?;
        let by: Option<String> = row.try_get(1).map_err(corrupt)?;
        if let Some(at) = at {
            tx.commit().await?;
            return Ok((by.as_deref() != Some(token))
                .then(|| timestamp(Some(at)))
                .flatten());
        }
        sqlx::query("UPDATE tasks SET cancel_ms = ?, cancel_token = ? WHERE id = ?")
            .bind(now_ms())
            .bind(token)
            .bind(key(id))
            .execute(tx.c())
            .await
            .map_err(failure)?;
        if let Some(entry) = entry {
            append_audit(tx.c(), id, std::slice::from_ref(entry)).await?;
        }
        let raw = WorkItem::Saga(wake.clone()).encode();
        push(tx.c(), raw.as_bytes(), Duration::ZERO).await?;
        tx.commit().await?;
        let _ = self.shared.cancels.send(id);
        self.queue_changed();
        Ok(None)
    }
}

#[async_trait]
impl TaskStore for SqliteBackend {
    async fn create_task(
        &self,
        task: &TaskInstance,
        first: &QueueMessage,
    ) -> Result<Created, BackendError> {
        let mut tx = self.begin().await?;
        if let Some(existing) = load(tx.c(), task.id).await? {
            // Answered once what was read is on the disk.
            tx.commit().await?;
            return Ok(Created::Existing(Box::new(existing)));
        }
        sqlx::query(
            "INSERT INTO tasks (id, saga, status, created_ms, version, record) \
             VALUES (?, ?, ?, ?, 1, ?)",
        )
        .bind(key(task.id))
        .bind(&task.saga)
        .bind(task.status.as_str())
        .bind(i64::try_from(task.created_at.0).unwrap_or(i64::MAX))
        .bind(record(task, 1)?)
        .execute(tx.c())
        .await
        .map_err(failure)?;
        append_audit(tx.c(), task.id, &task.audit_log).await?;
        let raw = WorkItem::Saga(first.clone()).encode();
        push(tx.c(), raw.as_bytes(), Duration::ZERO).await?;
        tx.commit().await?;
        self.queue_changed();
        self.task_changed();
        Ok(Created::New)
    }

    async fn load_task(&self, id: TaskId) -> Result<Option<TaskInstance>, BackendError> {
        load(&mut self.read().await?.conn, id).await
    }

    async fn list_tasks(&self, query: &TaskQuery) -> Result<Vec<TaskInstance>, BackendError> {
        let (after_ms, after_id) = match query.after {
            Some(c) => (i64::try_from(c.created_at.0).unwrap_or(i64::MAX), key(c.id)),
            None => (i64::MAX, String::new()),
        };
        let ms_of = |t: Option<Timestamp>| t.map(|t| i64::try_from(t.0).unwrap_or(i64::MAX));
        let mut conn = self.read().await?;
        let rows = sqlx::query(
            "SELECT record, version FROM tasks \
              WHERE saga = ?1 AND (?2 IS NULL OR status = ?2) \
                AND (?3 IS NULL OR created_ms >= ?3) AND (?4 IS NULL OR created_ms < ?4) \
                AND (?6 = '' OR created_ms < ?5 OR (created_ms = ?5 AND id < ?6)) \
              ORDER BY created_ms DESC, id DESC LIMIT ?7",
        )
        .bind(&query.saga)
        .bind(query.status.map(|s| s.as_str()))
        .bind(ms_of(query.created_from))
        .bind(ms_of(query.created_to))
        .bind(after_ms)
        .bind(after_id)
        .bind(i64::try_from(query.limit).unwrap_or(i64::MAX))
        .fetch_all(&mut conn.conn)
        .await
        .map_err(failure)?;
        let mut tasks = Vec::with_capacity(rows.len());
        for row in &rows {
            tasks.push(read(&mut conn.conn, row).await?);
        }
        Ok(tasks)
    }

    async fn count_tasks(&self, saga: &str) -> Result<Vec<(TaskStatus, usize)>, BackendError> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT status, COUNT(*) FROM tasks WHERE saga = ? GROUP BY status")
                .bind(saga)
                .fetch_all(&mut self.read().await?.conn)
                .await
                .map_err(failure)?;
        let mut counts = Vec::new();
        for status in TaskStatus::ALL {
            if let Some((_, n)) = rows.iter().find(|(s, _)| s == status.as_str()) {
                counts.push((status, usize::try_from(*n).unwrap_or(0)));
            }
        }
        Ok(counts)
    }

    async fn saga_names(&self) -> Result<Option<Vec<String>>, BackendError> {
        let names = sqlx::query_scalar("SELECT DISTINCT saga FROM tasks ORDER BY saga")
            .fetch_all(&mut self.read().await?.conn)
            .await
            .map_err(failure)?;
        Ok(Some(names))
    }

    async fn lock_and_load(
        &self,
        id: TaskId,
        ttl: Duration,
    ) -> Result<Option<Locked>, BackendError> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let row = sqlx::query("SELECT fence, lock_until, cancel_ms FROM tasks WHERE id = ?")
            .bind(key(id))
            .fetch_optional(tx.c())
            .await
            .map_err(failure)?;
        // No lease for a task that does not exist: a stray message leaves
        // nothing behind.
        let Some(row) = row else {
            tx.commit().await?;
            return Ok(Some(Locked::missing(id)));
        };
        let until: Option<i64> = row.try_get(1).map_err(corrupt)?;
        if until.is_some_and(|until| until > now) {
            tx.commit().await?;
            return Ok(None);
        }
        let fence = row.try_get::<i64, _>(0).map_err(corrupt)? + 1;
        let token = Uuid::new_v4().simple().to_string();
        sqlx::query("UPDATE tasks SET fence = ?, lock_token = ?, lock_until = ? WHERE id = ?")
            .bind(fence)
            .bind(&token)
            .bind(now.saturating_add(ms(ttl)))
            .bind(key(id))
            .execute(tx.c())
            .await
            .map_err(failure)?;
        let task = load(tx.c(), id).await?;
        tx.commit().await?;
        Ok(Some(Locked {
            lease: Lease {
                task_id: id,
                token,
                fence: u64::try_from(fence).unwrap_or(0),
            },
            task,
            cancel_requested: timestamp(row.try_get(2).map_err(corrupt)?),
        }))
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
        let mut tx = self.begin().await?;
        let now = now_ms();
        let held = sqlx::query(
            "UPDATE tasks SET lock_until = ? WHERE id = ? AND lock_token = ? AND lock_until > ?",
        )
        .bind(now.saturating_add(ms(ttl)))
        .bind(key(lease.task_id))
        .bind(&lease.token)
        .bind(now)
        .execute(tx.c())
        .await
        .map_err(failure)?
        .rows_affected()
            > 0;
        super::queue::keep(tx.c(), delivery, self.shared.config.visibility_timeout).await?;
        let cancel: Option<Option<i64>> =
            sqlx::query_scalar("SELECT cancel_ms FROM tasks WHERE id = ?")
                .bind(key(lease.task_id))
                .fetch_optional(tx.c())
                .await
                .map_err(failure)?;
        tx.commit().await?;
        Ok(Heartbeat {
            lock_held: held,
            cancel_requested: timestamp(cancel.flatten()),
        })
    }

    async fn unlock(&self, lease: &Lease) -> Result<bool, BackendError> {
        let mut tx = self.begin().await?;
        let done = sqlx::query(
            "UPDATE tasks SET lock_token = NULL, lock_until = NULL \
              WHERE id = ? AND lock_token = ? AND lock_until > ?",
        )
        .bind(key(lease.task_id))
        .bind(&lease.token)
        .bind(now_ms())
        .execute(tx.c())
        .await
        .map_err(failure)?;
        tx.commit().await?;
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
        let at: Option<Option<i64>> =
            sqlx::query_scalar("SELECT cancel_ms FROM tasks WHERE id = ?")
                .bind(key(id))
                .fetch_optional(&mut self.read().await?.conn)
                .await
                .map_err(failure)?;
        Ok(timestamp(at.flatten()))
    }

    async fn cancellations(&self) -> Result<BoxStream<'static, TaskId>, BackendError> {
        // One process: every request is made here, and sent on the channel.
        Ok(crate::util::broadcast_stream(
            self.shared.cancels.subscribe(),
        ))
    }

    async fn wait_for_change(&self, id: TaskId, timeout: Duration) {
        let _ = id;
        let _ = tokio::time::timeout(timeout, self.shared.task_changed.notified()).await;
    }
}
