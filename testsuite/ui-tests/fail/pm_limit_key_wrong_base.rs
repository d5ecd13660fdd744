//! A handler's key starts with `msg` or the message parameter's name.
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
    #[limit(concurrency = 2, key = state.customer_id)]
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
