//! A `Vec` state field correlated with a single message field: one error, on the message's field, saying what a correlation needs (not rustc's "mismatched types").
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

#[derive(Default, Serialize, Deserialize)]
pub struct FulfillmentState {
    pub order_number: String,
}

pub struct Fulfillment;
#[derive(Default, Serialize, Deserialize)]
pub struct BatchState {
    pub order_numbers: Vec<String>,
}
pub struct Batch;
#[process_manager(state = BatchState)]
impl Batch {
    #[starts]
    async fn submitted(&self, msg: OrderSubmitted, state: &mut BatchState, ctx: &mut ProcessContext) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
    #[handles]
    #[correlate(state.order_numbers = msg.order_number)]
    async fn reserved(&self, msg: InventoryReserved, state: &mut BatchState, ctx: &mut ProcessContext) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
}
fn main() {}
