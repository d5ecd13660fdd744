//! `engine.cancel` of a process manager: its instances are not tasks; the error says how they stop.
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

async fn cancel(engine: &Engine, id: TaskId) {
    let _ = engine.cancel::<Fulfillment>(id).await;
}

fn main() {}
