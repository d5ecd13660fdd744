//! `#[process_manager]` on a trait impl.
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

pub trait Named {
    fn name(&self) -> &'static str;
}

#[process_manager(state = FulfillmentState)]
impl Named for Fulfillment {
    fn name(&self) -> &'static str {
        "f"
    }
}

fn main() {}
