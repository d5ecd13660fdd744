//! A `#[correlate]` naming a private state field, used by several handlers: one error, at its first mention.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct OrderSubmitted {
    #[correlation_id]
    pub order_id: u64,
    pub order_number: String,
}
#[derive(Message, Serialize, Deserialize)]
pub struct InventoryReserved {
    pub order_number: String,
}
#[derive(Message, Serialize, Deserialize)]
pub struct PaymentReceived {
    pub order_number: String,
}

mod state {
    use serde::{Deserialize, Serialize};
    #[derive(Default, Serialize, Deserialize)]
    pub struct FulfillmentState {
        order_number: String,
    }
}
use state::FulfillmentState;

pub struct Fulfillment;

#[process_manager(state = FulfillmentState)]
impl Fulfillment {
    #[starts]
    async fn submitted(&self, msg: OrderSubmitted, state: &mut FulfillmentState, ctx: &mut ProcessContext) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
    #[handles]
    #[correlate(state.order_number = msg.order_number)]
    async fn reserved(&self, msg: InventoryReserved, state: &mut FulfillmentState, ctx: &mut ProcessContext) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
    #[handles]
    #[correlate(state.order_number = msg.order_number)]
    async fn paid(&self, msg: PaymentReceived, state: &mut FulfillmentState, ctx: &mut ProcessContext) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
}

fn main() {}
