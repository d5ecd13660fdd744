//! `rate = 0`: no attempt could ever start.
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
    #[limit(rate = 0, per = "1s")]
    async fn charge(&self, req: ChargeRequest) -> Result<Charged, StepError> {
        let _ = req;
        Ok(Charged)
    }
}

fn main() {}
