//! Counters of process-manager outcomes, per engine since it started.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Dispatched;

/// Counters of process-manager outcomes in this engine (like metrics: per
/// process, since start).
#[derive(Debug, Default)]
pub struct ProcessMetrics {
    /// Messages whose handler ran and whose result was saved.
    pub handled: AtomicU64,
    /// Continuing messages that matched no instance.
    pub unmatched: AtomicU64,
    /// Exact duplicates dropped.
    pub duplicates: AtomicU64,
    /// Messages ignored because the instance was complete, stopped or gone.
    pub ignored: AtomicU64,
    /// Handler failures (each `#[on_error]` decision).
    pub failed: AtomicU64,
    /// Messages dead-lettered.
    pub dead_lettered: AtomicU64,
    /// Messages handed to each of the instances sharing their value
    /// (`#[handles(many)]`).
    pub fanned_out: AtomicU64,
    /// Handler runs thrown away because another writer saved the instance
    /// first (each re-run counts): what the single writer per partition
    /// keeps near zero.
    pub conflicts: AtomicU64,
    /// Messages handled in the write of another message of their instance
    /// (counted in `handled` too): one save for several waiting messages.
    pub batched: AtomicU64,
}

impl ProcessMetrics {
    pub(crate) fn count(&self, outcome: &Dispatched) {
        let counter = match outcome {
            Dispatched::Handled { .. } => &self.handled,
            Dispatched::Duplicate { .. } => &self.duplicates,
            Dispatched::Ignored { .. } => &self.ignored,
            Dispatched::Unmatched { .. } => &self.unmatched,
            Dispatched::Failed { .. } => &self.failed,
            Dispatched::DeadLettered { .. } => &self.dead_lettered,
            Dispatched::FannedOut { .. } => &self.fanned_out,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_dead_lettered(&self) {
        self.dead_lettered.fetch_add(1, Ordering::Relaxed);
    }
}
