//! The work queue: one table of messages, each deliverable from its
//! `due_ms` (a delay, or the visibility deadline of the delivery holding
//! it), and the settling of deliveries.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::SqliteConnection;
use sqlx::Row;
use tokio::time::Instant;

use super::tasks::{key, push};
use super::{corrupt, failure, ms, now_ms, SqliteBackend, SqliteConfig};
use crate::backend::{
    truncate_payload, BackendError, Delivery, Handling, Interest, QueueMessage, QueueStats, Settle,
    WorkItem, WorkQueue,
};
use crate::model::task::TaskId;

/// The row and the receipt a delivery settles by (its id is
/// `row.receipt`): a delivery that was given up (its message delivered
/// again since) settles nothing.
fn located(delivery: &Delivery) -> Result<(i64, i64), BackendError> {
    delivery
        .id
        .split_once('.')
        .and_then(|(row, receipt)| Some((row.parse().ok()?, receipt.parse().ok()?)))
        .ok_or_else(|| corrupt(format!("`{}` is not a delivery of this store", delivery.id)))
}

/// Keeps `delivery` from being delivered again for `visibility`.
pub(super) async fn keep(
    c: &mut SqliteConnection,
    delivery: &Delivery,
    visibility: Duration,
) -> Result<(), BackendError> {
    let (row, receipt) = located(delivery)?;
    sqlx::query("UPDATE queue SET due_ms = ? WHERE id = ? AND receipt = ? AND taken = 1")
        .bind(now_ms().saturating_add(ms(visibility)))
        .bind(row)
        .bind(receipt)
        .execute(&mut *c)
        .await
        .map_err(failure)?;
    Ok(())
}

/// Removes `delivery`'s message from the queue; whether it was there.
async fn remove(c: &mut SqliteConnection, delivery: &Delivery) -> Result<bool, BackendError> {
    let (row, receipt) = located(delivery)?;
    let done = sqlx::query("DELETE FROM queue WHERE id = ? AND receipt = ? AND taken = 1")
        .bind(row)
        .bind(receipt)
        .execute(&mut *c)
        .await
        .map_err(failure)?;
    Ok(done.rows_affected() > 0)
}

