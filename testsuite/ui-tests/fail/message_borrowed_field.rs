//! A message with a borrowed field: the errors are on the field, the first saying to use an owned type.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};
#[derive(Message, Serialize, Deserialize)]
pub struct OrderSubmitted {
    #[correlation_id]
    pub order_id: u64,
    pub order_number: &'static str,
}
#[derive(Default, Serialize, Deserialize)]
pub struct FulfillmentState { pub n: u32 }
pub struct Fulfillment;
#[process_manager(state = FulfillmentState)]
impl Fulfillment {
    #[starts]
    async fn submitted(&self, msg: OrderSubmitted, state: &mut FulfillmentState, ctx: &mut ProcessContext) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
}
fn main() {}
