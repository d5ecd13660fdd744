//! Endpoints (`migrations/0002_process.sql`): an endpoint's messages are
//! rows numbered in commit order (`seq`, taken from the endpoint's row,
//! see the migration), capped at [`PostgresConfig::endpoint_max_len`] as
//! they are written. A consumer group is a row with the last `seq` it was
//! given, and a row per delivery not settled yet (consumer, delivery
//! count, since): a message held longer than the claim time is taken over
//! by the next consumer that asks, wherever it stands. Taking, settling
//! and trimming are one function call each; an idle reader sleeps until a
//! notification of a write or until a held message can be taken over
//! (looking again at the poll interval only while notifications are down).
//!
//! Consumers are not registered: what one holds is in its group's pending
//! rows under its name, and one that holds nothing leaves no trace. So
//! leaving a group, and removing consumers that went idle, have nothing
//! to remove (what a consumer that left held stays, for another to take
//! over).
//!
//! [`PostgresConfig::endpoint_max_len`]: super::PostgresConfig::endpoint_max_len

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::tasks::ms;
use super::{corrupt, failure, PostgresBackend};
use crate::backend::{truncate_payload, BackendError, DeadLetter, EndpointDelivery, Endpoints};
use crate::model::task::Timestamp;

/// Dead letters an endpoint keeps at most (older ones go first), as the
/// memory backend.
const ENDPOINT_DEAD_CAP: i64 = 10_000;

/// A message's `seq` from its delivery id.
fn seq(id: &str) -> Result<i64, BackendError> {
    id.parse().map_err(|_| {
        corrupt(format!(
            "`{id}` is not an endpoint message id of this backend"
        ))
    })
}

/// What one look for a message found.
enum Taken {
    /// A delivery.
    Delivery(EndpointDelivery),
    /// Nothing now; a held message becomes idle enough to take over in
    /// this long, if any is held.
    Nothing(Option<Duration>),
}

impl PostgresBackend {
    /// One look (`endpoint_take`): a stale delivery taken over, else the
    /// group's next message.
    async fn endpoint_take(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
        claim_idle: Duration,
    ) -> Result<Taken, BackendError> {
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT seq, envelope, deliveries, wake_ms FROM {}($1, $2, $3, $4)",
                self.q("endpoint_take")
            ))
            .bind(endpoint)
            .bind(group)
            .bind(consumer)
            .bind(ms(claim_idle)),
            fetch_one
        )
        .map_err(failure)?;
        let seq: Option<i64> = row.try_get(0).map_err(corrupt)?;
        let Some(seq) = seq else {
            let wake: Option<i64> = row.try_get(3).map_err(corrupt)?;
            let wake = wake.map(|w| Duration::from_millis(u64::try_from(w).unwrap_or(0)));
            return Ok(Taken::Nothing(wake));
        };
        let raw: Option<String> = row.try_get(1).map_err(corrupt)?;
        let deliveries: Option<i32> = row.try_get(2).map_err(corrupt)?;
        Ok(Taken::Delivery(EndpointDelivery {
            id: seq.to_string(),
            raw: raw.unwrap_or_default(),
            deliveries: deliveries.and_then(|d| u32::try_from(d).ok()).unwrap_or(1),
        }))
    }
}

/// A dead letter from a row of `(id, payload, reason, at_ms, size)`.
fn letter(row: &PgRow) -> Result<DeadLetter, BackendError> {
    let id: i64 = row.try_get(0).map_err(corrupt)?;
    let at: i64 = row.try_get(3).map_err(corrupt)?;
    let size: Option<i64> = row.try_get(4).map_err(corrupt)?;
    Ok(DeadLetter {
        id: id.to_string(),
        payload: row.try_get(1).map_err(corrupt)?,
        reason: row.try_get(2).map_err(corrupt)?,
        task_id: None,
        at: Timestamp(u64::try_from(at).unwrap_or(0)),
        truncated: size.and_then(|s| usize::try_from(s).ok()),
    })
}

