//! A step whose second parameter is not the context.
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
    async fn upload(&self, req: Request, extra: u32) -> Result<Uploaded, StepError> {
        let _ = (req, extra);
        Ok(Uploaded)
    }
}

fn main() {}
