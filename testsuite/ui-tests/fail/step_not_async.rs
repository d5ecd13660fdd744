//! A step that is not an `async fn`.
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
    #[saga_step(2)]
    fn pay(&self, uploaded: Uploaded) -> Result<Paid, StepError> {
        let _ = uploaded;
        Ok(Paid)
    }
}

fn main() {}
