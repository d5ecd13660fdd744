//! The same attribute twice on one step.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request;
#[derive(Serialize, Deserialize)]
pub struct Uploaded;
#[derive(Serialize, Deserialize)]
pub struct Paid;

pub struct CreateZip;

#[saga]
impl CreateZip {
    #[saga_step(1)]
    #[retry_policy(max_retries = 3, backoff = exponential, base_delay_ms = 200)]
    #[retry_policy(max_retries = 4, backoff = exponential, base_delay_ms = 200)]
    async fn upload(&self, req: Request) -> Result<Uploaded, StepError> {
        let _ = req;
        Ok(Uploaded)
    }
}

fn main() {}
