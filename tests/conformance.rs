//! One conformance suite, run unchanged against every backend: the
//! in-memory one and Redis (a private redis-server per test).
//!
//! Each case takes a fresh backend whose visibility timeout is short
//! (`VISIBILITY`), so redelivery is observable.

mod common;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use saga_runtime::backend::memory::MemoryBackend;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::{
    Backend, BackendError, InstanceStatus, ProcessCommit, ProcessInstance, QueueMessage, Settle,
};
use saga_runtime::{TaskId, TaskInstance, TaskStatus};
use serde_json::json;

const VISIBILITY: Duration = Duration::from_millis(400);
const TTL: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_millis(100);

fn task(saga: &str) -> TaskInstance {
    TaskInstance::new(
        saga,
        json!({"n": 1}),
        [("one".to_owned(), 1), ("two".to_owned(), 2)],
    )
}

fn message(t: &TaskInstance) -> String {
    QueueMessage {
        task_id: t.id,
        saga: t.saga.clone(),
        seq: t.seq,
    }
    .to_payload()
}

/// Receives until a message arrives (or panics after a few seconds).
async fn receive(b: &dyn Backend, consumer: &str) -> saga_runtime::backend::Delivery {
    for _ in 0..50 {
        if let Some(d) = b.receive(consumer, WAIT).await.unwrap() {
            return d;
        }
    }
    panic!("no message arrived");
}

async fn nothing_for(b: &dyn Backend, consumer: &str, d: Duration) {
    let until = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < until {
        if let Some(m) = b.receive(consumer, WAIT).await.unwrap() {
            panic!("unexpected message {m:?}");
        }
    }
}

async fn create_load_and_fresh_copies(b: Arc<dyn Backend>) {
    let t = task("s");
    b.create_task(&t, &message(&t)).await.unwrap();
    let mut loaded = b.load_task(t.id).await.unwrap().unwrap();
    assert_eq!(loaded.version, 1);
    assert_eq!(loaded.input, json!({"n": 1}));
    loaded.status = TaskStatus::Completed;
    loaded.steps.clear();
    let again = b.load_task(t.id).await.unwrap().unwrap();
    assert_eq!(
        again.status,
        TaskStatus::Pending,
        "mutating a loaded copy must not change the store"
    );
    assert_eq!(again.steps.len(), 2);
    assert!(b.load_task(TaskId::new()).await.unwrap().is_none());

    let other = task("other");
    b.create_task(&other, &message(&other)).await.unwrap();
    let listed: Vec<TaskId> = b
        .list_tasks("s")
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(listed, [t.id]);
}

async fn versions_and_concurrent_updates(b: Arc<dyn Backend>) {
    let t = task("s");
    b.create_task(&t, &message(&t)).await.unwrap();
    let lease = b.try_lock(t.id, TTL).await.unwrap().unwrap();
    let base = b.load_task(t.id).await.unwrap().unwrap();

    // Two writers start from the same version: exactly one wins.
    let (mut w1, mut w2) = (base.clone(), base.clone());
    w1.status = TaskStatus::Running;
    w2.status = TaskStatus::Failed;
    let (k1, k2) = (format!("{}:one:1", t.id), format!("{}:one:2", t.id));
    let (r1, r2) = tokio::join!(
        b.save_and_claim(&w1, &lease, &k1, TTL),
        b.save_and_claim(&w2, &lease, &k2, TTL)
    );
    let wins = [&r1, &r2].iter().filter(|r| r.is_ok()).count();
    assert_eq!(wins, 1, "{r1:?} {r2:?}");
    let loser = if r1.is_ok() { r2 } else { r1 };
    assert!(
        matches!(
            loser,
            Err(BackendError::Conflict {
                expected: 1,
                actual: 2,
                ..
            })
        ),
        "{loser:?}"
    );
    assert_eq!(b.load_task(t.id).await.unwrap().unwrap().version, 2);
}

