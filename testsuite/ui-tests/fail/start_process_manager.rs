//! `engine.start` of a process manager: one error, saying it is started by its `#[starts]` message.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct OrderSubmitted {
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
}

async fn start(engine: &Engine) {
    let _ = engine.start::<Fulfillment>(OrderSubmitted { order_id: 1 }).await;
}

fn main() {}
