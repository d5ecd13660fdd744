//! A broken saga used elsewhere: only the mistake is reported, not the missing `Saga` impl or reconciliation trait.
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
    #[saga_step(1)]
    async fn pay(&self, uploaded: Uploaded) -> Result<Paid, StepError> {
        let _ = uploaded;
        Ok(Paid)
    }
}

struct Recon;

impl CreateZipReconciliation for Recon {
    type Resource = String;
    type Key = String;
    async fn list_resources(&self) -> Result<Vec<String>, ReconcileError> {
        Ok(Vec::new())
    }
    fn resource_key(&self, resource: &String) -> String {
        resource.clone()
    }
    fn referenced_keys(&self, _: &CreateZipStepOutput) -> Vec<String> {
        Vec::new()
    }
    async fn handle_orphans(&self, _: Vec<String>) -> Result<(), ReconcileError> {
        Ok(())
    }
}

async fn start(engine: Engine) {
    let _ = engine.start::<CreateZip>(Request).await;
}

fn main() {}
