//! A key whose type has no `Display`: the runtime trait's message, on the key.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Customer {
    pub id: u64,
}

#[derive(Serialize, Deserialize)]
pub struct ChargeRequest {
    pub merchant_id: u64,
    pub customer: Customer,
}

#[derive(Serialize, Deserialize)]
pub struct Charged;

pub struct Checkout;

#[saga(name = "checkout")]
impl Checkout {
    #[saga_step(1)]
    #[limit(concurrency = 2, key = req.customer)]
    async fn charge(&self, req: ChargeRequest) -> Result<Charged, StepError> {
        let _ = req;
        Ok(Charged)
    }
}

fn main() {}
