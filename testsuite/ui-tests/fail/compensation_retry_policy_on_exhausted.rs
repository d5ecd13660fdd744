//! `on_exhausted` in `#[compensation_retry_policy]`.
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
    #[compensation_retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 1000, on_exhausted = fail)]
    async fn upload(&self, req: Request) -> Result<Uploaded, StepError> {
        let _ = req;
        Ok(Uploaded)
    }
    #[compensate(upload)]
    async fn delete_upload(&self, uploaded: Uploaded) -> Result<(), StepError> {
        let _ = uploaded;
        Ok(())
    }
}

fn main() {}