/// Parks `raw` on the dead-letter queue with `reason`, cut to `limit`.
pub(super) async fn park_raw(
    c: &mut SqliteConnection,
    raw: &str,
    reason: &str,
    task: Option<TaskId>,
    limit: usize,
) -> Result<(), BackendError> {
    let (payload, truncated) = truncate_payload(raw, limit);
    sqlx::query(
        "INSERT INTO dead_letters (payload, reason, task_id, at_ms, truncated) \
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(payload)
    .bind(reason)
    .bind(task.map(key))
    .bind(now_ms())
    .bind(truncated.map(|n| i64::try_from(n).unwrap_or(i64::MAX)))
    .execute(&mut *c)
    .await
    .map_err(failure)?;
    Ok(())
}

/// Settles the message a task write handled.
pub(super) async fn settle(
    c: &mut SqliteConnection,
    settle: Settle<'_>,
    task: Option<TaskId>,
    config: &SqliteConfig,
) -> Result<(), BackendError> {
    match settle {
        Settle::Nothing => {}
        Settle::Ack(d) => {
            remove(c, d).await?;
        }
        Settle::DeadLetter(d, reason) => {
            remove(c, d).await?;
            park_raw(c, &d.raw, reason, task, config.dead_letter_payload_limit).await?;
        }
        Settle::ResolveDeadLetter(id) => {
            if let Some(row) = super::dead_letters::row_of(id) {
                sqlx::query("DELETE FROM dead_letters WHERE id = ?")
                    .bind(row)
                    .execute(&mut *c)
                    .await
                    .map_err(failure)?;
            }
        }
    }
    Ok(())
}

/// The kinds of message `interest` takes, as the query's two flags (an
/// entry that decodes as nothing is taken by every worker, which parks it).
const INTEREST: &str = "(kind = 2 OR (kind = 0 AND ?1) OR (kind = 1 AND ?2))";

impl SqliteBackend {
    /// Takes the first message due that `interest` takes, if any.
    async fn take(
        &self,
        consumer: &str,
        interest: Interest,
    ) -> Result<Result<Delivery, Option<i64>>, BackendError> {
        // A look first, on the connection: a poll that finds nothing due
        // writes nothing.
        let mut conn = self.conn().await?;
        let now = now_ms();
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT id, raw, deliveries FROM queue WHERE due_ms <= ?3 AND {INTEREST} \
              ORDER BY due_ms, id LIMIT 1"
        )))
        .bind(interest.sagas)
        .bind(interest.processes)
        .bind(now)
        .fetch_optional(&mut conn.conn)
        .await
        .map_err(failure)?;
        let Some(row) = row else {
            // When the next one is due, to sleep until then.
            let next: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT MIN(due_ms) FROM queue WHERE {INTEREST}"
            )))
            .bind(interest.sagas)
            .bind(interest.processes)
            .fetch_one(&mut conn.conn)
            .await
            .map_err(failure)?;
            return Ok(Err(next));
        };
        let mut tx = self.write_on(conn).await?;
        let id: i64 = row.try_get(0).map_err(corrupt)?;
        let raw: Vec<u8> = row.try_get(1).map_err(corrupt)?;
        let deliveries = row.try_get::<i64, _>(2).map_err(corrupt)? + 1;
        let visible_again = now.saturating_add(ms(self.shared.config.visibility_timeout));
        let receipt: i64 = sqlx::query_scalar(
            "UPDATE queue SET deliveries = ?, taken = 1, due_ms = ?, receipt = receipt + 1 \
              WHERE id = ? RETURNING receipt",
        )
        .bind(deliveries)
        .bind(visible_again)
        .bind(id)
        .fetch_one(tx.c())
        .await
        .map_err(failure)?;
        tx.commit().await?;
        Ok(Ok(Delivery {
            id: format!("{id}.{receipt}"),
            item: WorkItem::decode(&raw),
            raw: String::from_utf8_lossy(&raw).into_owned(),
            deliveries: u32::try_from(deliveries).unwrap_or(u32::MAX),
            consumer: consumer.to_owned(),
            lease: None,
            instance: None,
        }))
    }

    /// Hands `delivery`'s message back, due after `delay`; `answered`: its
    /// delivery does not count towards the cap.
    async fn hand_back(
        &self,
        delivery: &Delivery,
        delay: Duration,
        answered: bool,
    ) -> Result<(), BackendError> {
        let (row, receipt) = located(delivery)?;
        let due = now_ms().saturating_add(ms(delay));
        let mut tx = self.begin().await?;
        sqlx::query(
            "UPDATE queue SET taken = 0, due_ms = ?1, since_ms = ?1, \
                    deliveries = deliveries - ?2 \
              WHERE id = ?3 AND receipt = ?4 AND taken = 1",
        )
        .bind(due)
        .bind(i64::from(answered))
        .bind(row)
        .bind(receipt)
        .execute(tx.c())
        .await
        .map_err(failure)?;
        tx.commit().await?;
        self.queue_changed();
        Ok(())
    }
}

#[async_trait]
impl WorkQueue for SqliteBackend {
    fn visibility_timeout(&self) -> Duration {
        self.shared.config.visibility_timeout
    }

    async fn wake(&self, message: &QueueMessage) -> Result<bool, BackendError> {
        let raw = WorkItem::Saga(message.clone()).encode();
        let now = now_ms();
        let mut tx = self.begin().await?;
        let done = sqlx::query(
            "UPDATE queue SET due_ms = ?1, since_ms = ?1 WHERE id = \
               (SELECT id FROM queue WHERE raw = ?2 AND taken = 0 AND due_ms > ?1 \
                 ORDER BY id LIMIT 1)",
        )
        .bind(now)
        .bind(raw.as_bytes())
        .execute(tx.c())
        .await
        .map_err(failure)?;
        tx.commit().await?;
        let woken = done.rows_affected() > 0;
        if woken {
            self.queue_changed();
        }
        Ok(woken)
    }

