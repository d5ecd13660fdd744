//! `#[saga_step]` without its number.
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
    #[saga_step]
    async fn upload(&self, req: Request) -> Result<Uploaded, StepError> {
        let _ = req;
        Ok(Uploaded)
    }
}

fn main() {}
