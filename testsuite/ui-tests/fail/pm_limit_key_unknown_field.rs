//! A handler's key naming a field the message lacks: rustc's error, on that field.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct OrderSubmitted {
    #[correlation_id]
    pub order_id: u64,
    pub customer_id: String,
}

#[derive(Default, Serialize, Deserialize)]
pub struct OrderState;

pub struct Fulfillment;

#[process_manager(state = OrderState)]
impl Fulfillment {
    #[starts]
    #[limit(concurrency = 2, key = msg.customer)]
    async fn submitted(
        &self,
        msg: OrderSubmitted,
        state: &mut OrderState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
}

fn main() {}
