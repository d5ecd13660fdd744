//! The `undo-pay` saga, shared by the lost-outcome scenarios
//! (tests/scenarios/outcomes.rs) and the `undo-worker` process (the same
//! definition in both, so that either runs the other's tasks). What its
//! bodies do is pushed, in order, onto the Redis list [`LOG`] (a Redis of
//! its own, whatever the store): the payment provider's books.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::AsyncCommands;
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

/// What the bodies did, in order.
pub const LOG: &str = "undo-pay:log";
/// Where a process whose `charge` hangs says it has charged (its pid).
pub const CHARGED: &str = "undo-pay:charged";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Order {
    pub id: u32,
    pub cents: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Charge {
    pub id: String,
}

pub struct UndoPay {
    pub recorder: ConnectionManager,
    /// `charge` takes the money, says so on [`CHARGED`], then never
    /// returns: the process is to be killed there.
    pub hang_after_charge: bool,
    /// `charge` declines at once (nothing taken).
    pub decline: bool,
}

impl UndoPay {
    async fn log(&self, line: String) -> Result<(), StepError> {
        let mut recorder = self.recorder.clone();
        let _: () = recorder
            .rpush(LOG, line)
            .await
            .map_err(|e| StepError::transient(e.to_string()))?;
        Ok(())
    }
}

#[saga(name = "undo-pay")]
#[cancellable]
impl UndoPay {
    #[saga_step(1)]
    async fn reserve(&self, order: Order) -> Result<Order, StepError> {
        Ok(order)
    }

    #[compensate(reserve)]
    async fn release(&self, order: Order) -> Result<(), StepError> {
        self.log(format!("released {}", order.id)).await
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 1, backoff = constant, base_delay_ms = 0)]
    async fn charge(&self, order: Order, ctx: &StepContext) -> Result<Charge, StepError> {
        if self.decline {
            return Err(StepError::permanent("card declined"));
        }
        let key = ctx.idempotency_key();
        self.log(format!("charged {} under {key}", order.cents))
            .await?;
        if self.hang_after_charge {
            let mut recorder = self.recorder.clone();
            let _: () = recorder
                .rpush(CHARGED, std::process::id())
                .await
                .map_err(|e| StepError::transient(e.to_string()))?;
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Ok(Charge {
            id: format!("ch_{}", order.id),
        })
    }

    #[compensate(charge)]
    async fn refund(
        &self,
        out: Outcome<Charge, Order>,
        ctx: &StepContext,
    ) -> Result<(), StepError> {
        match out {
            Outcome::Completed(charge) => self.log(format!("refunded {}", charge.id)).await,
            Outcome::Unknown(order) => {
                let key = ctx.step_idempotency_key();
                let line = format!(
                    "refunded whatever {key} took, for order {} of {}",
                    order.id, order.cents
                );
                self.log(line).await
            }
        }
    }
}
