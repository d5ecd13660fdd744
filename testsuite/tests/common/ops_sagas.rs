//! The sagas and process manager the operator tests (HTTP API, faults,
//! traces, sagactl) share: tasks that end each way an operator meets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

/// Completes with its input plus one.
pub struct Fine;

#[saga(name = "fine")]
impl Fine {
    #[saga_step(1)]
    async fn call(&self, n: u32) -> Result<u32, StepError> {
        Ok(n + 1)
    }
}

/// Its second step fails and the first one's compensation fails too:
/// ends `CompensationFailed`.
pub struct Stuck;

#[saga(name = "stuck")]
impl Stuck {
    #[saga_step(1)]
    #[compensation_retry_policy(max_retries = 0, backoff = constant, base_delay_ms = 0)]
    async fn reserve(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[compensate(reserve)]
    async fn release(&self, _n: u32) -> Result<(), StepError> {
        Err(StepError::permanent("the warehouse API refuses"))
    }

    #[saga_step(2)]
    async fn charge(&self, _n: u32) -> Result<u32, StepError> {
        Err(StepError::permanent("card declined"))
    }
}

/// Parks its task on the dead-letter queue, always.
pub struct Parked;

#[saga(name = "parked")]
impl Parked {
    #[saga_step(1)]
    #[retry_policy(max_retries = 0, backoff = constant, base_delay_ms = 0, on_exhausted = dead_letter)]
    async fn call(&self, _n: u32) -> Result<u32, StepError> {
        Err(StepError::permanent("upstream down"))
    }
}

/// Parks its task on the dead-letter queue while `open` is false.
pub struct Gate {
    pub open: Arc<AtomicBool>,
}

#[saga(name = "gate")]
impl Gate {
    #[saga_step(1)]
    #[retry_policy(max_retries = 0, backoff = constant, base_delay_ms = 0, on_exhausted = dead_letter)]
    async fn pass(&self, n: u32) -> Result<u32, StepError> {
        match self.open.load(Ordering::SeqCst) {
            true => Ok(n),
            false => Err(StepError::permanent("gate closed")),
        }
    }
}

#[derive(Message, Serialize, Deserialize)]
pub struct Remind {
    pub id: u64,
}

#[derive(Message, Serialize, Deserialize)]
pub struct Nudge;

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Reminder {
    pub id: u64,
}

/// Starts an instance per id that waits an hour for its nudge.
pub struct Reminders;

#[process_manager(name = "reminders", state = Reminder)]
impl Reminders {
    #[starts]
    #[correlate(state.id = msg.id)]
    async fn remind(
        &self,
        _msg: Remind,
        _state: &mut Reminder,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.request_timeout(Duration::from_secs(3600), Nudge);
        Ok(())
    }

    #[timeout]
    async fn nudge(
        &self,
        _t: Nudge,
        _state: &mut Reminder,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.mark_complete();
        Ok(())
    }
}

/// Holds its task `Running` in step 2 until it is cancelled.
pub struct Hold;

#[cancellable]
#[saga(name = "hold")]
impl Hold {
    #[saga_step(1)]
    async fn reserve(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[compensate(reserve)]
    async fn release(&self, _n: u32) -> Result<(), StepError> {
        Ok(())
    }

    #[saga_step(2)]
    async fn wait(&self, n: u32, ctx: &StepContext) -> Result<u32, StepError> {
        tokio::select! {
            _ = ctx.cancelled() => Err(StepError::permanent("cancelled while waiting")),
            _ = tokio::time::sleep(Duration::from_secs(600)) => Ok(n),
        }
    }
}