    async fn enqueue(&self, items: &[WorkItem]) -> Result<(), BackendError> {
        let mut tx = self.begin().await?;
        for item in items {
            push(tx.c(), item.encode().as_bytes(), Duration::ZERO).await?;
        }
        tx.commit().await?;
        self.queue_changed();
        Ok(())
    }

    async fn enqueue_raw(&self, payload: &[u8]) -> Result<(), BackendError> {
        let mut tx = self.begin().await?;
        push(tx.c(), payload, Duration::ZERO).await?;
        tx.commit().await?;
        self.queue_changed();
        Ok(())
    }

    async fn receive(
        &self,
        consumer: &str,
        interest: Interest,
        wait: Duration,
    ) -> Result<Option<Delivery>, BackendError> {
        // Let other tasks run between takes, as a network store's I/O does.
        tokio::task::yield_now().await;
        let deadline = Instant::now() + wait;
        loop {
            // Register interest before looking, so a push between the look
            // and the wait is not missed.
            let notified = self.shared.queue_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next = match self.take(consumer, interest).await? {
                Ok(delivery) => return Ok(Some(delivery)),
                Err(next) => next,
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let wake = next.map_or(deadline, |due| {
                let after = Duration::from_millis(u64::try_from(due - now_ms()).unwrap_or(0));
                (now + after).min(deadline)
            });
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    async fn touch(&self, delivery: &Delivery) -> Result<(), BackendError> {
        let visibility = self.shared.config.visibility_timeout;
        let mut tx = self.begin().await?;
        keep(tx.c(), delivery, visibility).await?;
        tx.commit().await
    }

    async fn settle_delivery(
        &self,
        delivery: &Delivery,
        how: Handling<'_>,
    ) -> Result<(), BackendError> {
        match how {
            Handling::Ack => {
                let mut tx = self.begin().await?;
                remove(tx.c(), delivery).await?;
                tx.commit().await
            }
            Handling::Release(delay) => self.hand_back(delivery, delay, true).await,
            Handling::Defer(delay) => self.hand_back(delivery, delay, false).await,
            Handling::DeadLetter { reason, task } => {
                let limit = self.shared.config.dead_letter_payload_limit;
                let mut tx = self.begin().await?;
                remove(tx.c(), delivery).await?;
                park_raw(tx.c(), &delivery.raw, reason, task, limit).await?;
                tx.commit().await
            }
        }
    }

    async fn park(&self, payload: &str, reason: &str) -> Result<(), BackendError> {
        let limit = self.shared.config.dead_letter_payload_limit;
        let mut tx = self.begin().await?;
        park_raw(tx.c(), payload, reason, None, limit).await?;
        tx.commit().await
    }

    async fn release_due(&self, _limit: usize) -> Result<usize, BackendError> {
        // A delayed message is a row that becomes due: nothing to move.
        Ok(0)
    }

    async fn queue_stats(&self) -> Result<Option<QueueStats>, BackendError> {
        let now = now_ms();
        let rows: Vec<(i64, i64, i64)> = sqlx::query_as(
            "SELECT kind = 1, COUNT(*), MIN(since_ms) FROM queue \
              WHERE due_ms <= ? OR taken = 1 GROUP BY kind = 1",
        )
        .bind(now)
        .fetch_all(&mut self.read().await?.conn)
        .await
        .map_err(failure)?;
        let mut stats = QueueStats::default();
        for (process, depth, since) in rows {
            let backlog = match process {
                1 => &mut stats.processes,
                _ => &mut stats.sagas,
            };
            backlog.depth = u64::try_from(depth).unwrap_or(0);
            let age = u64::try_from(now.saturating_sub(since)).unwrap_or(0);
            backlog.oldest = Some(Duration::from_millis(age));
        }
        Ok(Some(stats))
    }
}
