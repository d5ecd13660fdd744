//! `#[compensate(x)]` naming a method that is not a step.
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
    async fn upload(&self, req: Request) -> Result<Uploaded, StepError> {
        let _ = req;
        Ok(Uploaded)
    }
    #[compensate(helper)]
    async fn delete_upload(&self, uploaded: Uploaded) -> Result<(), StepError> {
        let _ = uploaded;
        Ok(())
    }
    fn helper(&self) {}
}

fn main() {}
