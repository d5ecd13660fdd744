//! A misspelled setting: one error, with a suggestion (and no "needs concurrency or rate" on top).
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
    #[limit(concurency = 5)]
    async fn charge(&self, req: ChargeRequest) -> Result<Charged, StepError> {
        let _ = req;
        Ok(Charged)
    }
}

fn main() {}
