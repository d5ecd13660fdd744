//! A compensation that takes `Outcome` and handles only `Completed`: the
//! compiler's exhaustiveness check says what else it must undo.
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
    async fn delete_upload(&self, out: Outcome<UploadResult, CreateZipRequest>) -> Result<(), StepError> {
        match out {
            Outcome::Completed(_uploaded) => Ok(()),
        }
    }
}

fn main() {}
