#![allow(missing_docs)]
//! A batch process manager that fans its items out through a tally: shared
//! by the tally tests and the checker process they SIGKILL.

use std::time::Duration;

use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

/// Starts a batch of `items` items, `0..items`.
#[derive(Debug, Clone, Message, Serialize, Deserialize)]
pub struct BatchStarted {
    #[correlation_id]
    pub batch: String,
    pub items: u32,
    /// Seconds until the tally's deadline.
    #[serde(default)]
    pub deadline_secs: Option<u64>,
    /// Seconds between polls of the tally.
    #[serde(default)]
    pub poll_secs: Option<u64>,
}

/// Asks the batch to open its tally again (which must fail) or under a bad
/// name.
#[derive(Debug, Clone, Message, Serialize, Deserialize)]
pub struct Reopen {
    #[correlation_id]
    pub batch: String,
    pub name: String,
}

/// Stops (deletes) the batch.
#[derive(Debug, Clone, Message, Serialize, Deserialize)]
pub struct Abandon {
    #[correlation_id]
    pub batch: String,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct Batch {
    pub tally: Option<TallyRef>,
    pub completions: u32,
    pub late: bool,
    pub missing_at_deadline: Option<Vec<String>>,
    /// `(checked, total)` of each poll.
    pub polls: Vec<(u64, u64)>,
    pub poll_secs: Option<u64>,
}

pub struct Batches;

#[process_manager(name = "batches", state = Batch)]
impl Batches {
    #[starts]
    async fn started(
        &self,
        msg: BatchStarted,
        state: &mut Batch,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let tally = ctx.open_tally("items", (0..msg.items).map(|i| i.to_string()));
        let tally = match msg.deadline_secs {
            Some(secs) => tally.deadline(Duration::from_secs(secs)),
            None => tally,
        };
        state.tally = Some(tally.reference());
        if let Some(secs) = msg.poll_secs {
            ctx.poll_tally("items", Duration::from_secs(secs));
        }
        state.poll_secs = msg.poll_secs;
        Ok(())
    }

    #[handles]
    async fn reopen(
        &self,
        msg: Reopen,
        _state: &mut Batch,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = ctx.open_tally(&msg.name, ["x"]);
        Ok(())
    }

    #[handles]
    async fn abandon(
        &self,
        _msg: Abandon,
        _state: &mut Batch,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.stop();
        Ok(())
    }

    #[handles]
    async fn done(
        &self,
        msg: TallyCompleted,
        state: &mut Batch,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.completions += 1;
        state.late = msg.late;
        ctx.mark_complete();
        Ok(())
    }

    #[handles]
    async fn progress(
        &self,
        msg: TallyStatus,
        state: &mut Batch,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if msg.deadline {
            state.missing_at_deadline = Some(msg.missing);
        } else {
            state.polls.push((msg.checked, msg.total));
            if let (false, Some(secs)) = (msg.complete, state.poll_secs) {
                ctx.poll_tally(&msg.tally, Duration::from_secs(secs));
            }
        }
        Ok(())
    }
}
