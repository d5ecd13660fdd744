//! `#[limit]` in an impl without `#[saga]`; the other helpers on the method are not reported again.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct ChargeRequest {
    pub merchant_id: u64,
}

#[derive(Serialize, Deserialize)]
pub struct Charged;

pub struct Checkout;

impl Checkout {
    #[limit(concurrency = 10)]
    #[saga_step(1)]
    async fn charge(&self, req: ChargeRequest) -> Result<Charged, StepError> {
        let _ = req;
        Ok(Charged)
    }
}

fn main() {}
