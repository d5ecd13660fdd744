//! A misspelled type in a step's output, used by the next step and by the
//! saga's definition: one error, where it is written.
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
    async fn upload(&self, req: Request) -> Result<Uplaoded, StepError> {
        let _ = req;
        Err(StepError::permanent("the upload failed"))
    }

    #[saga_step(2)]
    async fn pay(&self, uploaded: Uploaded) -> Result<Paid, StepError> {
        let _ = uploaded;
        Ok(Paid)
    }
}

fn main() {
    let _ = Engine::builder().saga(CreateZip);
}