async fn idempotency_claims(b: Arc<dyn Backend>) {
    let key = format!("{}:upload:1", TaskId::new());
    assert!(b.try_claim(&key, TTL).await.unwrap());
    assert!(
        !b.try_claim(&key, TTL).await.unwrap(),
        "second claim of the same key"
    );
    let other = format!("{}:upload:2", TaskId::new());
    assert!(b.try_claim(&other, TTL).await.unwrap());
    let short = format!("{}:upload:1", TaskId::new());
    assert!(b
        .try_claim(&short, Duration::from_millis(100))
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(
        b.try_claim(&short, TTL).await.unwrap(),
        "a claim expires after its TTL"
    );

    // save_and_claim claims too, and writes even when the claim is lost.
    let t = task("s");
    b.create_task(&t, &message(&t)).await.unwrap();
    let lease = b.try_lock(t.id, TTL).await.unwrap().unwrap();
    let mut cur = b.load_task(t.id).await.unwrap().unwrap();
    let key = format!("{}:one:1", t.id);
    let (v, claimed) = b.save_and_claim(&cur, &lease, &key, TTL).await.unwrap();
    assert!(claimed);
    cur.version = v;
    let (v2, claimed) = b.save_and_claim(&cur, &lease, &key, TTL).await.unwrap();
    assert!(!claimed);
    assert_eq!(v2, v + 1);
}

async fn lock_contention_expiry_extension_and_stale_release(b: Arc<dyn Backend>) {
    let id = TaskId::new();
    let first = b
        .try_lock(id, Duration::from_millis(300))
        .await
        .unwrap()
        .unwrap();
    assert!(
        b.try_lock(id, TTL).await.unwrap().is_none(),
        "contention: no second holder"
    );

    // Extension keeps it past its original TTL.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(b
        .extend_lock(&first, Duration::from_millis(300))
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        b.try_lock(id, TTL).await.unwrap().is_none(),
        "extended lock still held"
    );

    // The holder dies: the lease expires and another worker gets a larger fence.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = b
        .try_lock(id, TTL)
        .await
        .unwrap()
        .expect("expired lock is free");
    assert!(second.fence > first.fence, "fencing tokens increase");
    assert!(
        !b.unlock(&first).await.unwrap(),
        "a stale holder cannot release"
    );
    assert!(!b.extend_lock(&first, TTL).await.unwrap(), "nor extend");
    assert!(
        b.try_lock(id, TTL).await.unwrap().is_none(),
        "still held by the second"
    );
    assert!(b.unlock(&second).await.unwrap());
    assert!(b.try_lock(id, TTL).await.unwrap().is_some());
}

async fn stale_fence_writes_are_refused(b: Arc<dyn Backend>) {
    let t = task("s");
    b.create_task(&t, &message(&t)).await.unwrap();
    let old = b
        .try_lock(t.id, Duration::from_millis(100))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let new = b.try_lock(t.id, TTL).await.unwrap().unwrap();
    let cur = b.load_task(t.id).await.unwrap().unwrap();
    let stale = b
        .save_and_claim(&cur, &old, &format!("{}:one:1", t.id), TTL)
        .await;
    assert!(
        matches!(stale, Err(BackendError::LockLost { .. })),
        "{stale:?}"
    );
    let d = receive(&*b, "c").await;
    let stale = b.commit(&cur, &old, None, Settle::Ack(&d), false).await;
    assert!(
        matches!(stale, Err(BackendError::LockLost { .. })),
        "{stale:?}"
    );
    assert!(b
        .commit(&cur, &new, None, Settle::Ack(&d), false)
        .await
        .is_ok());
}

async fn redelivery_after_visibility_timeout_and_touch(b: Arc<dyn Backend>) {
    let t = task("s");
    b.create_task(&t, &message(&t)).await.unwrap();
    let first = receive(&*b, "a").await;
    assert_eq!(first.payload, message(&t));
    // Unsettled: delivered again after the visibility timeout, to anyone.
    let again = receive(&*b, "b").await;
    assert_eq!(again.payload, first.payload);
    // Touching keeps it from being redelivered while it is worked on: other
    // consumers polling meanwhile (past the visibility timeout) get nothing.
    for _ in 0..4 {
        nothing_for(&*b, "d", VISIBILITY / 3).await;
        b.touch(&again).await.unwrap();
    }
    b.ack(&again).await.unwrap();
    nothing_for(&*b, "c", VISIBILITY * 2).await;
}

async fn commit_is_atomic_enqueue_ack_and_unlock(b: Arc<dyn Backend>) {
    let t = task("s");
    b.create_task(&t, &message(&t)).await.unwrap();
    let d = receive(&*b, "a").await;
    let lease = b.try_lock(t.id, TTL).await.unwrap().unwrap();
    let mut cur = b.load_task(t.id).await.unwrap().unwrap();
    cur.status = TaskStatus::Running;
    cur.seq += 1;
    let next = message(&cur);
    let v = b
        .commit(&cur, &lease, Some(&next), Settle::Ack(&d), false)
        .await
        .unwrap();
    assert_eq!(v, 2);
    assert!(
        b.try_lock(t.id, TTL).await.unwrap().is_some(),
        "commit released the lock"
    );
    let n = receive(&*b, "a").await;
    assert_eq!(
        n.payload, next,
        "the next message, not the acknowledged one"
    );
    b.ack(&n).await.unwrap();
    nothing_for(&*b, "a", VISIBILITY * 2).await;
}

