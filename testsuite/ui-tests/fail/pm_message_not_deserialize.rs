//! A message that derives `Message` but not `Deserialize`: one error, on
//! the type.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize)]
pub struct OrderSubmitted {
    #[correlation_id]
    pub order_id: u64,
}

#[derive(Default, Serialize, Deserialize)]
pub struct FulfillmentState {
    pub submitted: bool,
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
        let _ = (msg, ctx);
        state.submitted = true;
        Ok(())
    }
}

fn main() {}
