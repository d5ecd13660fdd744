//! A fractional version: versions are whole numbers.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request;

pub struct CreateZip;

#[saga(name = "create-zip", version = 1.5)]
impl CreateZip {
    #[saga_step(1)]
    async fn upload(&self, req: Request) -> Result<Request, StepError> {
        Ok(req)
    }
}

fn main() {
    let _ = Engine::builder().saga(CreateZip);
}