async fn dead_lettering_and_requeue(b: Arc<dyn Backend>) {
    b.enqueue("garbage").await.unwrap();
    let d = receive(&*b, "a").await;
    b.dead_letter(&d, "malformed", None).await.unwrap();
    nothing_for(&*b, "a", VISIBILITY * 2).await;
    let letters = b.dead_letters().await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].payload.as_str(), letters[0].reason.as_str()),
        ("garbage", "malformed")
    );
    let requeued = b
        .requeue_dead_letter(&letters[0].id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(requeued.payload, "garbage");
    assert!(b.dead_letters().await.unwrap().is_empty());
    assert_eq!(receive(&*b, "a").await.payload, "garbage");
    assert!(b
        .requeue_dead_letter(&letters[0].id)
        .await
        .unwrap()
        .is_none());

    // Dead-lettering through commit, then resolving through commit.
    let t = task("s");
    b.create_task(&t, &message(&t)).await.unwrap();
    let d = loop {
        let d = receive(&*b, "a").await;
        if d.payload != "garbage" {
            break d;
        }
        b.ack(&d).await.unwrap();
    };
    let lease = b.try_lock(t.id, TTL).await.unwrap().unwrap();
    let mut cur = b.load_task(t.id).await.unwrap().unwrap();
    cur.status = TaskStatus::DeadLettered;
    cur.version = b
        .commit(
            &cur,
            &lease,
            None,
            Settle::DeadLetter(&d, "exhausted"),
            false,
        )
        .await
        .unwrap();
    let letters = b.dead_letters().await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].task_id, Some(t.id));
    let lease = b.try_lock(t.id, TTL).await.unwrap().unwrap();
    b.commit(
        &cur,
        &lease,
        None,
        Settle::ResolveDeadLetter(&letters[0].id),
        false,
    )
    .await
    .unwrap();
    assert!(b.dead_letters().await.unwrap().is_empty());
}

async fn cancellation_flags_and_notifications(b: Arc<dyn Backend>) {
    let mut stream = b.cancellations().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await; // let a subscription settle
    let id = TaskId::new();
    assert!(b.cancel_requested(id).await.unwrap().is_none());
    assert!(
        b.request_cancel(id).await.unwrap().is_none(),
        "first request"
    );
    let first = b.cancel_requested(id).await.unwrap().expect("flag set");
    assert_eq!(
        b.request_cancel(id).await.unwrap(),
        Some(first),
        "second request sees the first"
    );
    let notified = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap();
    assert_eq!(notified, Some(id));

    let t = task("s");
    b.create_task(&t, &message(&t)).await.unwrap();
    let d = receive(&*b, "a").await;
    let lease = b.try_lock(t.id, TTL).await.unwrap().unwrap();
    let beat = b.heartbeat(&lease, &d, TTL).await.unwrap();
    assert!(beat.lock_held && beat.cancel_requested.is_none());
    b.request_cancel(t.id).await.unwrap();
    let beat = b.heartbeat(&lease, &d, TTL).await.unwrap();
    assert!(beat.cancel_requested.is_some());
    b.unlock(&lease).await.unwrap();
    assert!(!b.heartbeat(&lease, &d, TTL).await.unwrap().lock_held);
    let locked = b.try_lock_and_load(t.id, TTL).await.unwrap().unwrap();
    assert_eq!(locked.task.unwrap().id, t.id);
    assert!(locked.cancel_requested.is_some());
}

fn instance(id: &str) -> ProcessInstance {
    let now = saga_runtime::task::Timestamp::now();
    ProcessInstance {
        process: "pm".into(),
        id: id.into(),
        state: json!({"n": 0}),
        status: InstanceStatus::Active,
        version: 0,
        keys: Vec::new(),
        processed: Vec::new(),
        audit_log: Vec::new(),
        created_at: now,
        updated_at: now,
    }
}

fn write<'a>(i: &'a ProcessInstance, add: &[(&str, &str)]) -> ProcessCommit<'a> {
    ProcessCommit {
        instance: Some(i),
        delete: false,
        add_keys: add
            .iter()
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .collect(),
        remove_keys: Vec::new(),
        enqueue: Vec::new(),
        endpoints: Vec::new(),
        schedule: Vec::new(),
        settle: Settle::Nothing,
    }
}

