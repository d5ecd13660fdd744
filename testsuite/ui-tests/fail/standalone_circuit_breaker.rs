//! `#[circuit_breaker]` in an impl without `#[saga]`; the other helpers on the method are not reported again.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request;
#[derive(Serialize, Deserialize)]
pub struct Uploaded;
#[derive(Serialize, Deserialize)]
pub struct Paid;

pub struct CreateZip;

impl CreateZip {
    #[circuit_breaker(failure_threshold = 5, duration_secs = 30)]
    #[retry_policy(max_retries = 3, backoff = exponential, base_delay_ms = 200)]
    async fn upload(&self, req: Request) -> Result<Uploaded, StepError> {
        let _ = req;
        Ok(Uploaded)
    }
}

fn main() {}
