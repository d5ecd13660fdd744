//! A state type without `Default`, in a process manager that is registered:
//! one error, on the state type, none where it is registered.
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
pub struct PaymentDue;

#[derive(Default, Serialize, Deserialize)]
pub struct FulfillmentState {
    pub order_number: String,
}

pub struct Fulfillment;

#[derive(Serialize, Deserialize)]
pub struct PlainState {
    pub order_number: String,
}

#[process_manager(state = PlainState)]
impl Fulfillment {
    #[starts]
    async fn submitted(
        &self,
        msg: OrderSubmitted,
        state: &mut PlainState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
}

fn main() {
    let _ = Engine::builder().process_manager(Fulfillment);
}
