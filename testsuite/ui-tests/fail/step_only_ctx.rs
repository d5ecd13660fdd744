//! A step whose only parameter is the context.
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
    async fn upload(&self, ctx: &StepContext) -> Result<Uploaded, StepError> {
        let _ = ctx;
        Ok(Uploaded)
    }
}

fn main() {}
