//! A compensation is not limited: a refund must not wait behind new charges.
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
    async fn charge(&self, req: ChargeRequest) -> Result<Charged, StepError> {
        let _ = req;
        Ok(Charged)
    }

    #[compensate(charge)]
    #[limit(concurrency = 1)]
    async fn refund(&self, charged: Charged) -> Result<(), StepError> {
        let _ = charged;
        Ok(())
    }
}

fn main() {}
