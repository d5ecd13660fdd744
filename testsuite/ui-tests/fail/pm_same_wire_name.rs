//! Two message types with one wire name in one process manager: messages are routed by `Message::TYPE`.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
#[message(name = "order")]
pub struct OrderSubmitted {
    #[correlation_id]
    pub order_id: u64,
}

#[derive(Message, Serialize, Deserialize)]
#[message(name = "order")]
pub struct OrderShipped {
    #[correlation_id]
    pub order_id: u64,
}

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

    #[handles]
    async fn shipped(
        &self,
        msg: OrderShipped,
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
