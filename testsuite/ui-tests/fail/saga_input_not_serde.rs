//! A saga input that is not stored-able: one error, on step 1's parameter.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

pub struct Request;
#[derive(Serialize, Deserialize)]
pub struct Uploaded;

pub struct CreateZip;

#[saga]
impl CreateZip {
    #[saga_step(1)]
    async fn upload(&self, req: Request) -> Result<Uploaded, StepError> {
        let _ = req;
        Ok(Uploaded)
    }
}

async fn start(engine: &Engine) {
    let _ = engine.start::<CreateZip>(Request).await;
}

fn main() {
    let _ = start;
}
