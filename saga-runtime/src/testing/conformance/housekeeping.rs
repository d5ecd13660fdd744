//! [`Housekeeping`](crate::backend::Housekeeping): retention of tasks and dead letters.

use super::*;

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
        b.commit(c).await.unwrap().unwrap();
    }
    // `keep` is requeued before it expires: it stays.
    let lease = lock(&*b, keep.id).await;
    let mut cur = b.load_task(keep.id).await.unwrap().unwrap();
    cur.status = TaskStatus::Running;
    let mut c = commit(&cur, &lease, Settle::Nothing);
    c.stored_status = TaskStatus::DeadLettered;
    b.commit(c).await.unwrap().unwrap();

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
