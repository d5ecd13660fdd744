//! Process managers on a private redis-server, what only Redis has: keys
//! that join names and ids. The process-manager scenarios every store
//! passes (contention, racing starters, restarts, deleted instances,
//! unreadable records) are in `tests/scenarios/process.rs`.

mod common;

use common::redis_server::TestRedis;
use saga_runtime::backend::redis::RedisBackend;

/// Keys join names and ids with `:`, so before names were restricted the
/// instance `x:1` of `acct` and the instance `1` of `acct:x` shared one
/// key. A load checks the record's owner and refuses another's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_refuses_a_record_that_belongs_to_another_process_manager() {
    use saga_runtime::backend::{
        BackendError, InstanceStatus, ProcessCommit, ProcessInstance, ProcessStore, Settle,
    };
    use saga_runtime::task::Timestamp;

    let redis = TestRedis::start();
    let backend = RedisBackend::connect(&redis.url()).await.unwrap();
    let instance = ProcessInstance {
        process: "acct".into(),
        id: "x:1".into(),
        generation: "g".into(),
        started_by: None,
        state: serde_json::json!({"balance": 100}),
        status: InstanceStatus::Active,
        version: 0,
        keys: Vec::new(),
        processed: Vec::new(),
        audit_log: Vec::new(),
        created_at: Timestamp::now(),
        updated_at: Timestamp::now(),
    };
    let commit = ProcessCommit::new(Some(&instance), Settle::Nothing);
    backend
        .process_commit("acct", commit)
        .await
        .unwrap()
        .expect("written");

    let own = backend.process_load("acct", "x:1").await.unwrap().unwrap();
    assert_eq!(own.state["balance"], 100);
    match backend.process_load("acct:x", "1").await {
        Err(BackendError::Corrupt(why)) => {
            assert!(why.contains("belongs to instance `x:1` of `acct`"), "{why}")
        }
        other => panic!("another process manager's record was handed out: {other:?}"),
    }
}
