//! Tallies.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryBackend;
use crate::backend::{BackendError, Tallies, WorkItem};
use crate::model::envelope::Envelope;
use crate::model::tally::{TallyCheck, TallyProgress, TallyRef, COMPLETED_TALLY_KEEP};

/// A tally (see [`Tallies`]), kept until `expires`.
pub(super) struct MemTally {
    pub(super) pending: HashSet<String>,
    pub(super) checked: HashSet<String>,
    pub(super) complete: bool,
    pub(super) deadline_passed: bool,
    pub(super) completion: Envelope,
    pub(super) completion_late: Envelope,
    pub(super) expires: Instant,
}

#[async_trait]
impl Tallies for MemoryBackend {
    async fn tally_check(&self, tally: &TallyRef, item: &str) -> Result<TallyCheck, BackendError> {
        let checked = {
            let mut state = self.state();
            let now = Instant::now();
            let Some(t) = state.tallies.get_mut(tally).filter(|t| t.expires > now) else {
                return Ok(TallyCheck::NoTally);
            };
            let late = t.deadline_passed;
            if !t.pending.remove(item) {
                return Ok(match t.checked.contains(item) {
                    true => TallyCheck::AlreadyChecked,
                    false => TallyCheck::UnknownItem,
                });
            }
            t.checked.insert(item.to_owned());
            if !t.pending.is_empty() {
                return Ok(TallyCheck::Counted {
                    remaining: t.pending.len() as u64,
                    late,
                });
            }
            t.complete = true;
            t.expires = t.expires.min(now + COMPLETED_TALLY_KEEP);
            let done = match late {
                true => t.completion_late.clone(),
                false => t.completion.clone(),
            };
            state.push_item(&WorkItem::Process(done), Duration::ZERO);
            TallyCheck::Completed { late }
        };
        self.queue_changed();
        Ok(checked)
    }

    async fn tally_progress(
        &self,
        tally: &TallyRef,
        missing: usize,
        mark_deadline: bool,
    ) -> Result<Option<TallyProgress>, BackendError> {
        let mut state = self.state();
        let now = Instant::now();
        let Some(t) = state.tallies.get_mut(tally).filter(|t| t.expires > now) else {
            return Ok(None);
        };
        if mark_deadline && !t.pending.is_empty() {
            t.deadline_passed = true;
        }
        Ok(Some(TallyProgress {
            total: (t.pending.len() + t.checked.len()) as u64,
            checked: t.checked.len() as u64,
            missing: t.pending.iter().take(missing).cloned().collect(),
            complete: t.complete,
            deadline_passed: t.deadline_passed,
        }))
    }
}
