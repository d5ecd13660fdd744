//! The backend conformance suite: what every [`Backend`] must do for the
//! engine to keep its guarantees. The in-memory and Redis backends pass it;
//! run it against your own with [`backend_conformance!`](crate::backend_conformance):
//!
//! ```ignore
//! use std::sync::Arc;
//! use saga_runtime::backend::Backend;
//! use saga_runtime::testing::conformance::VISIBILITY;
//!
//! // A fresh, empty backend whose visibility timeout is `VISIBILITY`, and
//! // whatever must live as long as it (a server process, a temp dir).
//! async fn fresh() -> (Arc<dyn Backend>, ()) {
//!     (Arc::new(MyBackend::new(VISIBILITY)), ())
//! }
//!
//! saga_runtime::backend_conformance!(fresh);
//! ```
//!
//! Each case takes a fresh backend and real (not paused) time: backends
//! that talk to a server cannot follow tokio's paused clock.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;

use crate::backend::{
    Backend, BackendError, BreakerChange, BreakerDecision, Created, DeadLetterQuery, Delivery,
    InstanceStatus, Interest, Lease, Next, NextAttempt, ProcessCommit, ProcessInstance,
    QueueMessage, QueueStats, Retention, Settle, TakenLease, TallyOpen, TaskCommit, TaskCursor,
    TaskQuery, WorkItem,
};
use crate::model::task::{
    AuditAction, AuditEntry, TaskId, TaskInstance, TaskStatus, Timestamp, AUDIT_LOG_CAP,
};
use crate::process::tally::TallyProgress;
use crate::process::{Envelope, EnvelopeKind, TallyCheck, TallyRef};

/// The visibility timeout the backend under test must be built with.
pub const VISIBILITY: Duration = Duration::from_millis(400);
const TTL: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_millis(50);

/// A task of saga `saga` with two steps.
pub fn task(saga: &str) -> TaskInstance {
    TaskInstance::new(
        saga,
        json!({"n": 1}),
        [("one".to_owned(), 1), ("two".to_owned(), 2)],
    )
}

/// The message that advances `t` at its current sequence number.
pub fn message(t: &TaskInstance) -> QueueMessage {
    QueueMessage {
        task_id: t.id,
        saga: t.saga.clone(),
        seq: t.seq,
    }
}

fn item(t: &TaskInstance) -> WorkItem {
    WorkItem::Saga(message(t))
}

fn envelope(n: u32) -> Envelope {
    Envelope {
        message_id: format!("m-{n}"),
        process: "pm".into(),
        message_type: "T".into(),
        payload: json!({"n": n}),
        kind: EnvelopeKind::Message,
        instance_id: None,
        generation: None,
        failures: 0,
        key: None,
        key_field: None,
        traceparent: None,
        due_ms: None,
        hops: 0,
    }
}

/// Receives until a message arrives (or panics after a few seconds),
/// moving due delayed messages as the engine's timer poller would. A task
/// lease the backend took with the delivery is released, so that cases
/// about the queue and cases about leases stay apart.
pub async fn receive(b: &dyn Backend, consumer: &str) -> Delivery {
    let d = receive_leased(b, consumer).await;
    if let Some(TakenLease::Held { locked, .. }) = &d.lease {
        assert!(
            b.unlock(&locked.lease).await.unwrap(),
            "a taken lease is held"
        );
    }
    d
}

/// [`receive`], keeping a lease taken with the delivery.
pub async fn receive_leased(b: &dyn Backend, consumer: &str) -> Delivery {
    for _ in 0..100 {
        b.release_due(100).await.unwrap();
        if let Some(d) = b.receive(consumer, Interest::ALL, WAIT).await.unwrap() {
            return d;
        }
    }
    panic!("no message arrived");
}

/// Asserts that nothing is delivered for `d`.
pub async fn nothing_for(b: &dyn Backend, consumer: &str, d: Duration) {
    let until = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < until {
        b.release_due(100).await.unwrap();
        if let Some(m) = b.receive(consumer, Interest::ALL, WAIT).await.unwrap() {
            panic!("unexpected message {m:?}");
        }
    }
}

async fn create(b: &dyn Backend, t: &TaskInstance) {
    let created = b.create_task(t, &message(t)).await.unwrap();
    assert!(matches!(created, Created::New), "{created:?}");
}

async fn lock(b: &dyn Backend, id: TaskId) -> Lease {
    b.lock_and_load(id, TTL)
        .await
        .unwrap()
        .expect("the lock is free")
        .lease
}

fn commit<'a>(task: &'a TaskInstance, lease: &'a Lease, settle: Settle<'a>) -> TaskCommit<'a> {
    TaskCommit {
        task,
        stored_status: task.status,
        lease,
        next: None,
        settle,
        unless_cancelled: false,
        expire_after: None,
    }
}

fn query(saga: &str) -> TaskQuery {
    TaskQuery {
        saga: saga.into(),
        status: None,
        created_from: None,
        created_to: None,
        after: None,
        limit: 100,
    }
}

/// Creating is idempotent by id; loads are fresh copies; listing is by
/// saga.
pub async fn create_load_and_fresh_copies(b: Arc<dyn Backend>) {
    let t = task("s");
    create(&*b, &t).await;
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

    // A retried create finds the task instead of writing a second one.
    let mut retry = t.clone();
    retry.input = json!({"n": 2});
    match b.create_task(&retry, &message(&retry)).await.unwrap() {
        Created::Existing(existing) => assert_eq!(existing.input, json!({"n": 1})),
        Created::New => panic!("a second create of one id must not write"),
    }
    let d = receive(&*b, "a").await;
    b.ack(&d).await.unwrap();
    nothing_for(&*b, "a", WAIT * 2).await;

    let other = task("other");
    create(&*b, &other).await;
    let listed: Vec<TaskId> = b
        .list_tasks(&query("s"))
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(listed, [t.id]);
}

