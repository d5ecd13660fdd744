//! [`TaskStore`](crate::backend::TaskStore): records, versions, leases with fencing, attempt claims, cancellation, listing (its guarded writes are in `writes`).

use super::*;

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
    let wins = [&r1, &r2].iter().filter(|r| matches!(r, Ok(Ok(_)))).count();
    assert_eq!(wins, 1, "{r1:?} {r2:?}");
    let loser = if matches!(r1, Ok(Ok(_))) { r2 } else { r1 };
    assert!(
        matches!(
            loser,
            Ok(Err(TaskRefusal::Conflict {
                expected: 1,
                actual: 2,
            }))
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
        .unwrap()
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
        .unwrap()
        .unwrap();
    assert!(claimed);
    cur.version = v;
    let (v2, claimed) = b
        .record_attempt(&cur, TaskStatus::Pending, &lease, "one:1")
        .await
        .unwrap()
        .unwrap();
    assert!(!claimed, "the same attempt twice");
    assert_eq!(v2, v + 1, "the write happens even when the claim is lost");
    cur.version = v2;
    let (_, claimed) = b
        .record_attempt(&cur, TaskStatus::Pending, &lease, "one:2")
        .await
        .unwrap()
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
        .unwrap()
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
    // The lease runs for the visibility timeout (`VISIBILITY`, short for
    // the redelivery cases): extend it and the message, as a worker's
    // heartbeat does, so that a busy machine cannot let it lapse while
    // the rest of this case runs.
    let beat = b.heartbeat(&locked.lease, &d, TTL).await.unwrap();
    assert!(beat.lock_held, "the taken lease is held");
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
        .unwrap()
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
        .unwrap()
        .unwrap();
    assert!(claimed);
    cur.version = v;
    cur.status = TaskStatus::Running;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (v, claimed) = b
        .record_next_attempt(next_attempt(&cur, &lease, &d, "two:1", Some(short), true))
        .await
        .unwrap()
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
        .unwrap()
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
        matches!(refused, Ok(Err(TaskRefusal::CancelRequested { .. }))),
        "{refused:?}"
    );
    assert_eq!(
        b.load_task(t.id).await.unwrap().unwrap().version,
        cur.version
    );
    let (_, claimed) = b
        .record_next_attempt(next_attempt(&cur, &lease, &d, "two:2", None, false))
        .await
        .unwrap()
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
        matches!(lost, Ok(Err(TaskRefusal::LockLost { .. }))),
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
        .unwrap()
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
        .unwrap()
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
        .unwrap()
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
        .unwrap()
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
            .unwrap()
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

    // Counts per status, all of them and only those asked for (the
    // metrics' gauge of tasks waiting for an operator).
    let mut counts = b.count_tasks("p").await.unwrap();
    counts.retain(|(_, n)| *n > 0);
    counts.sort_by_key(|(s, _)| s.as_str());
    assert_eq!(counts, [(TaskStatus::Pending, 5), (TaskStatus::Running, 2)]);
    let some = b
        .count_in_statuses(&["p", "none"], &[TaskStatus::Running, TaskStatus::Failed])
        .await
        .unwrap();
    let some: Vec<_> = some.into_iter().filter(|(_, _, n)| *n > 0).collect();
    assert_eq!(some, [("p".to_owned(), TaskStatus::Running, 2)]);
}
