//! `#[limit]` below `#[saga]` on the impl block: the same error as above it.
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
#[limit(rate = 100)]
impl Checkout {
    #[saga_step(1)]
    async fn charge(&self, req: ChargeRequest) -> Result<Charged, StepError> {
        let _ = req;
        Ok(Charged)
    }
}

fn main() {
    let _ = Engine::builder().saga(Checkout);
}
