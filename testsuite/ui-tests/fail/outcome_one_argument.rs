//! `Outcome` with only the step's output: it also needs the step's input,
//! which is what an attempt whose outcome was lost is undone from.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct CreateZipRequest;
#[derive(Serialize, Deserialize)]
pub struct UploadResult;

pub struct CreateZip;

#[saga]
impl CreateZip {
    #[saga_step(1)]
    async fn upload(&self, req: CreateZipRequest) -> Result<UploadResult, StepError> {
        let _ = req;
        Ok(UploadResult)
    }

    #[compensate(upload)]
    async fn delete_upload(&self, out: Outcome<UploadResult>) -> Result<(), StepError> {
        match out {
            Outcome::Completed(_) | Outcome::Unknown(_) => Ok(()),
        }
    }
}

fn main() {}
