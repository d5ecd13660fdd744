//! [`TaskStore`](crate::backend::TaskStore)'s guarded writes: a stale fence,
//! an atomic commit, an accepted cancellation, and the order in which a
//! write's guards are checked (fence, version, cancellation).

use super::*;

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
        matches!(stale, Ok(Err(TaskRefusal::LockLost { .. }))),
        "{stale:?}"
    );
    let d = receive(&*b, "c").await;
    let stale = b.commit(commit(&cur, &old, Settle::Ack(&d))).await;
    assert!(
        matches!(stale, Ok(Err(TaskRefusal::LockLost { .. }))),
        "{stale:?}"
    );
    assert!(matches!(
        b.commit(commit(&cur, &new, Settle::Ack(&d))).await,
        Ok(Ok(_))
    ));
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
    assert_eq!(b.commit(c).await.unwrap().unwrap(), 2);
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
    b.commit(c).await.unwrap().unwrap();
    nothing_for(&*b, "a", delay / 2).await;
    let late = receive(&*b, "a").await;
    assert!(start.elapsed() >= delay, "{:?}", start.elapsed());
    assert_eq!(late.item, Ok(item(&cur)));
    assert_eq!(late.deliveries, 1);
    b.ack(&late).await.unwrap();
    nothing_for(&*b, "a", VISIBILITY * 2).await;
}

/// A task whose message is delivered and whose lease is held, when its
/// cancellation is requested: what a worker meets when a cancellation
/// lands mid-step.
async fn cancelled_under_lease(b: &dyn Backend) -> (TaskInstance, Delivery, Lease) {
    let t = task("s");
    create(b, &t).await;
    let d = receive(b, "a").await;
    let lease = lock(b, t.id).await;
    assert!(b
        .request_cancel(t.id, "tok", &message(&t))
        .await
        .unwrap()
        .is_none());
    (t, d, lease)
}

/// A commit with `unless_cancelled` is refused once cancellation was
/// requested, and writes nothing.
pub async fn an_accepted_cancellation_refuses_guarded_commits(b: Arc<dyn Backend>) {
    let (t, d, lease) = cancelled_under_lease(&*b).await;
    let mut cur = b.load_task(t.id).await.unwrap().unwrap();
    cur.status = TaskStatus::Completed;
    let mut c = commit(&cur, &lease, Settle::Ack(&d));
    c.stored_status = TaskStatus::Pending;
    c.unless_cancelled = true;
    let refused = b.commit(c).await;
    assert!(
        matches!(refused, Ok(Err(TaskRefusal::CancelRequested { .. }))),
        "{refused:?}"
    );
    let stored = b.load_task(t.id).await.unwrap().unwrap();
    assert_eq!((stored.status, stored.version), (TaskStatus::Pending, 1));
}

