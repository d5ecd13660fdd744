//! Two steps sharing the budget `psp` with different sizes: the error is on the second.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct ChargeRequest {
    pub merchant_id: u64,
}

#[derive(Serialize, Deserialize)]
pub struct Charged;

pub struct Checkout;

#[saga(name = "checkout")]
impl Checkout {
    #[saga_step(1)]
    #[limit(concurrency = 10, name = "psp")]
    async fn charge(&self, req: ChargeRequest) -> Result<Charged, StepError> {
        let _ = req;
        Ok(Charged)
    }

    #[saga_step(2)]
    #[limit(concurrency = 5, name = "psp")]
    async fn capture(&self, charged: Charged) -> Result<Charged, StepError> {
        Ok(charged)
    }
}

fn main() {}
