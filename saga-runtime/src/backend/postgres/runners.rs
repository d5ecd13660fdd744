//! Which engines run what. One database holds everything together (row
//! locks settle races), so nothing is partitioned and every reader reads
//! every message; what an engine does need to know, to hand a message for a process
//! manager it does not run straight back during a rolling deploy, is
//! whether another engine runs it: a row per (process manager, engine)
//! with its expiry (`announce_processes` in
//! `migrations/0003_coordination.sql`).

use std::time::Duration;

use async_trait::async_trait;

use super::tasks::ms;
use super::{failure, PostgresBackend};
use crate::backend::{BackendError, Runners};

#[async_trait]
impl Runners for PostgresBackend {
    /// One statement: the member's rows renewed (or removed when it
    /// leaves), and the rows of engines whose announcements expired
    /// removed with them, so the table holds about one row per live engine
    /// and process manager however often engines restart.
    async fn announce_processes(
        &self,
        member: &str,
        names: &[&'static str],
        ttl: Option<Duration>,
    ) -> Result<(), BackendError> {
        if names.is_empty() {
            return Ok(());
        }
        run!(
            self,
            sqlx::query(sql!("SELECT {}($1, $2, $3)", self.q("announce_processes")))
                .bind(member)
                .bind(names)
                .bind(ttl.map(ms)),
            execute
        )
        .map_err(failure)?;
        Ok(())
    }

    /// The process managers' rows, under names no process manager can
    /// have (`saga:` holds a character their names may not).
    async fn announce_sagas(
        &self,
        member: &str,
        runs: &[String],
        ttl: Option<Duration>,
    ) -> Result<(), BackendError> {
        if runs.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = runs.iter().map(|run| format!("saga:{run}")).collect();
        run!(
            self,
            sqlx::query(sql!("SELECT {}($1, $2, $3)", self.q("announce_processes")))
                .bind(member)
                .bind(&names)
                .bind(ttl.map(ms)),
            execute
        )
        .map_err(failure)?;
        Ok(())
    }

    async fn saga_runner_alive(&self, run: &str) -> Result<bool, BackendError> {
        self.process_runner_alive(&format!("saga:{run}")).await
    }

    /// Each engine's announcement counts until its own expiry: an engine
    /// that announced briefly, or left, cuts no other's.
    async fn process_runner_alive(&self, name: &str) -> Result<bool, BackendError> {
        run!(
            self,
            sqlx::query_scalar(sql!(
                "SELECT EXISTS (SELECT 1 FROM {} WHERE process = $1 \
                 AND expires_at > clock_timestamp())",
                self.q("process_runners")
            ))
            .bind(name),
            fetch_one
        )
        .map_err(failure)
    }
}
