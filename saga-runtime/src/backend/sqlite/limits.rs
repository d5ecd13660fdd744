//! Flow-control limits for the engines of this process: each `(limit,
//! key)` is the limit machine's state (`limit/machine.rs`) in a row, read,
//! decided and written back in one write transaction, on this host's
//! clock. A key goes once idle, and housekeeping sweeps the ones that ran
//! out.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use sqlx::sqlite::SqliteConnection;

use super::{corrupt, failure, SqliteBackend};
use crate::backend::{Acquired, BackendError, LimitRequest, LimitUsage, Limits, Released};
use crate::limit::machine::{LimitState, Moment};
use crate::limit::LimitConfig;

/// This host's time on the machine's clock (since the Unix epoch).
fn moment() -> Moment {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// The `key` column of a limit's key: '' unkeyed, '=' and the value keyed,
/// so that a keyed use whose value is empty stays apart from the unkeyed.
fn column(key: Option<&str>) -> String {
    key.map_or_else(String::new, |k| format!("={k}"))
}

impl SqliteBackend {
    /// Runs `f` on the limit's state in one write transaction, writing it
    /// back (or dropping it once idle).
    async fn with_limit<T>(
        &self,
        limit: &str,
        key: Option<&str>,
        f: impl FnOnce(&mut LimitState, Moment) -> T,
    ) -> Result<T, BackendError> {
        let key = column(key);
        let mut tx = self.begin().await?;
        let stored: Option<String> =
            sqlx::query_scalar("SELECT state FROM limits WHERE name = ? AND key = ?")
                .bind(limit)
                .bind(&key)
                .fetch_optional(tx.c())
                .await
                .map_err(failure)?;
        let mut state: LimitState = match &stored {
            Some(text) => serde_json::from_str(text).map_err(corrupt)?,
            None => LimitState::default(),
        };
        let now = moment();
        let out = f(&mut state, now);
        if state.is_idle(now) {
            if stored.is_some() {
                sqlx::query("DELETE FROM limits WHERE name = ? AND key = ?")
                    .bind(limit)
                    .bind(&key)
                    .execute(tx.c())
                    .await
                    .map_err(failure)?;
            }
        } else {
            // A read (usage, a renewal that found nothing) writes nothing.
            let text = serde_json::to_string(&state).map_err(corrupt)?;
            if stored.as_deref() != Some(text.as_str()) {
                sqlx::query("INSERT OR REPLACE INTO limits (name, key, state) VALUES (?, ?, ?)")
                    .bind(limit)
                    .bind(&key)
                    .bind(text)
                    .execute(tx.c())
                    .await
                    .map_err(failure)?;
            }
        }
        tx.commit().await?;
        Ok(out)
    }
}

/// Drops the limits whose every slot, waiter and booking ran out (a key
/// whose holders died and that nobody asked for since); how many.
pub(super) async fn sweep(c: &mut SqliteConnection) -> Result<usize, BackendError> {
    let rows: Vec<(String, String, String)> = sqlx::query_as("SELECT name, key, state FROM limits")
        .fetch_all(&mut *c)
        .await
        .map_err(failure)?;
    let now = moment();
    let mut dropped = 0;
    for (name, key, text) in rows {
        let mut state: LimitState = serde_json::from_str(&text).map_err(corrupt)?;
        state.prune(now);
        if state.is_idle(now) {
            sqlx::query("DELETE FROM limits WHERE name = ? AND key = ?")
                .bind(name)
                .bind(key)
                .execute(&mut *c)
                .await
                .map_err(failure)?;
            dropped += 1;
        }
    }
    Ok(dropped)
}

#[async_trait]
impl Limits for SqliteBackend {
    async fn limit_acquire(&self, request: &LimitRequest<'_>) -> Result<Acquired, BackendError> {
        self.with_limit(request.limit, request.key, |l, now| l.acquire(request, now))
            .await
    }

    async fn limit_release(
        &self,
        limit: &str,
        key: Option<&str>,
        holder: &str,
        config: LimitConfig,
    ) -> Result<Released, BackendError> {
        self.with_limit(limit, key, |l, now| l.release(holder, config, now))
            .await
    }

    async fn limit_leave(
        &self,
        limit: &str,
        key: Option<&str>,
        waiter: &str,
        config: LimitConfig,
    ) -> Result<Released, BackendError> {
        self.with_limit(limit, key, |l, now| l.leave(waiter, config, now))
            .await
    }

    async fn limit_renew(
        &self,
        limit: &str,
        key: Option<&str>,
        holder: &str,
        hold_for: Duration,
    ) -> Result<bool, BackendError> {
        self.with_limit(limit, key, |l, now| l.renew(holder, hold_for, now))
            .await
    }

    async fn limit_usage(
        &self,
        limit: &str,
        key: Option<&str>,
        _config: LimitConfig,
    ) -> Result<LimitUsage, BackendError> {
        self.with_limit(limit, key, |l, now| l.usage(now)).await
    }
}
