//! `#[compensate]` in an impl without `#[saga]`.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request;
#[derive(Serialize, Deserialize)]
pub struct Uploaded;
#[derive(Serialize, Deserialize)]
pub struct Paid;

pub struct CreateZip;

impl CreateZip {
    #[compensate(upload)]
    async fn delete_upload(&self, uploaded: Uploaded) -> Result<(), StepError> {
        let _ = uploaded;
        Ok(())
    }
}

fn main() {}
