//! Reconciliation: the generated `{Saga}Reconciliation` trait hands the user
//! exactly the resources that no live task references.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use saga_runtime::__private::CancellationToken;
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Upload {
    key: String,
}

/// A fake bucket: keys of stored objects.
type Bucket = Arc<Mutex<BTreeSet<String>>>;

struct Archive {
    bucket: Bucket,
}

#[saga(name = "archive")]
impl Archive {
    #[saga_step(1)]
    async fn upload(&self, name: String) -> Result<Upload, StepError> {
        let key = format!("archive/{name}");
        self.bucket.lock().unwrap().insert(key.clone());
        Ok(Upload { key })
    }

    #[compensate(upload)]
    async fn delete(&self, upload: Upload) -> Result<(), StepError> {
        if upload.key.contains("sticky") {
            return Err(StepError::permanent("access denied"));
        }
        self.bucket.lock().unwrap().remove(&upload.key);
        Ok(())
    }

    #[saga_step(2)]
    async fn publish(&self, upload: Upload) -> Result<String, StepError> {
        if upload.key.contains("bad") || upload.key.contains("sticky") {
            return Err(StepError::permanent("rejected"));
        }
        Ok(format!("https://cdn/{}", upload.key))
    }
}

/// The user's half of the Generation Gap.
struct Cleaner {
    bucket: Bucket,
    received: Arc<Mutex<Vec<Vec<String>>>>,
    fail_listing: Arc<Mutex<u32>>,
}

impl ArchiveReconciliation for Cleaner {
    type Resource = String;
    type Key = String;

    fn interval(&self) -> Duration {
        Duration::from_secs(60)
    }

    async fn list_resources(&self) -> Result<Vec<String>, ReconcileError> {
        let mut failures = self.fail_listing.lock().unwrap();
        if *failures > 0 {
            *failures -= 1;
            return Err(ReconcileError::new("bucket listing timed out"));
        }
        Ok(self.bucket.lock().unwrap().iter().cloned().collect())
    }

    fn resource_key(&self, resource: &String) -> String {
        resource.clone()
    }

    fn referenced_keys(&self, output: &ArchiveStepOutput) -> Vec<String> {
        match output {
            ArchiveStepOutput::Upload(upload) => vec![upload.key.clone()],
            ArchiveStepOutput::Publish(_) => vec![],
        }
    }

    async fn handle_orphans(&self, orphans: Vec<String>) -> Result<(), ReconcileError> {
        self.received.lock().unwrap().push(orphans);
        Ok(())
    }
}

async fn setup() -> (Engine, Cleaner) {
    let bucket: Bucket = Arc::default();
    let engine = Engine::builder()
        .saga(Archive {
            bucket: bucket.clone(),
        })
        .build()
        .await
        .unwrap();
    for name in ["ok-1", "ok-2", "bad-1", "sticky-1"] {
        let id = engine.start::<Archive>(name.to_owned()).await.unwrap();
        engine.wait(id).await.unwrap();
    }
    // An object no task ever recorded (its worker died before the commit).
    bucket.lock().unwrap().insert("archive/lost-1".to_owned());
    let cleaner = Cleaner {
        bucket,
        received: Arc::default(),
        fail_listing: Arc::default(),
    };
    (engine, cleaner)
}

#[tokio::test(start_paused = true)]
async fn orphans_are_exactly_the_unreferenced_resources() {
    let (engine, cleaner) = setup().await;
    let report = cleaner.reconcile_once(&engine).await.unwrap();

    let received = cleaner.received.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
    let orphans: HashSet<_> = received[0].iter().cloned().collect();
    // ok-1/ok-2 are referenced by completed tasks; bad-1 was compensated
    // (deleted); sticky-1's compensation failed, so nothing owns it any more;
    // lost-1 was never recorded.
    let expected: HashSet<_> = ["archive/sticky-1", "archive/lost-1"]
        .map(String::from)
        .into();
    assert_eq!(orphans, expected);
    assert_eq!(report.resources, 4);
    assert_eq!(report.orphans, 2);
    assert_eq!(report.referenced_keys, 2);
}

#[tokio::test(start_paused = true)]
async fn a_failing_cycle_is_isolated_and_the_next_one_runs() {
    let (engine, cleaner) = setup().await;
    *cleaner.fail_listing.lock().unwrap() = 1;
    let cleaner = Arc::new(cleaner);
    let shutdown = CancellationToken::new();
    let runner = {
        let (cleaner, engine, shutdown) = (cleaner.clone(), engine.clone(), shutdown.clone());
        tokio::spawn(async move { cleaner.run(engine, shutdown).await })
    };
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(
        cleaner.received.lock().unwrap().len(),
        1,
        "the second cycle ran after the first failed"
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(cleaner.received.lock().unwrap().len(), 2);
    shutdown.cancel();
    runner.await.unwrap();
}

/// The next version of the saga: its step outputs are read with its own
/// `ArchiveV2StepOutput`.
struct ArchiveV2;

#[saga(name = "archive", version = 2)]
impl ArchiveV2 {
    #[saga_step(1)]
    async fn upload(&self, name: String) -> Result<Upload, StepError> {
        Ok(Upload {
            key: format!("archive-v2/{name}"),
        })
    }

    #[saga_step(2)]
    async fn index(&self, upload: Upload) -> Result<u32, StepError> {
        Ok(upload.key.len() as u32)
    }
}

struct CleanerV2 {
    bucket: Bucket,
    received: Arc<Mutex<Vec<Vec<String>>>>,
}

impl ArchiveV2Reconciliation for CleanerV2 {
    type Resource = String;
    type Key = String;

    async fn list_resources(&self) -> Result<Vec<String>, ReconcileError> {
        Ok(self.bucket.lock().unwrap().iter().cloned().collect())
    }

    fn resource_key(&self, resource: &String) -> String {
        resource.clone()
    }

    fn referenced_keys(&self, output: &ArchiveV2StepOutput) -> Vec<String> {
        match output {
            ArchiveV2StepOutput::Upload(upload) => vec![upload.key.clone()],
            ArchiveV2StepOutput::Index(_) => vec![],
        }
    }

    async fn handle_orphans(&self, orphans: Vec<String>) -> Result<(), ReconcileError> {
        self.received.lock().unwrap().push(orphans);
        Ok(())
    }
}

/// During an upgrade, version 2's reconciliation cannot read the outputs of
/// version 1's live tasks; a resource only they use would look orphaned.
/// The scan fails and deletes nothing until they have ended.
#[tokio::test(start_paused = true)]
async fn a_reconciliation_deletes_nothing_while_tasks_of_another_version_are_live() {
    let bucket: Bucket = Arc::default();
    let engine = Engine::builder()
        .saga(Archive {
            bucket: bucket.clone(),
        })
        .saga(ArchiveV2)
        .build()
        .await
        .unwrap();
    let id = engine.start::<Archive>("ok-1".to_owned()).await.unwrap();
    engine.wait(id).await.unwrap();
    let cleaner = CleanerV2 {
        bucket,
        received: Arc::default(),
    };
    let error = match cleaner.reconcile_once(&engine).await {
        Err(error) => error.to_string(),
        Ok(report) => panic!("the scan went on: {report:?}"),
    };
    assert!(error.contains("runs on version 1"), "{error}");
    assert!(cleaner.received.lock().unwrap().is_empty());
}
