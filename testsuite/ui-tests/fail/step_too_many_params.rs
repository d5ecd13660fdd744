//! A step with two inputs.
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
    async fn upload(
        &self,
        req: Request,
        ctx: &StepContext,
        extra: u32,
    ) -> Result<Uploaded, StepError> {
        let _ = (req, ctx, extra);
        Ok(Uploaded)
    }
}

fn main() {}
