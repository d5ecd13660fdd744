//! A broken process manager used elsewhere: only the mistake is reported.
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

#[process_manager(state = FulfillmentState)]
impl Fulfillment {
    #[handles]
    #[correlate(state.order_number = msg.order_number)]
    async fn reserved(
        &self,
        msg: InventoryReserved,
        state: &mut FulfillmentState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
}

fn assert_pm<P: ProcessManager>() {}

fn main() {
    assert_pm::<Fulfillment>();
    let _ = <Fulfillment as ProcessManager>::NAME;
}