/// Two writers from one version: exactly one wins.
pub async fn versions_and_concurrent_updates(b: Arc<dyn Backend>) {
    let t = task("s");
    create(&*b, &t).await;
    let lease = lock(&*b, t.id).await;
    let base = b.load_task(t.id).await.unwrap().unwrap();
    let (mut w1, mut w2) = (base.clone(), base.clone());
    w1.status = TaskStatus::Running;
    w2.status = TaskStatus::Failed;
    let (r1, r2) = tokio::join!(
        b.record_attempt(&w1, TaskStatus::Pending, &lease, "one:1"),
        b.record_attempt(&w2, TaskStatus::Pending, &lease, "one:2")
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

/// A write stamps the record with when it was made (`updated_at`).
pub async fn writes_stamp_updated_at(b: Arc<dyn Backend>) {
    let t = task("s");
    create(&*b, &t).await;
    let lease = lock(&*b, t.id).await;
    let created = b.load_task(t.id).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    b.record_attempt(&created, TaskStatus::Pending, &lease, "one:1")
        .await
        .unwrap();
    let written = b.load_task(t.id).await.unwrap().unwrap();
    assert!(
        written.updated_at.0 >= created.updated_at.0 + 5,
        "updated_at {:?} after a write at least 5 ms after {:?}",
        written.updated_at,
        created.updated_at
    );
}

/// An attempt's claim is won once per task; the write happens either way.
pub async fn attempt_claims(b: Arc<dyn Backend>) {
    let t = task("s");
    create(&*b, &t).await;
    let lease = lock(&*b, t.id).await;
    let mut cur = b.load_task(t.id).await.unwrap().unwrap();
    let (v, claimed) = b
        .record_attempt(&cur, TaskStatus::Pending, &lease, "one:1")
        .await
        .unwrap();
    assert!(claimed);
    cur.version = v;
    let (v2, claimed) = b
        .record_attempt(&cur, TaskStatus::Pending, &lease, "one:1")
        .await
        .unwrap();
    assert!(!claimed, "the same attempt twice");
    assert_eq!(v2, v + 1, "the write happens even when the claim is lost");
    cur.version = v2;
    let (_, claimed) = b
        .record_attempt(&cur, TaskStatus::Pending, &lease, "one:2")
        .await
        .unwrap();
    assert!(claimed, "the next attempt");

    let other = task("s");
    create(&*b, &other).await;
    let lease = lock(&*b, other.id).await;
    let (_, claimed) = b
        .record_attempt(
            &other_version(&*b, other.id).await,
            TaskStatus::Pending,
            &lease,
            "one:1",
        )
        .await
        .unwrap();
    assert!(claimed, "claims belong to their task");
}

/// A task lease taken with a delivery (if the backend takes one) is the
/// task's lock, with the task loaded under it; none is taken for a task
/// that does not exist, nor for a process-manager message.
pub async fn a_lease_taken_with_a_delivery_is_the_tasks_lock(b: Arc<dyn Backend>) {
    let t = task("s");
    create(&*b, &t).await;
    let d = receive_leased(&*b, "a").await;
    assert_eq!(d.item, Ok(item(&t)));
    let Some(TakenLease::Held { locked, .. }) = d.lease.clone() else {
        assert!(d.lease.is_none(), "a free task's lease is held, not busy");
        return;
    };
    assert_eq!(locked.lease.task_id, t.id);
    assert!(locked.lease.fence >= 1);
    let stored = b.load_task(t.id).await.unwrap().unwrap();
    assert_eq!(
        locked.task.as_ref(),
        Some(&stored),
        "loaded under the lease"
    );
    assert_eq!(locked.cancel_requested, None);
    assert!(
        b.lock_and_load(t.id, TTL).await.unwrap().is_none(),
        "the taken lease is the lock"
    );
    // Another message of the same task meets the lease.
    b.enqueue(&[item(&t)]).await.unwrap();
    let other = receive_leased(&*b, "b").await;
    assert!(
        matches!(other.lease, None | Some(TakenLease::Busy)),
        "{:?}",
        other.lease
    );
    // A write under it is a write under the lock.
    let (v, claimed) = b
        .record_attempt(&stored, TaskStatus::Pending, &locked.lease, "one:1")
        .await
        .unwrap();
    assert!(claimed);
    assert_eq!(v, 2);
    assert!(b.unlock(&locked.lease).await.unwrap());
    let next = lock(&*b, t.id).await;
    assert!(next.fence > locked.lease.fence);
    b.ack(&d).await.unwrap();
    b.ack(&other).await.unwrap();

    // Nothing is taken for a task that does not exist, nor for a process
    // manager's message.
    let ghost = task("s");
    b.enqueue(&[item(&ghost)]).await.unwrap();
    let stray = receive_leased(&*b, "a").await;
    assert_eq!(stray.item, Ok(item(&ghost)));
    assert!(stray.lease.is_none(), "{:?}", stray.lease);
    b.ack(&stray).await.unwrap();
    let missing = b.lock_and_load(ghost.id, TTL).await.unwrap().unwrap();
    assert_eq!(missing.lease.fence, 0, "no fence was left behind");
    b.enqueue(&[WorkItem::Process(envelope(1))]).await.unwrap();
    let pm = receive_leased(&*b, "a").await;
    assert!(matches!(pm.item, Ok(WorkItem::Process(_))));
    assert!(pm.lease.is_none());
    b.ack(&pm).await.unwrap();
}

/// Going on with a held task: the next attempt is recorded and claimed
/// under the same lease, which the write renews when asked, as it keeps the
/// message from being delivered again; a stale lease is refused, and so is
/// a write asked to yield to a cancellation, which then writes nothing.
pub async fn going_on_with_a_task_records_the_next_attempt(b: Arc<dyn Backend>) {
    let t = task("s");
    create(&*b, &t).await;
    let d = receive(&*b, "a").await;
    let short = Duration::from_millis(300);
    let lease = b.lock_and_load(t.id, short).await.unwrap().unwrap().lease;
    let mut cur = b.load_task(t.id).await.unwrap().unwrap();
    let (v, claimed) = b
        .record_attempt(&cur, TaskStatus::Pending, &lease, "one:1")
        .await
        .unwrap();
    assert!(claimed);
    cur.version = v;
    cur.status = TaskStatus::Running;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (v, claimed) = b
        .record_next_attempt(next_attempt(&cur, &lease, &d, "two:1", Some(short), true))
        .await
        .unwrap();
    assert!(claimed);
    assert_eq!(v, cur.version + 1);
    cur.version = v;
    let stored = b.load_task(t.id).await.unwrap().unwrap();
    assert_eq!((stored.status, stored.version), (TaskStatus::Running, v));
    // Past the lease's first TTL and the message's visibility timeout,
    // both renewed by the write: nobody else gets either.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        b.lock_and_load(t.id, TTL).await.unwrap().is_none(),
        "the write renewed the lease"
    );
    nothing_for(&*b, "b", Duration::from_millis(80)).await;
    // The same claim twice is lost; the write still lands.
    let mut same = cur.clone();
    same.status = TaskStatus::Running;
    let (v, claimed) = b
        .record_next_attempt(next_attempt(&same, &lease, &d, "two:1", None, false))
        .await
        .unwrap();
    assert!(!claimed, "the same attempt twice");
    cur.version = v;

    // Asked to yield to a cancellation: refused, nothing written.
    assert!(b
        .request_cancel(t.id, "tok", &message(&t))
        .await
        .unwrap()
        .is_none());
    let refused = b
        .record_next_attempt(next_attempt(&cur, &lease, &d, "two:2", None, true))
        .await;
    assert!(
        matches!(refused, Err(BackendError::CancelRequested { .. })),
        "{refused:?}"
    );
    assert_eq!(
        b.load_task(t.id).await.unwrap().unwrap().version,
        cur.version
    );
    let (_, claimed) = b
        .record_next_attempt(next_attempt(&cur, &lease, &d, "two:2", None, false))
        .await
        .unwrap();
    assert!(claimed, "the refused write claimed nothing");

    // A lease taken over after it expired is stale.
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    let _taken = lock(&*b, t.id).await;
    let mut stale = b.load_task(t.id).await.unwrap().unwrap();
    stale.status = TaskStatus::Running;
    let lost = b
        .record_next_attempt(next_attempt(
            &stale,
            &lease,
            &d,
            "two:3",
            Some(short),
            false,
        ))
        .await;
    assert!(
        matches!(lost, Err(BackendError::LockLost { .. })),
        "{lost:?}"
    );
}

/// A write appends the audit entries its copy adds (those after
/// `audit_stored`) and leaves the stored ones alone, whatever the copy
/// holds of them; the log keeps its most recent `AUDIT_LOG_CAP` entries.
pub async fn the_audit_log_is_appended_and_capped(b: Arc<dyn Backend>) {
    let entry = |n: u32| AuditEntry::new(AuditAction::StepCompleted).attempt(n);
    let attempts =
        |t: &TaskInstance| -> Vec<Option<u32>> { t.audit_log.iter().map(|e| e.attempt).collect() };
    let t = task("s");
    create(&*b, &t).await;
    let locked = b.lock_and_load(t.id, TTL).await.unwrap().unwrap();
    let mut cur = locked.task.unwrap();
    for n in 1..=3 {
        cur.audit(entry(n));
    }
    let (v, _) = b
        .record_attempt(&cur, TaskStatus::Pending, &locked.lease, "one:1")
        .await
        .unwrap();
    cur.version = v;
    cur.audit_saved();
    let stored = b.load_task(t.id).await.unwrap().unwrap();
    assert_eq!(attempts(&stored), [Some(1), Some(2), Some(3)]);
    // The same copy written again appends only what it added since.
    cur.audit(entry(4));
    let (v, _) = b
        .record_attempt(&cur, TaskStatus::Pending, &locked.lease, "one:2")
        .await
        .unwrap();
    cur.version = v;
    cur.audit_saved();
    let stored = b.load_task(t.id).await.unwrap().unwrap();
    assert_eq!(attempts(&stored), [Some(1), Some(2), Some(3), Some(4)]);
    // A copy holding none of the stored entries appends too.
    let mut bare = stored.clone();
    bare.audit_log.clear();
    bare.audit_saved();
    bare.audit(entry(5));
    b.record_attempt(&bare, TaskStatus::Pending, &locked.lease, "one:3")
        .await
        .unwrap();
    let stored = b.load_task(t.id).await.unwrap().unwrap();
    assert_eq!(attempts(&stored).len(), 5);
    assert_eq!(stored.audit_log[4].attempt, Some(5));
    assert!(
        stored.unstored_audit().is_empty(),
        "a load holds what is stored"
    );

    // Capped: the most recent entries stay.
    let mut many = stored.clone();
    for n in 0..AUDIT_LOG_CAP as u32 + 5 {
        many.audit(entry(100 + n));
    }
    b.record_attempt(&many, TaskStatus::Pending, &locked.lease, "one:4")
        .await
        .unwrap();
    let stored = b.load_task(t.id).await.unwrap().unwrap();
    assert_eq!(stored.audit_log.len(), AUDIT_LOG_CAP);
    assert_eq!(
        stored.audit_log.last().unwrap().attempt,
        Some(100 + AUDIT_LOG_CAP as u32 + 4)
    );
}

fn next_attempt<'a>(
    task: &'a TaskInstance,
    lease: &'a Lease,
    delivery: &'a Delivery,
    claim: &'a str,
    renew: Option<Duration>,
    unless_cancelled: bool,
) -> NextAttempt<'a> {
    NextAttempt {
        task,
        stored_status: TaskStatus::Pending,
        lease,
        claim,
        delivery,
        renew,
        unless_cancelled,
    }
}

