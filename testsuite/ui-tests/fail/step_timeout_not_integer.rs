//! `timeout_ms` values that are not integer literals: one error per step.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request;
#[derive(Serialize, Deserialize)]
pub struct Uploaded;
#[derive(Serialize, Deserialize)]
pub struct Paid;

pub struct CreateZip;

pub const TIMEOUT_MS: u64 = 30_000;

#[saga]
impl CreateZip {
    #[saga_step(1, timeout_ms = "30s")]
    async fn upload(&self, req: Request) -> Result<Request, StepError> {
        Ok(req)
    }
    #[saga_step(2, timeout_ms = 1.5)]
    async fn pay(&self, req: Request) -> Result<Request, StepError> {
        Ok(req)
    }
    #[saga_step(3, timeout_ms = true)]
    async fn confirm(&self, req: Request) -> Result<Request, StepError> {
        Ok(req)
    }
    #[saga_step(4, timeout_ms = TIMEOUT_MS)]
    async fn notify(&self, req: Request) -> Result<Request, StepError> {
        Ok(req)
    }
}

fn main() {
    let _ = TIMEOUT_MS;
}
