//! Counters of process-manager outcomes, per engine since it started
//! (with the `metrics` feature, mirrored as Prometheus metrics: see
//! `crate::metrics`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::process::Dispatched;

/// Counters of process-manager outcomes in this engine (like metrics: per
/// process, since start).
#[derive(Debug, Default)]
pub struct ProcessMetrics {
    /// Messages whose handler ran and whose result was saved.
    pub handled: AtomicU64,
    /// Continuing messages that matched no instance (once their hold was
    /// over, or not held).
    pub unmatched: AtomicU64,
    /// Continuing messages held for an instance that did not exist yet
    /// (each hold counts: a message held again after its instance went
    /// away counts twice).
    pub held: AtomicU64,
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
    /// Messages moved to the partition of their instance before they were
    /// handled (Redis Cluster keeps partitions apart: a message sent to
    /// an instance by a correlation value it holds besides its own, or
    /// published to another partition, takes one hop). Their handling is
    /// counted where they arrive.
    pub forwarded: AtomicU64,
}

impl ProcessMetrics {
    /// Counts a message's outcome, here and (feature `metrics`) as
    /// `saga_process_messages_total`.
    pub(crate) fn count(&self, process: &'static str, outcome: &Dispatched) {
        let (counter, label) = match outcome {
            Dispatched::Handled { .. } => (&self.handled, "handled"),
            Dispatched::Duplicate { .. } => (&self.duplicates, "duplicate"),
            Dispatched::Ignored { .. } => (&self.ignored, "ignored"),
            Dispatched::Unmatched { .. } => (&self.unmatched, "unmatched"),
            Dispatched::Held { .. } => (&self.held, "held"),
            Dispatched::Failed { .. } => (&self.failed, "failed"),
            Dispatched::DeadLettered { .. } => (&self.dead_lettered, "dead_lettered"),
            Dispatched::FannedOut { .. } => (&self.fanned_out, "fanned_out"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        crate::metrics::process_message(process, label);
    }

    /// Counts a message dead-lettered before dispatch (a poison message,
    /// one for a process manager no engine runs).
    pub(crate) fn count_dead_lettered(&self, process: &'static str) {
        self.dead_lettered.fetch_add(1, Ordering::Relaxed);
        crate::metrics::process_message(process, "dead_lettered");
    }

    /// Counts a handler run lost to a concurrent write.
    pub(crate) fn count_conflict(&self, process: &'static str) {
        self.conflicts.fetch_add(1, Ordering::Relaxed);
        crate::metrics::process_conflict(process);
    }

    /// Counts a message moved to its instance's partition before it was
    /// handled (a cluster keeps partitions apart).
    pub(crate) fn count_forwarded(&self, process: &'static str) {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
        crate::metrics::process_message(process, "forwarded");
    }

    /// Counts a message handled in another's write (its outcome is
    /// counted apart).
    pub(crate) fn count_batched(&self, process: &'static str) {
        self.batched.fetch_add(1, Ordering::Relaxed);
        crate::metrics::process_batched(process);
    }
}
