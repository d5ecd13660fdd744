//! The work queue: a table read with `FOR UPDATE SKIP LOCKED` (several
//! workers take different rows without waiting for each other), woken by
//! notifications, with a slow poll as the fallback.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use uuid::Uuid;

use super::settling::located;
use super::tasks::{ms, parse_task};
use super::{corrupt, failure, PostgresBackend};
use crate::backend::{
    truncate_payload, BackendError, Delivery, Handling, Interest, Lease, Locked, QueueBacklog,
    QueueMessage, QueueStats, TakenLease, TaskStore, WorkItem, WorkQueue,
};
use crate::model::task::{TaskId, Timestamp};

/// The queue kind of an entry: a saga message (0), a process-manager one
/// (1), or one that does not decode (2, for any worker to dead-letter).
pub(super) fn kind_of(item: &Result<WorkItem, String>) -> i16 {
    match item {
        Ok(item) => item_kind(item),
        Err(_) => 2,
    }
}

/// The queue kind of a decoded entry.
pub(super) fn item_kind(item: &WorkItem) -> i16 {
    match item {
        WorkItem::Saga(_) => 0,
        WorkItem::Process(_) => 1,
    }
}

/// A message as `enqueue` takes it.
pub(super) struct Put {
    kind: i16,
    payload: String,
    /// The task of a saga message: its row carries it, so that a read
    /// takes the task's lease without parsing the payload.
    task: Option<Uuid>,
}

impl Put {
    pub(super) fn of(item: &WorkItem) -> Put {
        Put {
            kind: item_kind(item),
            payload: item.encode(),
            task: match item {
                WorkItem::Saga(message) => Some(message.task_id.0),
                WorkItem::Process(_) => None,
            },
        }
    }

    /// An entry as it is, which may not decode.
    fn raw(payload: &[u8]) -> Put {
        let decoded = WorkItem::decode(payload);
        Put {
            kind: kind_of(&decoded),
            payload: String::from_utf8_lossy(payload).into_owned(),
            task: match decoded {
                Ok(WorkItem::Saga(message)) => Some(message.task_id.0),
                _ => None,
            },
        }
    }
}

/// The kinds a worker with `interest` takes.
fn kinds(interest: Interest) -> Vec<i16> {
    let mut kinds = vec![2];
    if interest.sagas {
        kinds.push(0);
    }
    if interest.processes {
        kinds.push(1);
    }
    kinds
}

