//! A message type using the impl's generic parameter.
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
pub struct Envelope<T>(pub T);

pub struct Wrapper<T>(pub T);

#[process_manager(state = FulfillmentState)]
impl<T: Send + Sync + 'static> Wrapper<T> {
    #[starts]
    async fn submitted(
        &self,
        msg: Envelope<T>,
        state: &mut FulfillmentState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
}

fn main() {}