async fn other_version(b: &dyn Backend, id: TaskId) -> TaskInstance {
    b.load_task(id).await.unwrap().unwrap()
}

/// One holder at a time; a heartbeat extends; an expired lease is taken
/// with a larger fence; a stale holder can neither extend nor release.
pub async fn lock_contention_expiry_extension_and_stale_release(b: Arc<dyn Backend>) {
    let t = task("s");
    create(&*b, &t).await;
    let d = receive(&*b, "a").await;
    let short = Duration::from_millis(300);
    let first = b.lock_and_load(t.id, short).await.unwrap().unwrap().lease;
    assert!(first.fence >= 1);
    assert!(
        b.lock_and_load(t.id, TTL).await.unwrap().is_none(),
        "contention: no second holder"
    );

    // A heartbeat keeps it past its original TTL.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(b.heartbeat(&first, &d, short).await.unwrap().lock_held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        b.lock_and_load(t.id, TTL).await.unwrap().is_none(),
        "extended lock still held"
    );

    // The holder dies: the lease expires and another worker gets a larger fence.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = lock(&*b, t.id).await;
    assert!(second.fence > first.fence, "fencing tokens increase");
    assert!(
        !b.unlock(&first).await.unwrap(),
        "a stale holder cannot release"
    );
    assert!(
        !b.heartbeat(&first, &d, TTL).await.unwrap().lock_held,
        "nor extend"
    );
    assert!(
        b.lock_and_load(t.id, TTL).await.unwrap().is_none(),
        "still held by the second"
    );
    assert!(b.unlock(&second).await.unwrap());
    assert!(b.lock_and_load(t.id, TTL).await.unwrap().is_some());
}

/// A message for a task that does not exist takes no lease and leaves
/// nothing behind.
pub async fn locking_a_missing_task_takes_nothing(b: Arc<dyn Backend>) {
    let id = TaskId::new();
    let locked = b.lock_and_load(id, TTL).await.unwrap().unwrap();
    assert!(locked.task.is_none());
    assert_eq!(locked.lease.fence, 0, "no fence for a missing task");
    let again = b.lock_and_load(id, TTL).await.unwrap();
    assert!(
        again.is_some_and(|l| l.task.is_none()),
        "and no lock either"
    );
}

/// Writes under a lease that was taken over are refused.
pub async fn stale_fence_writes_are_refused(b: Arc<dyn Backend>) {
    let t = task("s");
    create(&*b, &t).await;
    let old = b
        .lock_and_load(t.id, Duration::from_millis(100))
        .await
        .unwrap()
        .unwrap()
        .lease;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let new = lock(&*b, t.id).await;
    let cur = b.load_task(t.id).await.unwrap().unwrap();
    let stale = b
        .record_attempt(&cur, TaskStatus::Pending, &old, "one:1")
        .await;
    assert!(
        matches!(stale, Err(BackendError::LockLost { .. })),
        "{stale:?}"
    );
    let d = receive(&*b, "c").await;
    let stale = b.commit(commit(&cur, &old, Settle::Ack(&d))).await;
    assert!(
        matches!(stale, Err(BackendError::LockLost { .. })),
        "{stale:?}"
    );
    assert!(b.commit(commit(&cur, &new, Settle::Ack(&d))).await.is_ok());
}

/// An unsettled message comes back after the visibility timeout, counted
/// as an unanswered delivery; touching it keeps it.
pub async fn redelivery_after_visibility_timeout_and_touch(b: Arc<dyn Backend>) {
    assert_eq!(b.visibility_timeout(), VISIBILITY);
    let t = task("s");
    create(&*b, &t).await;
    let first = receive(&*b, "a").await;
    assert_eq!(first.item, Ok(item(&t)));
    assert_eq!(first.deliveries, 1);
    // Unsettled: delivered again after the visibility timeout, to anyone.
    let again = receive(&*b, "b").await;
    assert_eq!(again.item, first.item);
    assert_eq!(again.deliveries, 2, "the first delivery was never answered");
    // Touching keeps it from being redelivered while it is worked on: other
    // consumers polling meanwhile (past the visibility timeout) get nothing.
    for _ in 0..4 {
        nothing_for(&*b, "d", VISIBILITY / 3).await;
        b.touch(&again).await.unwrap();
    }
    b.ack(&again).await.unwrap();
    nothing_for(&*b, "c", VISIBILITY * 2).await;
}

/// A released message comes back promptly (not after the visibility
/// timeout), after its delay, and its release counts as an answer.
pub async fn release_is_prompt_delayed_and_answers_the_delivery(b: Arc<dyn Backend>) {
    let t = task("s");
    create(&*b, &t).await;
    let d = receive(&*b, "a").await;
    let start = tokio::time::Instant::now();
    b.release(&d, Duration::ZERO).await.unwrap();
    let d = receive(&*b, "b").await;
    assert!(
        start.elapsed() < VISIBILITY,
        "released at once, not after the visibility timeout ({:?})",
        start.elapsed()
    );
    assert_eq!(d.deliveries, 1, "a released delivery counts as answered");

    // Left to expire, it counts.
    let d = receive(&*b, "c").await;
    assert_eq!(d.deliveries, 2);
    let delay = Duration::from_millis(300);
    let start = tokio::time::Instant::now();
    b.release(&d, delay).await.unwrap();
    nothing_for(&*b, "a", delay / 2).await;
    let d = receive(&*b, "a").await;
    assert!(start.elapsed() >= delay, "{:?}", start.elapsed());
    assert!(
        start.elapsed() < VISIBILITY + delay,
        "{:?}",
        start.elapsed()
    );
    assert_eq!(d.deliveries, 2, "the count survives a hand-back");
    assert_eq!(d.item, Ok(item(&t)));
    b.ack(&d).await.unwrap();
    // Releasing a message that was settled meanwhile does not resurrect it.
    b.release(&d, Duration::ZERO).await.unwrap();
    nothing_for(&*b, "a", VISIBILITY * 2).await;
}