impl PostgresBackend {
    /// Takes up to `max` visible messages of `kinds` at once, and the
    /// lease of each saga message's task with it (one call: the worker
    /// would ask for the lease next).
    async fn take(
        &self,
        consumer: &str,
        kinds: &[i16],
        max: usize,
    ) -> Result<Vec<Delivery>, BackendError> {
        let visibility = self.shared.config.visibility_timeout;
        let requested_at = tokio::time::Instant::now();
        let rows = run!(
            self,
            sqlx::query(sql!(
                "SELECT id, payload, deliveries, claim, lock_code, token, fence, record, cancel_ms \
                 FROM {}($1, $2, $3, $4)",
                self.q("take_leased")
            ))
            .bind(consumer)
            .bind(kinds)
            .bind(i32::try_from(max.max(1)).unwrap_or(i32::MAX))
            .bind(ms(visibility)),
            fetch_all
        )
        .map_err(failure)?;
        let mut deliveries = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: i64 = row.try_get(0).map_err(corrupt)?;
            let raw: String = row.try_get(1).map_err(corrupt)?;
            let deliveries_so_far: i32 = row.try_get(2).map_err(corrupt)?;
            let claim: Uuid = row.try_get(3).map_err(corrupt)?;
            let item = WorkItem::decode(raw.as_bytes());
            let lease = self.taken_lease(row, &item, requested_at, visibility).await;
            deliveries.push(Delivery {
                id: format!("{id}:{claim}"),
                item,
                raw,
                deliveries: u32::try_from(deliveries_so_far).unwrap_or(0),
                consumer: consumer.to_owned(),
                lease,
                instance: None,
            });
        }
        Ok(deliveries)
    }

    /// The lease `take_leased` took for a saga message's task, if it tried.
    /// One that cannot be used (a record this version cannot parse, as a
    /// newer version may write during a rolling deploy) is released at
    /// once and the delivery goes on without it: the worker meets the
    /// problem on its ordinary path and deals with that message alone.
    /// Failing the read instead would strand every message it had claimed
    /// until the visibility timeout, and take the bad one again and again.
    async fn taken_lease(
        &self,
        row: &sqlx::postgres::PgRow,
        item: &Result<WorkItem, String>,
        requested_at: tokio::time::Instant,
        ttl: Duration,
    ) -> Option<TakenLease> {
        let Ok(WorkItem::Saga(message)) = item else {
            return None;
        };
        match row.try_get::<Option<i32>, _>(4) {
            Ok(Some(-4)) => Some(TakenLease::Busy),
            Ok(Some(0)) => match self.held_lease(row, message.task_id, requested_at, ttl) {
                Ok(held) => Some(held),
                Err(error) => {
                    tracing::warn!(task_id = %message.task_id, %error, "the task taken with a message cannot be read; its lease is let go");
                    if let Ok(token) = row.try_get::<String, _>(5) {
                        let lease = Lease {
                            task_id: message.task_id,
                            token,
                            fence: 0,
                        };
                        if let Err(error) = self.unlock(&lease).await {
                            tracing::debug!(%error, "unlock failed; the lease expires on its own");
                        }
                    }
                    None
                }
            },
            _ => None,
        }
    }

    /// The lease (and task) of a row whose `lock_code` is 0.
    fn held_lease(
        &self,
        row: &sqlx::postgres::PgRow,
        task_id: TaskId,
        requested_at: tokio::time::Instant,
        ttl: Duration,
    ) -> Result<TakenLease, BackendError> {
        let token: String = row.try_get(5).map_err(corrupt)?;
        let fence: i64 = row.try_get(6).map_err(corrupt)?;
        let record: serde_json::Value = row.try_get(7).map_err(corrupt)?;
        let cancel: Option<i64> = row.try_get(8).map_err(corrupt)?;
        let task = parse_task(record)?;
        self.shared.steps.loaded(&task);
        Ok(TakenLease::Held {
            locked: Box::new(Locked {
                lease: Lease {
                    task_id,
                    token,
                    fence: u64::try_from(fence).unwrap_or(0),
                },
                task: Some(task),
                cancel_requested: cancel.map(|c| Timestamp(u64::try_from(c).unwrap_or(0))),
            }),
            requested_at,
            ttl,
        })
    }

    /// How long until the next message of `kinds` becomes visible.
    async fn next_visible(&self, kinds: &[i16]) -> Result<Option<Duration>, BackendError> {
        let ms: Option<f64> = run!(
            self,
            sqlx::query_scalar(sql!("SELECT {}($1)", self.q("next_visible"))).bind(kinds),
            fetch_one
        )
        .map_err(failure)?;
        Ok(ms.map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0)))
    }

    /// Hands a delivery back, visible after `delay`.
    async fn hand_back(
        &self,
        delivery: &Delivery,
        delay: Duration,
        answered: bool,
    ) -> Result<(), BackendError> {
        let (row, claim) = located(delivery)?;
        let handed = run!(
            self,
            sqlx::query(sql!("SELECT {}($1, $2, $3, $4)", self.q("hand_back")))
                .bind(row)
                .bind(claim)
                .bind(ms(delay))
                .bind(answered),
            execute
        );
        self.shared.waker.work();
        handed.map_err(failure)?;
        Ok(())
    }

    /// Enqueues `messages` in one statement.
    pub(super) async fn enqueue_rows(&self, messages: Vec<Put>) -> Result<(), BackendError> {
        let mut session = self.session().await.map_err(failure)?;
        self.enqueue_rows_on(session.conn(), messages).await?;
        session.done().await.map_err(failure)
    }

    /// The same on `executor` (the pool, or a caller's transaction).
    pub(super) async fn enqueue_rows_on<'e, E>(
        &self,
        executor: E,
        messages: Vec<Put>,
    ) -> Result<(), BackendError>
    where
        E: sqlx::Executor<'e, Database = sqlx::Postgres>,
    {
        if messages.is_empty() {
            return Ok(());
        }
        let mut kinds = Vec::with_capacity(messages.len());
        let mut texts = Vec::with_capacity(messages.len());
        let mut tasks = Vec::with_capacity(messages.len());
        for m in messages {
            kinds.push(m.kind);
            texts.push(m.payload);
            tasks.push(m.task);
        }
        sqlx::query(sql!(
            "SELECT {}(k, p, 0, 0, t) FROM unnest($1::smallint[], $2::text[], $3::uuid[]) AS e(k, p, t)",
            self.q("enqueue")
        ))
        .bind(kinds)
        .bind(texts)
        .bind(tasks)
        .execute(executor)
        .await
        .map_err(failure)?;
        Ok(())
    }
}

#[async_trait]
impl WorkQueue for PostgresBackend {
    fn visibility_timeout(&self) -> Duration {
        self.shared.config.visibility_timeout
    }

    async fn enqueue(&self, items: &[WorkItem]) -> Result<(), BackendError> {
        self.enqueue_rows(items.iter().map(Put::of).collect()).await
    }

    async fn enqueue_raw(&self, payload: &[u8]) -> Result<(), BackendError> {
        self.enqueue_rows(vec![Put::raw(payload)]).await
    }

    async fn receive(
        &self,
        consumer: &str,
        interest: Interest,
        wait: Duration,
    ) -> Result<Option<Delivery>, BackendError> {
        Ok(self
            .receive_many(consumer, interest, wait, 1, 0)
            .await?
            .into_iter()
            .next())
    }

