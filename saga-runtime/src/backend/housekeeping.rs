//! Retention: what keeps a backend's size bounded over a year of traffic.

use std::time::Duration;

use super::BackendError;
use async_trait::async_trait;

/// What [`Housekeeping::housekeep`] is asked to remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Dead letters older than this are removed (`None`: kept).
    pub dead_letters: Option<Duration>,
    /// At most this many dead letters are kept (per partition); older ones
    /// go first.
    pub dead_letters_max: usize,
    /// Consumers of the work queue that have held no message for this long
    /// are removed from their group (they belonged to workers that left).
    pub idle_consumers: Duration,
    /// At most this many expired tasks are removed per call.
    pub batch: usize,
}

/// What one [`Housekeeping::housekeep`] call removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Housekept {
    /// Expired tasks whose keys and index entries were removed.
    pub tasks: usize,
    /// Dead letters removed.
    pub dead_letters: usize,
    /// Idle consumers removed.
    pub consumers: usize,
    /// Tally completions sent here: each tally's last item was checked by
    /// a checker that stopped before sending it (a backend whose check is
    /// one atomic step never has any).
    pub tallies: usize,
    /// Messages for endpoints relayed here: a process-manager commit left
    /// them for an endpoint in another slot, and the process that made it
    /// stopped before relaying them (a backend that writes endpoints in
    /// the commit never has any).
    pub relayed: usize,
}

/// Retention: what keeps a backend's size bounded over a year of traffic.
#[async_trait]
pub trait Housekeeping: Send + Sync + 'static {
    /// Removes expired tasks (every key and index entry; their records
    /// expire on their own where the backend can), dead letters beyond
    /// `retention`, and consumers that left. Safe to call from several
    /// processes at once; the engine calls it under a named lease.
    async fn housekeep(&self, retention: &Retention) -> Result<Housekept, BackendError>;
}
