//! Step types can't use the impl's type parameters.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request;
#[derive(Serialize, Deserialize)]
pub struct Uploaded;
#[derive(Serialize, Deserialize)]
pub struct Paid;

pub struct CreateZip;

pub struct Generic<T>(T);

#[saga]
impl<T: Send + Sync + 'static> Generic<T> {
    #[saga_step(1)]
    async fn upload(&self, req: Vec<T>) -> Result<Uploaded, StepError> {
        let _ = req;
        Ok(Uploaded)
    }
}

fn main() {}
