//! `#[limit]` on a method of a process manager that is not a handler.
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
    async fn submitted(
        &self,
        msg: OrderSubmitted,
        state: &mut OrderState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }

    #[limit(concurrency = 1)]
    fn helper(&self) {}
}

fn main() {}