/// The commit records the task, enqueues the next message (now or after a
/// delay), acknowledges the current one and releases the lease, at once.
pub async fn commit_is_atomic_enqueue_ack_and_unlock(b: Arc<dyn Backend>) {
    let t = task("s");
    create(&*b, &t).await;
    let d = receive(&*b, "a").await;
    let lease = lock(&*b, t.id).await;
    let mut cur = b.load_task(t.id).await.unwrap().unwrap();
    cur.status = TaskStatus::Running;
    cur.seq += 1;
    let mut c = commit(&cur, &lease, Settle::Ack(&d));
    c.stored_status = TaskStatus::Pending;
    c.next = Some(Next {
        message: message(&cur),
        delay: Duration::ZERO,
    });
    assert_eq!(b.commit(c).await.unwrap(), 2);
    let lease = b
        .lock_and_load(t.id, TTL)
        .await
        .unwrap()
        .expect("commit released the lock")
        .lease;
    let n = receive(&*b, "a").await;
    assert_eq!(
        n.item,
        Ok(item(&cur)),
        "the next message, not the acknowledged one"
    );

    // A delayed next message: durable, and not delivered before its time.
    cur.version = 2;
    cur.seq += 1;
    let delay = Duration::from_millis(300);
    let mut c = commit(&cur, &lease, Settle::Ack(&n));
    c.next = Some(Next {
        message: message(&cur),
        delay,
    });
    let start = tokio::time::Instant::now();
    b.commit(c).await.unwrap();
    nothing_for(&*b, "a", delay / 2).await;
    let late = receive(&*b, "a").await;
    assert!(start.elapsed() >= delay, "{:?}", start.elapsed());
    assert_eq!(late.item, Ok(item(&cur)));
    assert_eq!(late.deliveries, 1);
    b.ack(&late).await.unwrap();
    nothing_for(&*b, "a", VISIBILITY * 2).await;
}

/// A commit with `unless_cancelled` is refused once cancellation was
/// requested, and writes nothing.
pub async fn an_accepted_cancellation_refuses_guarded_commits(b: Arc<dyn Backend>) {
    let t = task("s");
    create(&*b, &t).await;
    let d = receive(&*b, "a").await;
    let lease = lock(&*b, t.id).await;
    assert!(b
        .request_cancel(t.id, "tok", &message(&t))
        .await
        .unwrap()
        .is_none());
    let mut cur = b.load_task(t.id).await.unwrap().unwrap();
    cur.status = TaskStatus::Completed;
    let mut c = commit(&cur, &lease, Settle::Ack(&d));
    c.stored_status = TaskStatus::Pending;
    c.unless_cancelled = true;
    let refused = b.commit(c).await;
    assert!(
        matches!(refused, Err(BackendError::CancelRequested { .. })),
        "{refused:?}"
    );
    let stored = b.load_task(t.id).await.unwrap().unwrap();
    assert_eq!((stored.status, stored.version), (TaskStatus::Pending, 1));
}

/// Entries that do not decode are delivered on their own, with the reason.
pub async fn undecodable_entries_are_delivered_alone(b: Arc<dyn Backend>) {
    let t = task("s");
    b.enqueue_raw(&[0xff, 0xfe, b'x']).await.unwrap();
    create(&*b, &t).await;
    b.enqueue_raw(b"{not json").await.unwrap();
    let mut good = 0;
    let mut bad = Vec::new();
    for _ in 0..3 {
        let d = receive(&*b, "a").await;
        match &d.item {
            Ok(i) => {
                assert_eq!(*i, item(&t));
                good += 1;
            }
            Err(reason) => bad.push(reason.clone()),
        }
        b.dead_letter(&d, "bad", None).await.unwrap();
    }
    assert_eq!(good, 1);
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad.iter().all(|r| r.starts_with("malformed")), "{bad:?}");
}

/// A worker takes only the kinds of work it runs; the others stay for the
/// workers that run them. One message at a time: nothing read is left
/// waiting for the consumer.
pub async fn workers_take_only_what_they_run(b: Arc<dyn Backend>) {
    let t = task("s");
    b.enqueue(&[WorkItem::Process(envelope(1))]).await.unwrap();
    create(&*b, &t).await;
    let sagas = Interest {
        processes: false,
        ..Interest::ALL
    };
    let processes = Interest {
        sagas: false,
        ..Interest::ALL
    };
    let mut got = None;
    for _ in 0..50 {
        got = b.receive("s", sagas, WAIT).await.unwrap();
        if got.is_some() {
            break;
        }
    }
    let d = got.expect("the saga message");
    assert_eq!(d.item, Ok(item(&t)));
    assert!(b.receive("s", sagas, WAIT).await.unwrap().is_none());
    b.ack(&d).await.unwrap();
    let mut got = None;
    for _ in 0..50 {
        got = b.receive("p", processes, WAIT).await.unwrap();
        if got.is_some() {
            break;
        }
    }
    let d = got.expect("the process message");
    assert_eq!(d.item, Ok(WorkItem::Process(envelope(1))));
    b.ack(&d).await.unwrap();
    nothing_for(&*b, "x", Duration::from_millis(200)).await;
}

