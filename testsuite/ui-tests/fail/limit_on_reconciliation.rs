//! `#[limit]` on a method of the generated reconciliation trait: it is not a step.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request {
    pub name: String,
}

#[derive(Serialize, Deserialize)]
pub struct Uploaded {
    pub key: String,
}

pub struct Upload;

#[saga]
impl Upload {
    #[saga_step(1)]
    async fn upload(&self, req: Request) -> Result<Uploaded, StepError> {
        Ok(Uploaded { key: req.name })
    }
}

pub struct Bucket;

impl UploadReconciliation for Bucket {
    type Resource = String;
    type Key = String;

    #[limit(concurrency = 1)]
    async fn list_resources(&self) -> Result<Vec<String>, ReconcileError> {
        Ok(Vec::new())
    }

    fn resource_key(&self, resource: &String) -> String {
        resource.clone()
    }

    fn referenced_keys(&self, output: &UploadStepOutput) -> Vec<String> {
        match output {
            UploadStepOutput::Upload(uploaded) => vec![uploaded.key.clone()],
        }
    }

    async fn handle_orphans(&self, orphans: Vec<String>) -> Result<(), ReconcileError> {
        let _ = orphans;
        Ok(())
    }
}

fn main() {}
