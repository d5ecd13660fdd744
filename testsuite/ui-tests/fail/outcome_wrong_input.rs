//! `Outcome`'s second type argument is not the input of the step the
//! compensation undoes.
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
    async fn delete_upload(&self, out: Outcome<UploadResult, UploadResult>) -> Result<(), StepError> {
        let _ = out;
        Ok(())
    }
}

fn main() {}