/// A write's guards are checked in one order on every store, before any
/// effect: the fence, then the version, then the cancellation
/// (`backend::write::Guard`). A write that fails several is refused by
/// the first (a worker that lost its lease learns that, not that the
/// record moved on under its successor), and each refusal writes nothing:
/// not the record, not the next message, not the settling of the one
/// handled.
pub async fn a_writes_guards_are_checked_fence_version_cancellation(b: Arc<dyn Backend>) {
    let t = task("s");
    create(&*b, &t).await;
    let d = receive(&*b, "a").await;
    let old = b
        .lock_and_load(t.id, Duration::from_millis(100))
        .await
        .unwrap()
        .unwrap()
        .lease;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let new = lock(&*b, t.id).await;
    assert!(b
        .request_cancel(t.id, "tok", &message(&t))
        .await
        .unwrap()
        .is_none());
    let wake = receive(&*b, "a").await;
    b.ack(&wake).await.unwrap();
    let mut stale = b.load_task(t.id).await.unwrap().unwrap();
    stale.version += 7;
    stale.status = TaskStatus::Running;
    stale.seq += 1;
    let fresh = {
        let mut fresh = stale.clone();
        fresh.version -= 7;
        fresh
    };
    type Expected = fn(&TaskRefusal) -> bool;
    let cases: [(&str, &TaskInstance, &Lease, Expected); 3] = [
        ("a stale fence, version and flag", &stale, &old, |r| {
            matches!(r, TaskRefusal::LockLost { .. })
        }),
        ("a stale version and flag", &stale, &new, |r| {
            matches!(r, TaskRefusal::Conflict { .. })
        }),
        ("the flag alone", &fresh, &new, |r| {
            matches!(r, TaskRefusal::CancelRequested { .. })
        }),
    ];
    for (case, task, lease, expected) in cases {
        let mut c = commit(task, lease, Settle::Ack(&d));
        c.stored_status = TaskStatus::Pending;
        c.unless_cancelled = true;
        c.next = Some(Next {
            message: message(task),
            delay: Duration::ZERO,
        });
        let refused = b.commit(c).await.unwrap();
        assert!(refused.as_ref().is_err_and(expected), "{case}: {refused:?}");
        let next = NextAttempt {
            task,
            stored_status: TaskStatus::Pending,
            lease,
            claim: "one:1",
            delivery: &d,
            renew: Some(TTL),
            unless_cancelled: true,
        };
        let refused = b.record_next_attempt(next).await.unwrap();
        assert!(
            refused.as_ref().is_err_and(expected),
            "{case}, going on: {refused:?}"
        );
        let stored = b.load_task(t.id).await.unwrap().unwrap();
        assert_eq!(
            (stored.status, stored.version, stored.seq),
            (TaskStatus::Pending, 1, t.seq),
            "{case}: the record was written"
        );
    }
    // Nothing was enqueued, and the message handled is still unsettled:
    // once its visibility timeout passes it comes back.
    let again = receive(&*b, "a").await;
    assert_eq!(again.item, d.item);
    assert!(again.deliveries >= 2, "{again:?}");
    b.ack(&again).await.unwrap();
    nothing_for(&*b, "a", VISIBILITY * 2).await;
    // The claim of the refused attempt was not taken either.
    let (_, claimed) = b
        .record_attempt(&fresh, TaskStatus::Pending, &new, "one:1")
        .await
        .unwrap()
        .unwrap();
    assert!(claimed, "a refused write took the attempt's claim");
}

/// A commit not guarded by cancellation enqueues its next message after
/// the delay it gives, cancellation requested or not: whether a
/// cancellation cuts a wait short is the engine's decision (it guards the
/// commit and is refused), never the store's. A store that enqueued it at
/// once retried the compensations of a cancelled task back to back.
pub async fn a_commit_keeps_its_delay_whatever_the_cancellation_flag(b: Arc<dyn Backend>) {
    let (t, d, lease) = cancelled_under_lease(&*b).await;
    // The wake-up the request enqueued.
    let wake = receive(&*b, "a").await;
    b.ack(&wake).await.unwrap();
    let mut cur = b.load_task(t.id).await.unwrap().unwrap();
    cur.status = TaskStatus::Compensating;
    cur.cancelled_at = Some(Timestamp::now());
    cur.seq += 1;
    let delay = Duration::from_millis(400);
    let mut c = commit(&cur, &lease, Settle::Ack(&d));
    c.stored_status = TaskStatus::Pending;
    c.next = Some(Next {
        message: message(&cur),
        delay,
    });
    let start = tokio::time::Instant::now();
    b.commit(c).await.unwrap().unwrap();
    nothing_for(&*b, "a", delay / 2).await;
    let late = receive(&*b, "a").await;
    assert!(
        start.elapsed() >= delay,
        "delivered {:?} after a commit that asked for {delay:?}",
        start.elapsed()
    );
    assert_eq!(late.item, Ok(item(&cur)));
    b.ack(&late).await.unwrap();
}