/// The queue's backlog, if the backend tells ([`WorkQueue::queue_stats`]
/// may answer `None`): messages not settled, waiting or in flight, by
/// kind, and the age of the oldest; settled messages and delayed ones not
/// yet due do not count.
///
/// [`WorkQueue::queue_stats`]: crate::backend::WorkQueue::queue_stats
pub async fn queue_stats_count_what_is_not_settled(b: Arc<dyn Backend>) {
    let Some(empty) = b.queue_stats().await.unwrap() else {
        return;
    };
    assert_eq!(empty, QueueStats::default(), "an empty queue");
    let (one, two) = (task("s"), task("s"));
    create(&*b, &one).await;
    create(&*b, &two).await;
    b.enqueue(&[WorkItem::Process(envelope(1))]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let depth = |s: QueueStats| (s.sagas.depth, s.processes.depth);
    let stats = b.queue_stats().await.unwrap().unwrap();
    assert_eq!(depth(stats), (2, 1));
    for oldest in [stats.sagas.oldest, stats.processes.oldest] {
        let oldest = oldest.expect("an age");
        assert!(
            oldest >= Duration::from_millis(40) && oldest < Duration::from_secs(10),
            "{oldest:?}"
        );
    }

    let total = |s: QueueStats| s.sagas.depth + s.processes.depth;
    let taken = receive(&*b, "c").await;
    let stats = b.queue_stats().await.unwrap().unwrap();
    assert_eq!(total(stats), 3, "a message being worked on counts");
    b.ack(&taken).await.unwrap();
    let stats = b.queue_stats().await.unwrap().unwrap();
    assert_eq!(total(stats), 2, "a settled one does not");
    let taken = receive(&*b, "c").await;
    b.release(&taken, Duration::from_secs(60)).await.unwrap();
    let stats = b.queue_stats().await.unwrap().unwrap();
    assert_eq!(total(stats), 1, "nor one delayed and not due yet");
    let taken = receive(&*b, "c").await;
    b.ack(&taken).await.unwrap();
    assert_eq!(
        b.queue_stats().await.unwrap().unwrap(),
        QueueStats::default(),
        "nothing left"
    );
}

/// Dead letters: parked, paged newest first, found by id, requeued; huge
/// payloads keep a prefix.
pub async fn dead_lettering_paging_and_requeue(b: Arc<dyn Backend>) {
    b.enqueue_raw(b"garbage").await.unwrap();
    let d = receive(&*b, "a").await;
    b.dead_letter(&d, "malformed", None).await.unwrap();
    nothing_for(&*b, "a", VISIBILITY * 2).await;
    let all = DeadLetterQuery {
        after: None,
        limit: 100,
    };
    let letters = b.dead_letters(&all).await.unwrap().items;
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].payload.as_str(), letters[0].reason.as_str()),
        ("garbage", "malformed")
    );
    assert_eq!(
        b.dead_letter_by_id(&letters[0].id).await.unwrap().as_ref(),
        Some(&letters[0])
    );
    let requeued = b
        .requeue_dead_letter(&letters[0].id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(requeued.payload, "garbage");
    assert!(b.dead_letters(&all).await.unwrap().items.is_empty());
    let back = receive(&*b, "a").await;
    assert_eq!(back.raw, "garbage");
    assert!(b
        .requeue_dead_letter(&letters[0].id)
        .await
        .unwrap()
        .is_none());

    // Paging: newest first, no letter twice, none missed.
    b.dead_letter(&back, "0", None).await.unwrap();
    for n in 1..5 {
        b.enqueue_raw(format!("g{n}").as_bytes()).await.unwrap();
        let d = receive(&*b, "a").await;
        b.dead_letter(&d, &n.to_string(), None).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut page = DeadLetterQuery {
        after: None,
        limit: 2,
    };
    loop {
        let got = b.dead_letters(&page).await.unwrap();
        assert!(got.items.len() <= 2);
        seen.extend(got.items.iter().map(|l| l.reason.clone()));
        match got.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ["4", "3", "2", "1", "0"]);

    // A huge payload keeps a prefix, and says how big it was.
    let huge = "x".repeat(300 * 1024);
    b.enqueue_raw(huge.as_bytes()).await.unwrap();
    let d = receive(&*b, "a").await;
    b.dead_letter(&d, "huge", None).await.unwrap();
    let newest = b.dead_letters(&all).await.unwrap().items.remove(0);
    assert_eq!(newest.truncated, Some(huge.len()));
    assert!(newest.payload.len() < huge.len() && huge.starts_with(&newest.payload));

    // Dead-lettering through commit, then resolving through commit.
    let t = task("s");
    create(&*b, &t).await;
    let d = receive(&*b, "a").await;
    let lease = lock(&*b, t.id).await;
    let mut cur = b.load_task(t.id).await.unwrap().unwrap();
    cur.status = TaskStatus::DeadLettered;
    let mut c = commit(&cur, &lease, Settle::DeadLetter(&d, "exhausted"));
    c.stored_status = TaskStatus::Pending;
    cur.version = b.commit(c).await.unwrap();
    let parked = b.dead_letters(&all).await.unwrap().items.remove(0);
    assert_eq!(parked.task_id, Some(t.id));
    let lease = lock(&*b, t.id).await;
    b.commit(commit(&cur, &lease, Settle::ResolveDeadLetter(&parked.id)))
        .await
        .unwrap();
    assert!(b.dead_letter_by_id(&parked.id).await.unwrap().is_none());
}

/// Cancellation: a flag, a notification, a wake-up message; the same
/// request retried is recognised.
pub async fn cancellation_flags_and_notifications(b: Arc<dyn Backend>) {
    let mut stream = b.cancellations().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await; // let a subscription settle
    let t = task("s");
    create(&*b, &t).await;
    let first_message = receive(&*b, "a").await;
    b.ack(&first_message).await.unwrap();

    assert!(b.cancel_requested(t.id).await.unwrap().is_none());
    let wake = message(&t);
    assert!(
        b.request_cancel(t.id, "r1", &wake).await.unwrap().is_none(),
        "first request"
    );
    let first = b.cancel_requested(t.id).await.unwrap().expect("flag set");
    assert!(
        b.request_cancel(t.id, "r1", &wake).await.unwrap().is_none(),
        "the same request retried"
    );
    assert_eq!(
        b.request_cancel(t.id, "r2", &wake).await.unwrap(),
        Some(first),
        "another request sees the first"
    );
    let notified = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap();
    assert_eq!(notified, Some(t.id));
    let woken = receive(&*b, "a").await;
    assert_eq!(woken.item, Ok(WorkItem::Saga(wake)), "the wake-up message");

    let lease = lock(&*b, t.id).await;
    let beat = b.heartbeat(&lease, &woken, TTL).await.unwrap();
    assert!(beat.lock_held && beat.cancel_requested == Some(first));
    b.unlock(&lease).await.unwrap();
    assert!(!b.heartbeat(&lease, &woken, TTL).await.unwrap().lock_held);
    let locked = b.lock_and_load(t.id, TTL).await.unwrap().unwrap();
    assert_eq!(locked.task.unwrap().id, t.id);
    assert_eq!(locked.cancel_requested, Some(first));

    let missing = TaskId::new();
    assert!(b
        .request_cancel(
            missing,
            "r",
            &QueueMessage {
                task_id: missing,
                saga: "s".into(),
                seq: 0
            }
        )
        .await
        .unwrap()
        .is_none());
    assert!(
        b.cancel_requested(missing).await.unwrap().is_none(),
        "nothing recorded for a task that does not exist"
    );
}

/// A finished task's keys and index entries go once its retention passes;
/// a task requeued from a terminal status is kept again.
pub async fn retention_removes_finished_tasks(b: Arc<dyn Backend>) {
    let retention = Retention {
        dead_letters: None,
        dead_letters_max: 1000,
        idle_consumers: Duration::from_secs(3600),
        batch: 100,
    };
    let keep = task("r");
    let gone = task("r");
    for t in [&keep, &gone] {
        create(&*b, t).await;
    }
    for _ in 0..2 {
        let d = receive(&*b, "a").await;
        b.ack(&d).await.unwrap();
    }
    for t in [&keep, &gone] {
        let lease = lock(&*b, t.id).await;
        let mut cur = b.load_task(t.id).await.unwrap().unwrap();
        cur.status = TaskStatus::DeadLettered;
        let mut c = commit(&cur, &lease, Settle::Nothing);
        c.stored_status = TaskStatus::Pending;
        c.expire_after = Some(Duration::from_millis(200));
        b.commit(c).await.unwrap();
    }
    // `keep` is requeued before it expires: it stays.
    let lease = lock(&*b, keep.id).await;
    let mut cur = b.load_task(keep.id).await.unwrap().unwrap();
    cur.status = TaskStatus::Running;
    let mut c = commit(&cur, &lease, Settle::Nothing);
    c.stored_status = TaskStatus::DeadLettered;
    b.commit(c).await.unwrap();

    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut purged = 0;
    for _ in 0..3 {
        purged += b.housekeep(&retention).await.unwrap().tasks;
    }
    assert_eq!(purged, 1);
    assert!(b.load_task(gone.id).await.unwrap().is_none());
    assert!(b
        .lock_and_load(gone.id, TTL)
        .await
        .unwrap()
        .unwrap()
        .task
        .is_none());
    let listed: Vec<TaskId> = b
        .list_tasks(&query("r"))
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(listed, [keep.id]);
    let mut dead = query("r");
    dead.status = Some(TaskStatus::DeadLettered);
    assert!(b.list_tasks(&dead).await.unwrap().is_empty());
    let mut running = query("r");
    running.status = Some(TaskStatus::Running);
    assert_eq!(b.list_tasks(&running).await.unwrap().len(), 1);
}

/// Listing pages through a saga's tasks newest first, by status and time,
/// with ties in one millisecond broken by id.
pub async fn paged_listing_by_status_and_time(b: Arc<dyn Backend>) {
    let base = Timestamp::now().0 - 10_000;
    let mut tasks = Vec::new();
    for n in 0..7u64 {
        let mut t = task("p");
        // Two pairs share a millisecond.
        t.created_at = Timestamp(base + [0, 1, 1, 2, 3, 3, 4][n as usize]);
        create(&*b, &t).await;
        tasks.push(t);
    }
    // Two of them are running.
    for t in &tasks[..2] {
        let lease = lock(&*b, t.id).await;
        let mut cur = b.load_task(t.id).await.unwrap().unwrap();
        cur.status = TaskStatus::Running;
        b.record_attempt(&cur, TaskStatus::Pending, &lease, "one:1")
            .await
            .unwrap();
    }
    let mut expected = tasks.clone();
    expected.sort_by_key(|t| std::cmp::Reverse((t.created_at, t.id)));
    let expected: Vec<TaskId> = expected.iter().map(|t| t.id).collect();

    let mut seen = Vec::new();
    let mut q = query("p");
    q.limit = 2;
    loop {
        let page = b.list_tasks(&q).await.unwrap();
        assert!(page.len() <= 2);
        seen.extend(page.iter().map(|t| t.id));
        match page.last() {
            Some(last) if page.len() == 2 => q.after = Some(TaskCursor::after(last)),
            _ => break,
        }
    }
    assert_eq!(seen, expected, "every task once, newest first");

    let mut running = query("p");
    running.status = Some(TaskStatus::Running);
    let mut ids: Vec<TaskId> = b
        .list_tasks(&running)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    ids.sort();
    let mut want: Vec<TaskId> = tasks[..2].iter().map(|t| t.id).collect();
    want.sort();
    assert_eq!(ids, want);

    let mut window = query("p");
    window.created_from = Some(Timestamp(base + 1));
    window.created_to = Some(Timestamp(base + 3));
    assert_eq!(b.list_tasks(&window).await.unwrap().len(), 3);
}

/// Dead letters beyond the cap go, oldest first.
pub async fn housekeeping_caps_dead_letters(b: Arc<dyn Backend>) {
    for n in 0..5 {
        b.enqueue_raw(format!("g{n}").as_bytes()).await.unwrap();
        let d = receive(&*b, "a").await;
        b.dead_letter(&d, &n.to_string(), None).await.unwrap();
    }
    let retention = Retention {
        dead_letters: Some(Duration::from_secs(3600)),
        dead_letters_max: 3,
        idle_consumers: Duration::from_secs(3600),
        batch: 100,
    };
    let done = b.housekeep(&retention).await.unwrap();
    assert_eq!(done.dead_letters, 2);
    let all = DeadLetterQuery {
        after: None,
        limit: 100,
    };
    let reasons: Vec<String> = b
        .dead_letters(&all)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|l| l.reason)
        .collect();
    assert_eq!(reasons, ["4", "3", "2"]);
}

