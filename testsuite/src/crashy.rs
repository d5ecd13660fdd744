#![allow(missing_docs)]
//! A process manager whose handler aborts the whole process on one input
//! (as a crash in native code would): for the test that a neighbour's
//! crash loop costs the other messages nothing, run by the chaos worker
//! (`PROCESS=1`, `PM_POISON=<n>`).

use std::time::Duration;

use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

/// Starts instance `id`, whose handler works `work_ms` and then records
/// `n` (or aborts the process, if `n` is the poison).
#[derive(Debug, Clone, Message, Serialize, Deserialize)]
pub struct Job {
    #[correlation_id]
    pub id: String,
    pub n: u64,
    pub work_ms: u64,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobState {
    pub applied: Option<u64>,
}

pub struct Crashy {
    pub poison: Option<u64>,
}

#[process_manager(name = "crashy", state = JobState)]
impl Crashy {
    #[starts]
    async fn job(
        &self,
        msg: Job,
        state: &mut JobState,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if self.poison == Some(msg.n) {
            std::process::abort();
        }
        tokio::time::sleep(Duration::from_millis(msg.work_ms)).await;
        state.applied = Some(msg.n);
        Ok(())
    }
}
