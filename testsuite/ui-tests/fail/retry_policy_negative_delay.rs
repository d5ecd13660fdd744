//! A negative delay.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request;

pub struct CreateZip;

#[saga]
impl CreateZip {
    #[saga_step(1)]
    #[retry_policy(max_retries = 3, backoff = constant, base_delay_ms = -5)]
    async fn upload(&self, req: Request) -> Result<Request, StepError> {
        Ok(req)
    }
}

fn main() {}