fn instance(id: &str) -> ProcessInstance {
    let now = Timestamp::now();
    ProcessInstance {
        process: "pm".into(),
        id: id.into(),
        generation: format!("{id}-1"),
        started_by: None,
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
        tombstone_ttl: Duration::from_secs(3600),
        add_keys: add
            .iter()
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .collect(),
        ..ProcessCommit::new(Some(i), Settle::Nothing)
    }
}

/// Instances: optimistic versions, exclusive correlation entries, delete.
pub async fn process_instances_versions_and_correlation_entries(b: Arc<dyn Backend>) {
    let mut a = instance("a");
    // An instance lists the entries it holds (the engine keeps them so);
    // a store may find an instance by an entry only if it does.
    a.keys = vec![("order".into(), "42".into())];
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
    let mut thief = instance("b");
    thief.keys = vec![("order".into(), "42".into())];
    let stolen = b
        .process_commit("pm", write(&thief, &[("order", "42")]))
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

/// A deleted instance leaves a tombstone of the message ids it handled,
/// under its id and under the correlation entries it released: creating an
/// instance there again with one of those messages, or handling one in the
/// instance created since, is refused (a late duplicate); another message
/// is not; the tombstone expires.
pub async fn process_tombstones_refuse_late_duplicates(b: Arc<dyn Backend>) {
    let mut a = instance("t");
    // `processed` is bounded: the creating message may have left it.
    a.processed = vec!["m-1".into(), "m-2".into()];
    a.started_by = Some("m-0".into());
    let mut create = write(&a, &[("order", "7")]);
    create.handling = Some("m-1");
    b.process_commit("pm", create).await.unwrap();
    a.version = 1;
    let mut delete = write(&a, &[]);
    delete.delete = true;
    delete.remove_keys = vec![("order".into(), "7".into())];
    delete.tombstone_ttl = Duration::from_millis(400);
    b.process_commit("pm", delete).await.unwrap();

    // Under the same id.
    let again = instance("t");
    let mut late = write(&again, &[]);
    late.handling = Some("m-2");
    let refused = b.process_commit("pm", late).await;
    assert!(
        matches!(&refused, Err(BackendError::ProcessTombstoned { instance, .. }) if instance == "t"),
        "a late duplicate recreated the instance: {refused:?}"
    );
    assert!(b.process_load("pm", "t").await.unwrap().is_none());
    // Under another id that claims the released correlation entry.
    let other = instance("u");
    let mut late = write(&other, &[("order", "7")]);
    late.handling = Some("m-1");
    assert!(matches!(
        b.process_commit("pm", late).await,
        Err(BackendError::ProcessTombstoned { .. })
    ));
    let mut late = write(&again, &[]);
    late.handling = Some("m-0");
    assert!(
        matches!(
            b.process_commit("pm", late).await,
            Err(BackendError::ProcessTombstoned { .. })
        ),
        "the creating message is remembered even once `processed` forgot it"
    );
    // A new message may start it again.
    let mut fresh = write(&again, &[]);
    fresh.handling = Some("m-3");
    assert_eq!(b.process_commit("pm", fresh).await.unwrap(), 1);
    // ... and a late duplicate of what its predecessor handled does not
    // reach the new instance either.
    let mut recreated = instance("t");
    recreated.version = 1;
    let mut late = write(&recreated, &[]);
    late.handling = Some("m-2");
    assert!(
        matches!(
            b.process_commit("pm", late).await,
            Err(BackendError::ProcessTombstoned { .. })
        ),
        "the recreated instance handled its predecessor's message"
    );
    let mut next = write(&recreated, &[]);
    next.handling = Some("m-4");
    assert_eq!(b.process_commit("pm", next).await.unwrap(), 2);

    // Past the TTL the tombstone is gone.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut late = write(&other, &[("order", "7")]);
    late.handling = Some("m-1");
    assert_eq!(b.process_commit("pm", late).await.unwrap(), 1);
}

/// A shared circuit breaker: closed until `threshold` consecutive failures,
/// then open for its duration, then one probe at a time; a failed probe
/// reopens it, a successful one closes it; a success resets the count.
pub async fn shared_breakers_open_probe_once_and_close(b: Arc<dyn Backend>) {
    const OPEN: Duration = Duration::from_millis(300);
    const PROBE: Duration = Duration::from_secs(5);
    let call = |probe, counting| BreakerDecision::Call { probe, counting };
    let acquire = |token: &'static str| b.breaker_acquire("s:step", PROBE, token);
    let report = |probe: Option<&'static str>, failed| {
        b.breaker_report("s:step", probe, Some(failed), 3, OPEN)
    };
    assert_eq!(acquire("t0").await.unwrap(), call(false, false));
    assert_eq!(report(None, true).await.unwrap(), None, "one failure");
    assert_eq!(
        acquire("t0").await.unwrap(),
        call(false, true),
        "a failure is being counted: a success must report"
    );
    assert_eq!(report(None, false).await.unwrap(), None, "still closed");
    assert_eq!(
        acquire("t0").await.unwrap(),
        call(false, false),
        "the success reset the count"
    );
    assert_eq!(report(None, true).await.unwrap(), None);
    assert_eq!(report(None, true).await.unwrap(), None);
    assert_eq!(
        report(None, true).await.unwrap(),
        Some(BreakerChange::Opened),
        "the third failure in a row says it opened the breaker"
    );
    match acquire("t0").await.unwrap() {
        BreakerDecision::Open { retry_after } => assert!(
            retry_after <= OPEN && retry_after > OPEN / 2,
            "open for about the break: {retry_after:?}"
        ),
        other => panic!("the third failure in a row opens the breaker: {other:?}"),
    }
    assert_eq!(
        b.breaker_acquire("other:step", PROBE, "t0").await.unwrap(),
        call(false, false),
        "breakers are per name"
    );

    tokio::time::sleep(OPEN + Duration::from_millis(50)).await;
    assert_eq!(acquire("p1").await.unwrap(), call(true, false));
    assert!(
        matches!(acquire("p2").await.unwrap(), BreakerDecision::Open { .. }),
        "one probe at a time"
    );
    assert_eq!(
        report(Some("p1"), true).await.unwrap(),
        Some(BreakerChange::Opened),
        "a failed probe reopens"
    );
    assert!(
        matches!(acquire("p2").await.unwrap(), BreakerDecision::Open { .. }),
        "a failed probe reopens"
    );

    tokio::time::sleep(OPEN + Duration::from_millis(50)).await;
    assert_eq!(acquire("p3").await.unwrap(), call(true, false));
    // A probe that did not happen frees its slot for the next caller.
    let dropped = b.breaker_report("s:step", Some("p3"), None, 3, OPEN);
    assert_eq!(dropped.await.unwrap(), None);
    assert_eq!(acquire("p4").await.unwrap(), call(true, false));
    // A stale probe's report (its slot went to p4) changes nothing.
    assert_eq!(report(Some("p3"), false).await.unwrap(), None);
    assert!(
        matches!(acquire("p5").await.unwrap(), BreakerDecision::Open { .. }),
        "p4 is still the probe: p3's late success did not close the breaker"
    );
    assert_eq!(
        report(Some("p4"), false).await.unwrap(),
        Some(BreakerChange::Closed),
        "a successful probe closes"
    );
    assert_eq!(
        acquire("t0").await.unwrap(),
        call(false, false),
        "a successful probe closes"
    );
}

