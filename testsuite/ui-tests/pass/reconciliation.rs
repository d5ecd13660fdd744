//! A user implementing the generated `{Saga}Reconciliation` trait with plain
//! `async fn`s, and running it.
use std::collections::HashSet;
use std::sync::Mutex;

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

    #[saga_step(2)]
    async fn publish(&self, uploaded: Uploaded) -> Result<String, StepError> {
        Ok(uploaded.key)
    }
}

pub struct Bucket {
    pub objects: Vec<String>,
    pub deleted: Mutex<HashSet<String>>,
}

impl UploadReconciliation for Bucket {
    type Resource = String;
    type Key = String;

    async fn list_resources(&self) -> Result<Vec<String>, ReconcileError> {
        Ok(self.objects.clone())
    }

    fn resource_key(&self, resource: &String) -> String {
        resource.clone()
    }

    fn referenced_keys(&self, output: &UploadStepOutput) -> Vec<String> {
        match output {
            UploadStepOutput::Upload(uploaded) => vec![uploaded.key.clone()],
            UploadStepOutput::Publish(_) => Vec::new(),
        }
    }

    async fn handle_orphans(&self, orphans: Vec<String>) -> Result<(), ReconcileError> {
        self.deleted.lock().unwrap().extend(orphans);
        Ok(())
    }
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let bucket = Bucket {
        objects: vec!["a".into(), "b".into()],
        deleted: Mutex::new(HashSet::new()),
    };
    let engine = Engine::builder().saga(Upload).build().await.unwrap();
    let scan = bucket.reconcile_once(&engine);
    assert_send(&scan);
    let report = scan.await.unwrap();
    // No task is live, so every object is an orphan.
    assert_eq!(report.resources, 2);
    assert_eq!(report.orphans, 2);
    assert_eq!(bucket.deleted.lock().unwrap().len(), 2);
    assert_eq!(
        bucket.interval(),
        std::time::Duration::from_secs(6 * 60 * 60)
    );

    let decoded = UploadStepOutput::__decode(1, serde_json::json!({ "key": "a" })).unwrap();
    assert!(matches!(decoded, UploadStepOutput::Upload(u) if u.key == "a"));
    assert!(UploadStepOutput::__decode(3, serde_json::json!(null)).is_err());

    let shutdown = saga_runtime::__private::CancellationToken::new();
    shutdown.cancel();
    bucket.run(engine, shutdown).await;
}
