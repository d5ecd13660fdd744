//! What each task write lowers to: its guards in their order, its effects
//! in theirs. A store's interpreter is held to each guard and effect by
//! the conformance suite; these hold the lowering to the protocol.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::model::task::TaskId;
use crate::model::wire::QueueMessage;

fn task(status: TaskStatus) -> TaskInstance {
    let mut task = TaskInstance::new("ship", json!({}), [("pack".into(), 1)]);
    task.status = status;
    task
}

fn lease(id: TaskId) -> Lease {
    Lease {
        task_id: id,
        token: "t".into(),
        fence: 4,
    }
}

fn delivery() -> Delivery {
    Delivery {
        id: "1-0".into(),
        item: Err("unused".into()),
        raw: String::new(),
        deliveries: 1,
        consumer: "c".into(),
        lease: None,
        instance: None,
    }
}

/// The kinds of a write's effects, in order.
fn kinds(write: &Write<'_>) -> Vec<&'static str> {
    write
        .effects
        .iter()
        .map(|e| match e {
            Effect::Put { .. } => "put",
            Effect::Claim(_) => "claim",
            Effect::Renew { .. } => "renew",
            Effect::Enqueue(_) => "enqueue",
            Effect::Settle(_) => "settle",
            Effect::Retain(_) => "retain",
            Effect::Unlock => "unlock",
            Effect::Announce => "announce",
        })
        .collect()
}

#[test]
fn an_attempt_is_fenced_versioned_and_claims_its_name() {
    let task = task(TaskStatus::Running);
    let lease = lease(task.id);
    let write = Write::attempt(&task, TaskStatus::Pending, &lease, "pack#1");
    assert_eq!(write.guards, [Guard::Fence, Guard::Version]);
    assert_eq!(kinds(&write), ["put", "claim"]);
    assert!(matches!(
        write.effects[0],
        Effect::Put {
            stored_status: TaskStatus::Pending,
            ..
        }
    ));
    assert!(matches!(write.effects[1], Effect::Claim("pack#1")));
}

#[test]
fn a_next_attempt_renews_when_asked_and_is_refused_by_a_cancellation_when_asked() {
    let task = task(TaskStatus::Running);
    let lease = lease(task.id);
    let delivery = delivery();
    let mut next = NextAttempt {
        task: &task,
        stored_status: TaskStatus::Running,
        lease: &lease,
        claim: "pack#2",
        delivery: &delivery,
        renew: None,
        unless_cancelled: false,
    };
    let plain = next.write();
    assert_eq!(plain.guards, [Guard::Fence, Guard::Version]);
    assert_eq!(kinds(&plain), ["put", "claim"]);

    next.renew = Some(Duration::from_secs(30));
    next.unless_cancelled = true;
    let guarded = next.write();
    assert_eq!(
        guarded.guards,
        [Guard::Fence, Guard::Version, Guard::NotCancelled]
    );
    assert_eq!(kinds(&guarded), ["put", "claim", "renew"]);
    assert!(matches!(
        guarded.effects[2],
        Effect::Renew { ttl, delivery: d } if ttl == Duration::from_secs(30) && d.id == "1-0"
    ));
}

#[test]
fn a_commit_enqueues_settles_retains_unlocks_and_announces_an_end() {
    let ended = task(TaskStatus::Completed);
    let lease = lease(ended.id);
    let delivery = delivery();
    let commit = TaskCommit {
        task: &ended,
        stored_status: TaskStatus::Running,
        lease: &lease,
        next: None,
        settle: Settle::Ack(&delivery),
        unless_cancelled: true,
        expire_after: Some(Duration::from_secs(60)),
    };
    let write = commit.write();
    assert_eq!(
        write.guards,
        [Guard::Fence, Guard::Version, Guard::NotCancelled]
    );
    assert_eq!(
        kinds(&write),
        ["put", "settle", "retain", "unlock", "announce"]
    );
    assert!(matches!(write.effects[2], Effect::Retain(Some(d)) if d == Duration::from_secs(60)));

    let waiting = task(TaskStatus::Running);
    let next = Next {
        message: QueueMessage {
            task_id: waiting.id,
            saga: "ship".into(),
            seq: 2,
        },
        delay: Duration::from_millis(250),
    };
    let commit = TaskCommit {
        task: &waiting,
        stored_status: TaskStatus::Running,
        lease: &lease,
        next: Some(next),
        settle: Settle::Ack(&delivery),
        unless_cancelled: false,
        expire_after: None,
    };
    let write = commit.write();
    assert_eq!(write.guards, [Guard::Fence, Guard::Version]);
    // A task that goes on is not announced, and keeps its keys.
    assert_eq!(
        kinds(&write),
        ["put", "enqueue", "settle", "retain", "unlock"]
    );
    assert!(matches!(
        write.effects[1],
        Effect::Enqueue(n) if n.delay == Duration::from_millis(250) && n.message.seq == 2
    ));
    assert!(matches!(write.effects[3], Effect::Retain(None)));
    assert!(write.in_order());
}

/// Every lowering builds the shape every store applies alike; another
/// order, a repeated effect or an unfenced write is not it.
#[test]
fn the_lowerings_are_in_order_and_nothing_else_is() {
    let t = task(TaskStatus::Running);
    let lease = lease(t.id);
    let delivery = delivery();
    let attempt = Write::attempt(&t, TaskStatus::Pending, &lease, "pack:1");
    assert!(attempt.in_order());
    let next = NextAttempt {
        task: &t,
        stored_status: TaskStatus::Running,
        lease: &lease,
        claim: "pack:2",
        delivery: &delivery,
        renew: Some(Duration::from_secs(30)),
        unless_cancelled: true,
    };
    assert!(next.write().in_order());

    let mut reversed = attempt.clone();
    reversed.effects.reverse();
    assert!(!reversed.in_order(), "a claim before the put");
    let mut twice = attempt.clone();
    twice.effects.push(Effect::Claim("pack:1"));
    assert!(!twice.in_order(), "two claims");
    let mut unfenced = attempt;
    unfenced.guards.remove(0);
    assert!(!unfenced.in_order(), "not fenced");
}
