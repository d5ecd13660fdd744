//! The compiler, not the spelling, decides whether step N's input is step
//! N-1's output: aliases, paths and re-exports of one type all chain.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request;

pub mod model {
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct Uploaded;
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct Paid;
}
use model::Uploaded;

type Up = Uploaded;
type Receipt = Vec<String>;

pub struct CreateZip;

#[saga]
impl CreateZip {
    #[saga_step(1)]
    async fn upload(&self, _req: Request) -> Result<Uploaded, StepError> {
        Ok(Uploaded)
    }

    #[compensate(upload)]
    async fn delete_upload(&self, _uploaded: Up) -> Result<(), StepError> {
        Ok(())
    }

    #[saga_step(2)]
    async fn pay(&self, _uploaded: Up) -> Result<crate::model::Paid, StepError> {
        Ok(model::Paid)
    }

    #[saga_step(3)]
    async fn notify(&self, _paid: self::model::Paid) -> Result<Receipt, StepError> {
        Ok(Vec::new())
    }

    #[saga_step(4)]
    async fn archive(&self, receipt: std::vec::Vec<String>) -> Result<Vec<String>, StepError> {
        Ok(receipt)
    }
}

fn main() {
    let steps = CreateZip::definition().steps;
    assert_eq!(steps.len(), 4);
    assert_eq!(steps[0].compensation.as_ref().map(|c| c.name), Some("delete_upload"));
}
