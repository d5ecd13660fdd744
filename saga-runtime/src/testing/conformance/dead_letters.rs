//! Dead letters: parking, paging, requeue, discard.

use super::*;

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
    cur.version = b.commit(c).await.unwrap().unwrap();
    let parked = b.dead_letters(&all).await.unwrap().items.remove(0);
    assert_eq!(parked.task_id, Some(t.id));
    let lease = lock(&*b, t.id).await;
    b.commit(commit(&cur, &lease, Settle::ResolveDeadLetter(&parked.id)))
        .await
        .unwrap()
        .unwrap();
    assert!(b.dead_letter_by_id(&parked.id).await.unwrap().is_none());
}

/// A message that never was on the queue (a broker delivery that is not
/// a message) is parked with its reason, and listed with the others; the
/// queue holds nothing of it.
pub async fn parking_what_never_was_on_the_queue(b: Arc<dyn Backend>) {
    b.park("not json at all", "the body is not JSON: expected value")
        .await
        .unwrap();
    let page = b
        .dead_letters(&DeadLetterQuery {
            after: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1, "{:?}", page.items);
    let letter = &page.items[0];
    assert_eq!(letter.payload, "not json at all");
    assert_eq!(letter.reason, "the body is not JSON: expected value");
    assert_eq!(letter.task_id, None);
    assert!(
        b.receive("c", Interest::ALL, WAIT).await.unwrap().is_none(),
        "a parked message is not delivered"
    );
}