async fn process_instances_versions_and_correlation_entries(b: Arc<dyn Backend>) {
    let mut a = instance("a");
    assert_eq!(
        b.process_commit("pm", write(&a, &[("order", "42")]))
            .await
            .unwrap(),
        1
    );
    // Creating it again (version 0) conflicts: two racing starters make one instance.
    let again = b.process_commit("pm", write(&instance("a"), &[])).await;
    assert!(
        matches!(again, Err(BackendError::ProcessConflict { .. })),
        "{again:?}"
    );
    // Another instance cannot claim a correlation value that "a" owns.
    let stolen = b
        .process_commit("pm", write(&instance("b"), &[("order", "42")]))
        .await;
    assert!(
        matches!(stolen, Err(BackendError::ProcessConflict { .. })),
        "{stolen:?}"
    );
    assert!(
        b.process_load("pm", "b").await.unwrap().is_none(),
        "a refused commit writes nothing"
    );

    let found = b.process_find("pm", "order", "42").await.unwrap().unwrap();
    assert_eq!((found.id.as_str(), found.version), ("a", 1));
    a.version = 1;
    a.state = json!({"n": 1});
    assert_eq!(b.process_commit("pm", write(&a, &[])).await.unwrap(), 2);
    let stale = b.process_commit("pm", write(&a, &[])).await;
    assert!(
        matches!(stale, Err(BackendError::ProcessConflict { .. })),
        "stale version: {stale:?}"
    );

    // Deleting releases the correlation entries.
    a.version = 2;
    let mut delete = write(&a, &[]);
    delete.delete = true;
    delete.remove_keys = vec![("order".into(), "42".into())];
    b.process_commit("pm", delete).await.unwrap();
    assert!(b.process_load("pm", "a").await.unwrap().is_none());
    assert!(b.process_find("pm", "order", "42").await.unwrap().is_none());
    assert!(b.process_list("pm").await.unwrap().is_empty());
}

async fn process_outbox_schedule_and_single_delivery_of_due_entries(b: Arc<dyn Backend>) {
    let i = instance("x");
    let mut commit = write(&i, &[]);
    commit.endpoints = vec![("billing".into(), "invoice-1".into())];
    commit.schedule = vec![
        (1_000, "{\"process\":\"pm\",\"n\":1}".into()),
        (5_000, "{\"process\":\"pm\",\"n\":2}".into()),
    ];
    commit.enqueue = vec!["{\"process\":\"pm\",\"n\":0}".into()];
    b.process_commit("pm", commit).await.unwrap();
    assert_eq!(b.endpoint_messages("billing").await.unwrap(), ["invoice-1"]);
    assert_eq!(
        receive(&*b, "c").await.payload,
        "{\"process\":\"pm\",\"n\":0}"
    );
    assert_eq!(b.process_scheduled().await.unwrap().len(), 2);

    // Two pollers racing at t=2000: the due entry moves exactly once.
    let (m1, m2) = tokio::join!(
        b.process_release_due(2_000, 10),
        b.process_release_due(2_000, 10)
    );
    assert_eq!(m1.unwrap() + m2.unwrap(), 1);
    assert_eq!(
        receive(&*b, "c").await.payload,
        "{\"process\":\"pm\",\"n\":1}"
    );
    assert_eq!(
        b.process_scheduled().await.unwrap(),
        [(5_000, "{\"process\":\"pm\",\"n\":2}".to_owned())]
    );

    // Named leases: one holder at a time, renewable by it, released by it only.
    assert!(b.named_lease("poller", "p1", TTL).await.unwrap());
    assert!(!b.named_lease("poller", "p2", TTL).await.unwrap());
    assert!(b.named_lease("poller", "p1", TTL).await.unwrap(), "renewal");
    assert!(!b.release_named_lease("poller", "p2").await.unwrap());
    assert!(b.release_named_lease("poller", "p1").await.unwrap());
    assert!(b
        .named_lease("poller", "p2", Duration::from_millis(100))
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(
        b.named_lease("poller", "p1", TTL).await.unwrap(),
        "an expired lease is free"
    );
}

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(Arc::new(MemoryBackend::with_visibility_timeout(VISIBILITY))).await;
                }
            )*
        }
        mod redis {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let server = common::redis_server::TestRedis::start();
                    let config = RedisConfig { visibility_timeout: VISIBILITY, block: WAIT, partitions: 3, ..RedisConfig::default() };
                    let backend = RedisBackend::connect_with(&server.url(), config).await.unwrap();
                    super::$case(Arc::new(backend)).await;
                }
            )*
        }
    };
}

suite!(
    create_load_and_fresh_copies,
    versions_and_concurrent_updates,
    idempotency_claims,
    lock_contention_expiry_extension_and_stale_release,
    stale_fence_writes_are_refused,
    redelivery_after_visibility_timeout_and_touch,
    commit_is_atomic_enqueue_ack_and_unlock,
    dead_lettering_and_requeue,
    cancellation_flags_and_notifications,
    process_instances_versions_and_correlation_entries,
    process_outbox_schedule_and_single_delivery_of_due_entries,
);
