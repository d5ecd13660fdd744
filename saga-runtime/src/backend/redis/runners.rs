//! Which engines run what, on Redis: a sorted set per process manager
//! (and per saga version, under a name no process manager can have) of
//! the engines that announced it, scored by expiry (`announce.lua`,
//! `runners.lua`).

use std::time::Duration;

use async_trait::async_trait;

use super::{ms, scripts as s, RedisBackend};
use crate::backend::{BackendError, Runners};

#[async_trait]
impl Runners for RedisBackend {
    async fn announce_processes(
        &self,
        member: &str,
        names: &[&'static str],
        ttl: Option<Duration>,
    ) -> Result<(), BackendError> {
        if names.is_empty() {
            return Ok(());
        }
        self.call(&s::Announce {
            runner_sets: names
                .iter()
                .map(|name| self.keys().process_runners(name))
                .collect(),
            member,
            ttl_ms: ttl.map(ms),
        })
        .await
    }

    async fn process_runner_alive(&self, name: &str) -> Result<bool, BackendError> {
        let runners = self
            .call(&s::Runners {
                runners: self.keys().process_runners(name),
            })
            .await?;
        Ok(runners > 0)
    }

    /// The process managers' runner sets and scripts, under names no
    /// process manager can have (`saga:` holds a character their names
    /// may not).
    async fn announce_sagas(
        &self,
        member: &str,
        runs: &[String],
        ttl: Option<Duration>,
    ) -> Result<(), BackendError> {
        if runs.is_empty() {
            return Ok(());
        }
        self.call(&s::Announce {
            runner_sets: runs
                .iter()
                .map(|run| self.keys().process_runners(&format!("saga:{run}")))
                .collect(),
            member,
            ttl_ms: ttl.map(ms),
        })
        .await
    }

    async fn saga_runner_alive(&self, run: &str) -> Result<bool, BackendError> {
        let runners = self
            .call(&s::Runners {
                runners: self.keys().process_runners(&format!("saga:{run}")),
            })
            .await?;
        Ok(runners > 0)
    }
}
