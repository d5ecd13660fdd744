//! Tallies: checked item by item, each check one atomic step.

use async_trait::async_trait;

use super::BackendError;
use crate::model::tally::{TallyCheck, TallyProgress, TallyRef};

/// Tallies ([`crate::process::tally`]): opened by a [`ProcessCommit`](super::ProcessCommit),
/// checked and read here. Every operation is one atomic step.
#[async_trait]
pub trait Tallies: Send + Sync + 'static {
    /// Checks `item` off: idempotent per item. The check of the last item
    /// enqueues the tally's completion envelope in the same atomic step,
    /// so it is sent exactly once.
    async fn tally_check(&self, tally: &TallyRef, item: &str) -> Result<TallyCheck, BackendError>;

    /// The tally's progress with at most `missing` unchecked items;
    /// `mark_deadline` records (first) that its deadline has passed, unless
    /// it is complete. `None` when it does not exist.
    async fn tally_progress(
        &self,
        tally: &TallyRef,
        missing: usize,
        mark_deadline: bool,
    ) -> Result<Option<TallyProgress>, BackendError>;
}
