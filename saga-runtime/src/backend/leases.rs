//! Named leases (one timer poller or janitor at a time), and where
//! process-manager partitions are read.

use std::time::Duration;

use super::BackendError;
use async_trait::async_trait;

/// Named leases: one holder at a time (the timer poller, the janitor).
#[async_trait]
pub trait Leases: Send + Sync + 'static {
    /// Takes or renews the named lease `name` for `token`; `false` if
    /// someone else holds it.
    async fn named_lease(
        &self,
        name: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, BackendError>;

    /// Releases the named lease if `token` holds it.
    async fn release_named_lease(&self, name: &str, token: &str) -> Result<bool, BackendError>;

    /// Registers (or keeps) `member`, an engine that runs process managers,
    /// among the readers of process-manager messages for `ttl`, and returns
    /// the partitions it owns now, a bit each, for [`Interest`]: the
    /// backend balances them over its live members, each partition owned
    /// by one at a time, so that one writer handles the messages of an
    /// instance. `None`: this backend does not partition (every reader
    /// reads every message, and versioning alone settles races).
    async fn process_partitions(
        &self,
        member: &str,
        ttl: Duration,
    ) -> Result<Option<u64>, BackendError> {
        let _ = (member, ttl);
        Ok(None)
    }

    /// Lets go of `member`'s partitions at once (an engine shutting down),
    /// so that the others take them over without waiting for the TTL.
    async fn leave_process_partitions(&self, member: &str) -> Result<(), BackendError> {
        let _ = member;
        Ok(())
    }

    /// Records that `member` runs the process managers `names` for the
    /// next `ttl` (`None`: it stops running them now, shutting down), so
    /// that an engine handed a message for a process manager it does not
    /// run can tell whether another engine does
    /// ([`process_runner_alive`](Self::process_runner_alive)).
    async fn announce_processes(
        &self,
        member: &str,
        names: &[&'static str],
        ttl: Option<Duration>,
    ) -> Result<(), BackendError> {
        let _ = (member, names, ttl);
        Ok(())
    }

    /// Whether an engine that runs process manager `name` announced it
    /// within its TTL. `false` when the backend does not know (the
    /// default): the message then waits for one with growing delays.
    async fn process_runner_alive(&self, name: &str) -> Result<bool, BackendError> {
        let _ = name;
        Ok(false)
    }
}