    async fn receive_many(
        &self,
        consumer: &str,
        interest: Interest,
        wait: Duration,
        max: usize,
        _in_flight: usize,
    ) -> Result<Vec<Delivery>, BackendError> {
        let kinds = kinds(interest);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before looking, so a notification between the
            // look and the wait is not missed.
            let woken = self.shared.signals.work.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let taken = self.take(consumer, &kinds, max).await?;
            let now = tokio::time::Instant::now();
            if !taken.is_empty() || now >= deadline {
                return Ok(taken);
            }
            // A delayed message (a retry's backoff) or an expired delivery
            // becomes visible without a notification: sleep until the next
            // one does. While notifications are down, look again at the
            // poll interval as well.
            let mut until = deadline;
            if let Some(next) = self.next_visible(&kinds).await? {
                until = until.min(now + next);
            }
            if !self.shared.signals.listening.load(Ordering::SeqCst) {
                until = until.min(now + self.shared.config.poll_interval);
            }
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    async fn touch(&self, delivery: &Delivery) -> Result<(), BackendError> {
        let (row, claim) = located(delivery)?;
        run!(
            self,
            sqlx::query(sql!(
                "UPDATE {} SET visible_at = clock_timestamp() + $3 * interval '1 millisecond' \
             WHERE id = $1 AND claim = $2",
                self.q("queue")
            ))
            .bind(row)
            .bind(claim)
            .bind(ms(self.shared.config.visibility_timeout)),
            execute
        )
        .map_err(failure)?;
        Ok(())
    }

    async fn settle_delivery(
        &self,
        delivery: &Delivery,
        how: Handling<'_>,
    ) -> Result<(), BackendError> {
        match how {
            Handling::Ack => {
                let (row, claim) = located(delivery)?;
                run!(
                    self,
                    sqlx::query(sql!(
                        "DELETE FROM {} WHERE id = $1 AND claim = $2",
                        self.q("queue")
                    ))
                    .bind(row)
                    .bind(claim),
                    execute
                )
                .map_err(failure)?;
                Ok(())
            }
            Handling::Release(delay) => self.hand_back(delivery, delay, true).await,
            Handling::Defer(delay) => self.hand_back(delivery, delay, false).await,
            Handling::DeadLetter {
                reason,
                task: task_id,
            } => {
                let (row, claim) = located(delivery)?;
                let limit = self.shared.config.dead_letter_payload_limit;
                let (payload, size) = truncate_payload(&delivery.raw, limit);
                run!(
                    self,
                    sqlx::query(sql!(
                        "SELECT {}('dead', $1, $2, $3, $4, $5, $6, NULL)",
                        self.q("settle")
                    ))
                    .bind(row)
                    .bind(claim)
                    .bind(payload)
                    .bind(reason)
                    .bind(size.map(|s| i64::try_from(s).unwrap_or(i64::MAX)))
                    .bind(task_id.map(|t| t.0)),
                    execute
                )
                .map_err(failure)?;
                Ok(())
            }
        }
    }

    async fn park(&self, payload: &str, reason: &str) -> Result<(), BackendError> {
        let limit = self.shared.config.dead_letter_payload_limit;
        let (payload, size) = truncate_payload(payload, limit);
        run!(
            self,
            sqlx::query(sql!(
                "SELECT {}('dead', NULL, NULL, $1, $2, $3, NULL, NULL)",
                self.q("settle")
            ))
            .bind(payload)
            .bind(reason)
            .bind(size.map(|s| i64::try_from(s).unwrap_or(i64::MAX))),
            execute
        )
        .map_err(failure)?;
        Ok(())
    }

    async fn wake(&self, message: &QueueMessage) -> Result<bool, BackendError> {
        let payload = WorkItem::Saga(message.clone()).encode();
        let woken: bool = run!(
            self,
            sqlx::query_scalar(sql!("SELECT {}($1, $2)", self.q("wake_delayed")))
                .bind(message.task_id.0)
                .bind(payload),
            fetch_one
        )
        .map_err(failure)?;
        if woken {
            // Readers sleep until the next delayed message is due: the one
            // woken was it, or later.
            self.shared.waker.work();
        }
        Ok(woken)
    }

    async fn release_due(&self, _limit: usize) -> Result<usize, BackendError> {
        // A delayed message is a row that becomes visible by itself.
        Ok(0)
    }

    async fn queue_stats(&self) -> Result<Option<QueueStats>, BackendError> {
        let rows = run!(
            self,
            sqlx::query(sql!(
                "SELECT kind = 1, count(*), \
                    extract(epoch FROM clock_timestamp() - min(enqueued_at))::float8 \
             FROM {} WHERE consumer IS NOT NULL OR visible_at <= clock_timestamp() \
             GROUP BY kind = 1",
                self.q("queue")
            )),
            fetch_all
        )
        .map_err(failure)?;
        let mut stats = QueueStats::default();
        for row in rows {
            let process: bool = row.try_get(0).map_err(corrupt)?;
            let count: i64 = row.try_get(1).map_err(corrupt)?;
            let age: Option<f64> = row.try_get(2).map_err(corrupt)?;
            let backlog = QueueBacklog {
                depth: u64::try_from(count).unwrap_or(0),
                oldest: age.map(|s| Duration::from_secs_f64(s.max(0.0))),
            };
            match process {
                true => stats.processes = backlog,
                false => stats.sagas = backlog,
            }
        }
        Ok(Some(stats))
    }
}
