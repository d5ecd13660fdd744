//! Two handlers for one message type, one naming it through a `type` alias: the compiler sees they are one type.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct OrderSubmitted {
    #[correlation_id]
    pub order_id: u64,
}

pub type Submitted = OrderSubmitted;

#[derive(Default, Serialize, Deserialize)]
pub struct FulfillmentState;

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

    #[starts]
    async fn resubmitted(
        &self,
        msg: Submitted,
        state: &mut FulfillmentState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
}

fn main() {
    let _ = Engine::builder().process_manager(Fulfillment);
}