/// The outbox, scheduled timeouts moved exactly once, named leases.
pub async fn process_outbox_schedule_and_single_delivery_of_due_entries(b: Arc<dyn Backend>) {
    let i = instance("x");
    let mut c = write(&i, &[]);
    c.endpoints = vec![("billing".into(), "invoice-1".into())];
    c.schedule = vec![(1_000, envelope(1)), (5_000, envelope(2))];
    c.enqueue = vec![envelope(0)];
    b.process_commit("pm", c).await.unwrap();
    assert_eq!(b.endpoint_messages("billing").await.unwrap(), ["invoice-1"]);
    assert_eq!(
        receive(&*b, "c").await.item,
        Ok(WorkItem::Process(envelope(0)))
    );
    assert_eq!(b.process_scheduled().await.unwrap().len(), 2);

    // Two pollers racing at t=2000: the due entry moves exactly once.
    let (m1, m2) = tokio::join!(
        b.process_release_due(2_000, 10),
        b.process_release_due(2_000, 10)
    );
    assert_eq!(m1.unwrap() + m2.unwrap(), 1);
    assert_eq!(
        receive(&*b, "c").await.item,
        Ok(WorkItem::Process(envelope(1)))
    );
    assert_eq!(b.process_scheduled().await.unwrap(), [(5_000, envelope(2))]);

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

/// Tallies: opened with a commit (not twice), each item counted once,
/// exactly one completion enqueued by the check of the last item (the late
/// one once the deadline is marked), progress readable, and expiry.
pub async fn tallies_count_each_item_once_and_complete_once(b: Arc<dyn Backend>) {
    let tally = |name: &str| TallyRef {
        process: "pm".into(),
        instance: "i:1".into(),
        generation: "g1".into(),
        name: name.into(),
    };
    let done = |name: &str, late: bool| {
        let mut e = envelope(if late { 91 } else { 90 });
        e.message_id = format!("{name}-done");
        e.payload = json!({"late": late});
        e
    };
    let open = |name: &str, items: &[&str], keep: Duration| TallyOpen {
        tally: tally(name),
        items: items.iter().map(|s| s.to_string()).collect(),
        keep_for: keep,
        completion: done(name, false),
        completion_late: done(name, true),
    };
    let i = instance("i:1");
    let mut c = write(&i, &[]);
    c.tallies = vec![open(
        "items",
        &["a", "b", "c", "a"],
        Duration::from_secs(60),
    )];
    assert_eq!(b.process_commit("pm", c).await.unwrap(), 1);
    assert_eq!(
        b.tally_check(&tally("nope"), "a").await.unwrap(),
        TallyCheck::NoTally
    );
    assert_eq!(
        b.tally_progress(&tally("nope"), 10, false).await.unwrap(),
        None
    );

    // Opening it again refuses the whole write.
    let mut again = instance("i:1");
    again.version = 1;
    let mut c = write(&again, &[]);
    c.enqueue = vec![envelope(7)];
    c.tallies = vec![open("items", &["z"], Duration::from_secs(60))];
    let refused = b.process_commit("pm", c).await;
    assert!(
        matches!(&refused, Err(BackendError::TallyExists(t)) if *t == tally("items")),
        "{refused:?}"
    );
    assert_eq!(
        b.process_load("pm", "i:1").await.unwrap().unwrap().version,
        1
    );

    assert_eq!(
        b.tally_check(&tally("items"), "z").await.unwrap(),
        TallyCheck::UnknownItem
    );
    assert_eq!(
        b.tally_check(&tally("items"), "a").await.unwrap(),
        TallyCheck::Counted {
            remaining: 2,
            late: false
        }
    );
    assert_eq!(
        b.tally_check(&tally("items"), "a").await.unwrap(),
        TallyCheck::AlreadyChecked
    );
    let mut progress = b
        .tally_progress(&tally("items"), 10, false)
        .await
        .unwrap()
        .unwrap();
    progress.missing.sort();
    assert_eq!(
        progress,
        TallyProgress {
            total: 3,
            checked: 1,
            missing: vec!["b".into(), "c".into()],
            complete: false,
            deadline_passed: false,
        }
    );
    let one = b
        .tally_progress(&tally("items"), 1, false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        one.missing.len(),
        1,
        "at most as many missing items as asked"
    );

    // The deadline passes: later checks are late, and so is the completion.
    let marked = b
        .tally_progress(&tally("items"), 0, true)
        .await
        .unwrap()
        .unwrap();
    assert!(marked.deadline_passed && marked.missing.is_empty());
    assert_eq!(
        b.tally_check(&tally("items"), "b").await.unwrap(),
        TallyCheck::Counted {
            remaining: 1,
            late: true
        }
    );
    nothing_for(&*b, "c", Duration::from_millis(100)).await;
    let items = tally("items");
    let (last, dup) = tokio::join!(b.tally_check(&items, "c"), b.tally_check(&items, "c"));
    let mut answers = [last.unwrap(), dup.unwrap()];
    answers.sort_by_key(|a| matches!(a, TallyCheck::AlreadyChecked));
    assert_eq!(
        answers,
        [
            TallyCheck::Completed { late: true },
            TallyCheck::AlreadyChecked
        ]
    );
    assert_eq!(
        receive(&*b, "c").await.item,
        Ok(WorkItem::Process(done("items", true)))
    );
    nothing_for(&*b, "c", Duration::from_millis(100)).await;
    let after = b
        .tally_progress(&tally("items"), 10, true)
        .await
        .unwrap()
        .unwrap();
    assert!(after.complete && after.checked == 3 && after.missing.is_empty());

    // No items: complete at once. A short life: gone after it.
    let mut c = write(&again, &[]);
    c.tallies = vec![
        open("empty", &[], Duration::from_secs(60)),
        open("short", &["x"], Duration::from_millis(300)),
    ];
    assert_eq!(b.process_commit("pm", c).await.unwrap(), 2);
    assert_eq!(
        receive(&*b, "c").await.item,
        Ok(WorkItem::Process(done("empty", false)))
    );
    assert!(
        b.tally_progress(&tally("empty"), 1, false)
            .await
            .unwrap()
            .unwrap()
            .complete
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        b.tally_check(&tally("short"), "x").await.unwrap(),
        TallyCheck::NoTally
    );
}

/// Endpoints: each group gets every message once (a new group from the
/// oldest kept); a message its consumer leaves untouched goes to another,
/// counted; a touch keeps it; settling acknowledges or dead-letters it;
/// trimming removes what every group has settled, and nothing before.
pub async fn endpoints_deliver_to_groups_claim_settle_and_trim(b: Arc<dyn Backend>) {
    const IDLE: Duration = Duration::from_millis(150);
    const NO_WAIT: Duration = Duration::from_millis(20);
    let i = instance("e");
    let mut c = write(&i, &[]);
    c.endpoints = vec![
        ("billing".into(), "env-1".into()),
        ("billing".into(), "env-2".into()),
    ];
    b.process_commit("pm", c).await.unwrap();
    let take = |group: &'static str, consumer: &'static str| {
        let b = b.clone();
        async move {
            b.endpoint_receive("billing", group, consumer, IDLE, NO_WAIT)
                .await
                .unwrap()
        }
    };
    let first = take("g1", "c1").await.unwrap();
    assert_eq!((first.raw.as_str(), first.deliveries), ("env-1", 1));
    let second = take("g1", "c1").await.unwrap();
    assert_eq!((second.raw.as_str(), second.deliveries), ("env-2", 1));
    assert_eq!(take("g1", "c1").await, None);
    let other = take("g2", "c9").await.unwrap();
    assert_eq!(
        other.raw, "env-1",
        "a new group starts at the oldest message"
    );

    b.endpoint_settle("billing", "g1", &first, None)
        .await
        .unwrap();
    assert_eq!(
        b.endpoint_trim("billing", TTL).await.unwrap(),
        0,
        "g2 still holds env-1"
    );

    // c1 stops touching env-2: after the idle time another consumer takes it.
    tokio::time::sleep(IDLE + Duration::from_millis(50)).await;
    let claimed = take("g1", "c2").await.unwrap();
    assert_eq!((claimed.raw.as_str(), claimed.deliveries), ("env-2", 2));
    tokio::time::sleep(IDLE / 2).await;
    b.endpoint_touch("billing", "g1", "c2", &claimed.id)
        .await
        .unwrap();
    tokio::time::sleep(IDLE / 2 + Duration::from_millis(30)).await;
    assert_eq!(take("g1", "c3").await, None, "a touched message stays");
    b.endpoint_settle("billing", "g1", &claimed, Some("boom"))
        .await
        .unwrap();
    let dead = b.endpoint_dead_letters("billing").await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].payload.as_str(), dead[0].reason.as_str()),
        ("env-2", "boom")
    );
    assert_eq!(
        take("g1", "c1").await,
        None,
        "settled messages are not delivered again"
    );

    b.endpoint_settle("billing", "g2", &other, None)
        .await
        .unwrap();
    let rest = take("g2", "c9").await.unwrap();
    b.endpoint_settle("billing", "g2", &rest, None)
        .await
        .unwrap();
    assert_eq!(b.endpoint_trim("billing", TTL).await.unwrap(), 2);
    assert!(b.endpoint_messages("billing").await.unwrap().is_empty());
    assert_eq!(b.endpoint_trim("billing", TTL).await.unwrap(), 0);
    assert_eq!(b.endpoint_trim("nobody-reads-this", TTL).await.unwrap(), 0);

    let mut c = write(&i, &[]);
    c.instance = None;
    c.endpoints = vec![("billing".into(), "env-3".into())];
    b.process_commit("pm", c).await.unwrap();
    assert_eq!(take("g1", "c1").await.unwrap().raw, "env-3");
    let third = take("g2", "c9").await.unwrap();
    b.endpoint_settle("billing", "g2", &third, None)
        .await
        .unwrap();
    // A read that waits is woken by the write it waits for.
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move {
            b.endpoint_receive("billing", "g2", "c9", IDLE, Duration::from_secs(5))
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut c = write(&i, &[]);
    c.instance = None;
    c.endpoints = vec![("billing".into(), "env-4".into())];
    let started = tokio::time::Instant::now();
    b.process_commit("pm", c).await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap().raw, "env-4");
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// An idle message is taken over wherever it stands in the group's
/// pending list, even behind many that live consumers keep touching.
pub async fn endpoints_claim_an_idle_message_behind_busy_ones(b: Arc<dyn Backend>) {
    const IDLE: Duration = Duration::from_millis(200);
    let i = instance("e");
    let mut c = write(&i, &[]);
    c.endpoints = (0..16)
        .map(|n| ("jobs".to_owned(), format!("m-{n}")))
        .collect();
    b.process_commit("pm", c).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..15 {
        let d = b.endpoint_receive("jobs", "g", "busy", IDLE, Duration::ZERO);
        held.push(d.await.unwrap().unwrap());
    }
    let left = b
        .endpoint_receive("jobs", "g", "died", IDLE, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(left.raw, "m-15");
    tokio::time::sleep(IDLE + Duration::from_millis(50)).await;
    for d in &held {
        b.endpoint_touch("jobs", "g", "busy", &d.id).await.unwrap();
    }
    let taken = b
        .endpoint_receive("jobs", "g", "new", IDLE, Duration::ZERO)
        .await
        .unwrap()
        .expect("the idle message is taken over");
    assert_eq!((taken.raw.as_str(), taken.deliveries), ("m-15", 2));
}

/// Generates the conformance tests for a backend from `$factory`: an async
/// fn returning `(Arc<dyn Backend>, Guard)`, where the guard lives as long
/// as the case (a server process, a temporary directory; `()` if
/// nothing).
///
/// - `backend_conformance!(fresh)`: one `#[tokio::test]` per case, each on
///   a fresh backend.
/// - `backend_conformance!(name, in_turn: fresh, sharing: start)`: one
///   test `name` that starts what the cases share (`start().await`, kept
///   for the whole test) and runs every case in turn, each on a backend
///   from `fresh(&shared).await`: for a deployment too heavy to start once
///   per case (a cluster the cases share, each under a prefix of its
///   own). Every case runs; the test fails naming those that failed.
#[macro_export]
macro_rules! backend_conformance {
    ($($how:tt)*) => {
        $crate::__conformance_cases!(
            [$($how)*];
            create_load_and_fresh_copies,
            versions_and_concurrent_updates,
            attempt_claims,
            writes_stamp_updated_at,
            a_lease_taken_with_a_delivery_is_the_tasks_lock,
            going_on_with_a_task_records_the_next_attempt,
            the_audit_log_is_appended_and_capped,
            lock_contention_expiry_extension_and_stale_release,
            locking_a_missing_task_takes_nothing,
            stale_fence_writes_are_refused,
            redelivery_after_visibility_timeout_and_touch,
            release_is_prompt_delayed_and_answers_the_delivery,
            commit_is_atomic_enqueue_ack_and_unlock,
            an_accepted_cancellation_refuses_guarded_commits,
            undecodable_entries_are_delivered_alone,
            workers_take_only_what_they_run,
            queue_stats_count_what_is_not_settled,
            dead_lettering_paging_and_requeue,
            cancellation_flags_and_notifications,
            retention_removes_finished_tasks,
            paged_listing_by_status_and_time,
            housekeeping_caps_dead_letters,
            process_instances_versions_and_correlation_entries,
            process_tombstones_refuse_late_duplicates,
            tallies_count_each_item_once_and_complete_once,
            endpoints_deliver_to_groups_claim_settle_and_trim,
            endpoints_claim_an_idle_message_behind_busy_ones,
            shared_breakers_open_probe_once_and_close,
            process_outbox_schedule_and_single_delivery_of_due_entries,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ([$name:ident, in_turn: $factory:path, sharing: $start:path]; $($case:ident),* $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let shared = $start().await;
            let mut failed: ::std::vec::Vec<&str> = ::std::vec::Vec::new();
            $(
                let (backend, guard) = $factory(&shared).await;
                let passed = $crate::testing::conformance::run_in_turn(
                    stringify!($case),
                    $crate::testing::conformance::$case(backend),
                )
                .await;
                drop(guard);
                if !passed {
                    failed.push(stringify!($case));
                }
            )*
            assert!(failed.is_empty(), "conformance cases failed: {failed:?}");
        }
    };
    ([$factory:path]; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let (backend, _guard) = $factory().await;
                $crate::testing::conformance::$case(backend).await;
            }
        )*
    };
}

/// Runs one case of an in-turn conformance test: prints its name and
/// outcome, and catches its panic so that the cases after it still run.
#[doc(hidden)]
pub async fn run_in_turn(name: &str, case: impl std::future::Future<Output = ()>) -> bool {
    use futures::FutureExt;
    let started = std::time::Instant::now();
    let outcome = std::panic::AssertUnwindSafe(case).catch_unwind().await;
    let took = started.elapsed();
    match outcome {
        Ok(()) => {
            println!("conformance {name} ... ok ({took:.1?})");
            true
        }
        Err(_) => {
            println!("conformance {name} ... FAILED ({took:.1?})");
            false
        }
    }
}