/// A write does what its effects say and nothing more: a store applies
/// each effect only when the write carries it (`backend::write::Effect`),
/// never bundling one with another (a put that also releases the lease, a
/// settling that also unlocks). Driven through `TaskStore::apply`, the one
/// write a store implements.
pub async fn each_effect_is_applied_only_when_the_write_carries_it(b: Arc<dyn Backend>) {
    use crate::backend::write::{Applied, Effect, Guard, Write};

    let t = task("s");
    create(&*b, &t).await;
    let d = receive(&*b, "a").await;
    let lease = lock(&*b, t.id).await;
    let mut cur = b.load_task(t.id).await.unwrap().unwrap();
    let guards = vec![Guard::Fence, Guard::Version];
    fn put(task: &TaskInstance, stored_status: TaskStatus) -> Effect<'_> {
        Effect::Put {
            task,
            stored_status,
        }
    }

    // A put alone: the record moves on; the lease and the message stay.
    cur.status = TaskStatus::Running;
    let write = Write {
        task: &cur,
        lease: &lease,
        guards: guards.clone(),
        effects: vec![put(&cur, TaskStatus::Pending)],
    };
    let applied = b.apply(&write).await.unwrap();
    assert_eq!(
        applied,
        Ok(Applied {
            version: cur.version + 1,
            claimed: false
        }),
        "a write without a claim claims nothing"
    );
    cur.version += 1;
    assert!(
        b.lock_and_load(t.id, TTL).await.unwrap().is_none(),
        "a put released the lease"
    );
    let again = receive(&*b, "a").await;
    assert_eq!(again.item, d.item, "a put settled the message");

    // A settling without an unlock: the message goes, the lease stays.
    let write = Write {
        task: &cur,
        lease: &lease,
        guards: guards.clone(),
        effects: vec![
            put(&cur, TaskStatus::Running),
            Effect::Settle(Settle::Ack(&again)),
        ],
    };
    b.apply(&write).await.unwrap().unwrap();
    cur.version += 1;
    assert!(
        b.lock_and_load(t.id, TTL).await.unwrap().is_none(),
        "settling a message released the lease"
    );
    nothing_for(&*b, "a", VISIBILITY * 2).await;

    // An unlock: the lease goes, and nothing was enqueued.
    let write = Write {
        task: &cur,
        lease: &lease,
        guards,
        effects: vec![put(&cur, TaskStatus::Running), Effect::Unlock],
    };
    b.apply(&write).await.unwrap().unwrap();
    let next = lock(&*b, t.id).await;
    assert!(next.fence > lease.fence);
    nothing_for(&*b, "a", WAIT * 4).await;
    let stored = b.load_task(t.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.version),
        (TaskStatus::Running, cur.version + 1)
    );
}

/// A write that puts no record (a claim alone, a renewal alone) leaves the
/// task's version as it was and still takes its claim, in every record
/// layout: what a write stores is its effects', never more or less.
pub async fn a_write_that_puts_nothing_keeps_the_version_and_still_claims(b: Arc<dyn Backend>) {
    use crate::backend::write::{Applied, Effect, Guard, Write};

    let t = task("s");
    create(&*b, &t).await;
    let d = receive(&*b, "a").await;
    let lease = lock(&*b, t.id).await;
    let cur = b.load_task(t.id).await.unwrap().unwrap();
    let write = |effects| Write {
        task: &cur,
        lease: &lease,
        guards: vec![Guard::Fence, Guard::Version],
        effects,
    };
    let claimed = b.apply(&write(vec![Effect::Claim("one:1")])).await.unwrap();
    assert_eq!(
        claimed,
        Ok(Applied {
            version: cur.version,
            claimed: true
        })
    );
    let renewed = b
        .apply(&write(vec![Effect::Renew {
            delivery: &d,
            ttl: TTL,
        }]))
        .await
        .unwrap();
    assert_eq!(
        renewed.map(|a| a.version),
        Ok(cur.version),
        "the version is the stored one, so the next write is based on it"
    );
    let stored = b.load_task(t.id).await.unwrap().unwrap();
    assert_eq!(stored.version, cur.version);
    let (_, again) = b
        .record_attempt(&cur, TaskStatus::Pending, &lease, "one:1")
        .await
        .unwrap()
        .unwrap();
    assert!(!again, "the claim taken without a put was not kept");
}
