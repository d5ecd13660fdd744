//! A continuing handler without `#[correlate]` finds its instance by the
//! message's correlation id, but the message has none.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct OrderSubmitted {
    #[correlation_id]
    pub order_id: u64,
}

#[derive(Message, Serialize, Deserialize)]
pub struct PaymentCaptured {
    pub amount: u64,
}

#[derive(Default, Serialize, Deserialize)]
pub struct FulfillmentState {
    pub paid: bool,
}

pub struct Fulfillment;

#[process_manager(state = FulfillmentState)]
impl Fulfillment {
    #[starts]
    async fn submitted(
        &self,
        msg: OrderSubmitted,
        state: &mut FulfillmentState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }

    #[handles]
    async fn paid(
        &self,
        msg: PaymentCaptured,
        state: &mut FulfillmentState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, ctx);
        state.paid = true;
        Ok(())
    }
}

fn main() {}
