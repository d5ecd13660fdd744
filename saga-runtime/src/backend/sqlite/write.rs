//! The SQLite interpreter of the write vocabulary (`backend/write.rs`):
//! in one `BEGIN IMMEDIATE` transaction, every guard read and checked,
//! then every effect applied as the statements it names. Each arm does
//! what its variant's documentation says and nothing else: what a write
//! does was decided before it got here.

use sqlx::Row;

use super::tasks::{append_audit, key, push, record};
use super::{corrupt, failure, ms, now_ms, SqliteBackend, Tx};
use crate::backend::write::{Answer, Applied, Effect, Guard, Write};
use crate::backend::{BackendError, TaskRefusal, WorkItem};
use crate::model::task::Timestamp;

/// What the guards read of the task's row.
struct Stored {
    fence: i64,
    version: i64,
    cancel_ms: Option<i64>,
}

impl SqliteBackend {
    /// Checks `write`'s guards and applies its effects, atomically, then
    /// wakes what waits on the queue or the task.
    pub(super) async fn interpret(&self, write: &Write<'_>) -> Result<Answer, BackendError> {
        let mut tx = self.begin().await?;
        let task = write.task;
        let row = sqlx::query("SELECT fence, version, cancel_ms FROM tasks WHERE id = ?")
            .bind(key(task.id))
            .fetch_optional(tx.c())
            .await
            .map_err(failure)?;
        let stored = match row {
            Some(row) => Some(Stored {
                fence: row.try_get(0).map_err(corrupt)?,
                version: row.try_get(1).map_err(corrupt)?,
                cancel_ms: row.try_get(2).map_err(corrupt)?,
            }),
            None => None,
        };
        if let Some(refusal) = write
            .guards
            .iter()
            .find_map(|g| refuses(write, stored.as_ref(), *g))
        {
            // Nothing was written: the transaction ends with nothing in it.
            tx.commit().await?;
            return Ok(Err(refusal));
        }
        let mut applied = Applied {
            version: task.version,
            claimed: false,
        };
        for effect in &write.effects {
            self.effect(&mut tx, write, effect, &mut applied).await?;
        }
        tx.commit().await?;
        if write
            .effects
            .iter()
            .any(|e| matches!(e, Effect::Enqueue(_) | Effect::Settle(_)))
        {
            self.queue_changed();
        }
        self.task_changed();
        Ok(Ok(applied))
    }

    /// Applies `effect` of `write`, recording what the reply carries in
    /// `applied`.
    async fn effect(
        &self,
        tx: &mut Tx,
        write: &Write<'_>,
        effect: &Effect<'_>,
        applied: &mut Applied,
    ) -> Result<(), BackendError> {
        let id = key(write.task.id);
        let now = now_ms();
        let config = &self.shared.config;
        match effect {
            Effect::Put { task, .. } => {
                let version = task.version + 1;
                sqlx::query("UPDATE tasks SET status = ?, version = ?, record = ? WHERE id = ?")
                    .bind(task.status.as_str())
                    .bind(i64::try_from(version).unwrap_or(i64::MAX))
                    .bind(record(task, version)?)
                    .bind(&id)
                    .execute(tx.c())
                    .await
                    .map_err(failure)?;
                append_audit(tx.c(), task.id, task.unstored_audit()).await?;
                applied.version = version;
            }
            Effect::Claim(claim) => {
                let done =
                    sqlx::query("INSERT OR IGNORE INTO claims (task_id, name) VALUES (?, ?)")
                        .bind(&id)
                        .bind(*claim)
                        .execute(tx.c())
                        .await
                        .map_err(failure)?;
                applied.claimed = done.rows_affected() > 0;
            }
            Effect::Renew { delivery, ttl } => {
                sqlx::query("UPDATE tasks SET lock_token = ?, lock_until = ? WHERE id = ?")
                    .bind(&write.lease.token)
                    .bind(now.saturating_add(ms(*ttl)))
                    .bind(&id)
                    .execute(tx.c())
                    .await
                    .map_err(failure)?;
                super::queue::keep(tx.c(), delivery, config.visibility_timeout).await?;
            }
            Effect::Enqueue(next) => {
                let raw = WorkItem::Saga(next.message.clone()).encode();
                push(tx.c(), raw.as_bytes(), next.delay).await?;
            }
            Effect::Settle(settle) => {
                super::queue::settle(tx.c(), *settle, Some(write.task.id), config).await?
            }
            Effect::Retain(after) => {
                sqlx::query("UPDATE tasks SET expires_ms = ? WHERE id = ?")
                    .bind(after.map(|after| now.saturating_add(ms(after))))
                    .bind(&id)
                    .execute(tx.c())
                    .await
                    .map_err(failure)?;
            }
            Effect::Unlock => {
                sqlx::query(
                    "UPDATE tasks SET lock_token = NULL, lock_until = NULL \
                      WHERE id = ? AND lock_token = ?",
                )
                .bind(&id)
                .bind(&write.lease.token)
                .execute(tx.c())
                .await
                .map_err(failure)?;
            }
            // Waiters are woken by every write of a task (`task_changed`).
            Effect::Announce => {}
        }
        Ok(())
    }
}

/// Why `guard` refuses `write`, given what the task's row holds.
fn refuses(write: &Write<'_>, stored: Option<&Stored>, guard: Guard) -> Option<TaskRefusal> {
    let (task, lease) = (write.task, write.lease);
    match guard {
        Guard::Fence => {
            let held = lease.task_id == task.id
                && stored.is_some_and(|s| u64::try_from(s.fence).ok() == Some(lease.fence));
            (!held).then_some(TaskRefusal::LockLost { fence: lease.fence })
        }
        Guard::Version => match stored.map(|s| u64::try_from(s.version).unwrap_or(0)) {
            None => Some(TaskRefusal::Missing),
            Some(actual) if actual != task.version => Some(TaskRefusal::Conflict {
                expected: task.version,
                actual,
            }),
            Some(_) => None,
        },
        Guard::NotCancelled => {
            stored
                .and_then(|s| s.cancel_ms)
                .map(|at| TaskRefusal::CancelRequested {
                    at: Timestamp(u64::try_from(at).unwrap_or(0)),
                })
        }
    }
}
