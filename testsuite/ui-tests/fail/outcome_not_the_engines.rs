//! A compensation taking a type of the user's own named `Outcome`, with two
//! type arguments: read as the engine's `Outcome`, it is not.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct CreateZipRequest;
#[derive(Serialize, Deserialize)]
pub struct UploadResult;

mod mine {
    pub enum Outcome<A, B> {
        Left(A),
        Right(B),
    }
}
use mine::Outcome;

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
            Outcome::Left(_) | Outcome::Right(_) => Ok(()),
        }
    }
}

fn main() {}
