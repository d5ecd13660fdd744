//! A process manager that is not `Sync`: one error, where it is registered (not at the impl, nor "future cannot be sent" per handler).
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

pub struct Fulfillment {
    pub seen: std::cell::Cell<u32>,
}
#[process_manager(state = FulfillmentState)]
impl Fulfillment {
    #[starts]
    async fn submitted(&self, msg: OrderSubmitted, state: &mut FulfillmentState, ctx: &mut ProcessContext) -> Result<(), ProcessError> {
        self.seen.set(self.seen.get() + 1);
        let _ = (msg, state, ctx);
        Ok(())
    }
}

fn main() {
    let _ = Engine::builder().process_manager(Fulfillment { seen: Default::default() });
}