#[async_trait]
impl Endpoints for PostgresBackend {
    async fn endpoint_receive(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
        claim_idle: Duration,
        block: Duration,
    ) -> Result<Option<EndpointDelivery>, BackendError> {
        let deadline = tokio::time::Instant::now() + block;
        loop {
            // Registered before looking, so a write between the look and
            // the wait is not missed.
            let woken = self.shared.signals.endpoints.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let wake = match self
                .endpoint_take(endpoint, group, consumer, claim_idle)
                .await?
            {
                Taken::Delivery(delivery) => return Ok(Some(delivery)),
                Taken::Nothing(wake) => wake,
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            // A held message becomes claimable without a notification:
            // sleep until it does. While notifications are down, look again
            // at the poll interval as well.
            let mut until = deadline;
            if let Some(wake) = wake {
                until = until.min(now + wake);
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

    async fn endpoint_touch(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
        id: &str,
    ) -> Result<(), BackendError> {
        let seq = seq(id)?;
        run!(
            self,
            sqlx::query(sql!(
                "UPDATE {} SET consumer = $4, since = clock_timestamp() \
             WHERE endpoint = $1 AND grp = $2 AND seq = $3",
                self.q("endpoint_pending")
            ))
            .bind(endpoint)
            .bind(group)
            .bind(seq)
            .bind(consumer),
            execute
        )
        .map_err(failure)?;
        Ok(())
    }

    async fn endpoint_settle(
        &self,
        endpoint: &str,
        group: &str,
        delivery: &EndpointDelivery,
        dead: Option<&str>,
    ) -> Result<(), BackendError> {
        let limit = self.shared.config.dead_letter_payload_limit;
        let (payload, size) = truncate_payload(&delivery.raw, limit);
        let seq = seq(&delivery.id)?;
        run!(
            self,
            sqlx::query(sql!(
                "SELECT {}($1, $2, $3, $4, $5, $6, $7, $8)",
                self.q("endpoint_settle")
            ))
            .bind(endpoint)
            .bind(group)
            .bind(seq)
            .bind(dead.is_some())
            .bind(payload)
            .bind(dead.unwrap_or_default())
            .bind(size.map(|s| i64::try_from(s).unwrap_or(i64::MAX)))
            .bind(ENDPOINT_DEAD_CAP),
            execute
        )
        .map_err(failure)?;
        Ok(())
    }

    /// Consumers that went idle hold nothing here (see the module's
    /// docs): only messages go.
    async fn endpoint_trim(
        &self,
        endpoint: &str,
        _idle_consumers: Duration,
    ) -> Result<usize, BackendError> {
        let gone: i32 = run!(
            self,
            sqlx::query_scalar(sql!("SELECT {}($1)", self.q("endpoint_trim"))).bind(endpoint),
            fetch_one
        )
        .map_err(failure)?;
        Ok(usize::try_from(gone).unwrap_or(0))
    }

    /// Nothing to do (see the module's docs): a consumer that holds no
    /// message has no row, and what one holds stays for another.
    async fn endpoint_leave(
        &self,
        _endpoint: &str,
        _group: &str,
        _consumer: &str,
    ) -> Result<(), BackendError> {
        Ok(())
    }

    async fn endpoint_dead_letters(&self, endpoint: &str) -> Result<Vec<DeadLetter>, BackendError> {
        let rows = run!(
            self,
            sqlx::query(sql!(
                "SELECT id, payload, reason, at_ms, size FROM {} WHERE endpoint = $1 ORDER BY id",
                self.q("endpoint_dead_letters")
            ))
            .bind(endpoint),
            fetch_all
        )
        .map_err(failure)?;
        rows.iter().map(letter).collect()
    }

    async fn endpoint_messages(&self, endpoint: &str) -> Result<Vec<String>, BackendError> {
        run!(
            self,
            sqlx::query_scalar(sql!(
                "SELECT envelope FROM {} WHERE endpoint = $1 ORDER BY seq",
                self.q("endpoint_messages")
            ))
            .bind(endpoint),
            fetch_all
        )
        .map_err(failure)
    }
}
