//! Step 2's input has the same name as step 1's output but is another type: rustc catches what the syntactic check cannot.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request;
#[derive(Serialize, Deserialize)]
pub struct Uploaded;
#[derive(Serialize, Deserialize)]
pub struct Paid;

pub struct CreateZip;

pub mod a {
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct Uploaded;
}

#[saga]
impl CreateZip {
    #[saga_step(1)]
    async fn upload(&self, req: Request) -> Result<a::Uploaded, StepError> {
        let _ = req;
        Ok(a::Uploaded)
    }
    #[saga_step(2)]
    async fn pay(&self, uploaded: Uploaded) -> Result<Paid, StepError> {
        let _ = uploaded;
        Ok(Paid)
    }
}

fn main() {}
