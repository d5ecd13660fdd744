//! A process-manager name that would alias another's keys.
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

#[derive(Message, Serialize, Deserialize)]
pub struct Shipped;

#[process_manager(name = "acct:x", state = FulfillmentState)]
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

    #[timeout]
    async fn shipped(
        &self,
        msg: Shipped,
        state: &mut FulfillmentState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
}

fn main() {}
