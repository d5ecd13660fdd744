//! `#[limit]` on the saga's impl block: limits go on steps, there is no saga-wide one.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct ChargeRequest {
    pub merchant_id: u64,
}

#[derive(Serialize, Deserialize)]
pub struct Charged;

pub struct Checkout;

#[limit(concurrency = 10)]
#[saga(name = "checkout")]
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
