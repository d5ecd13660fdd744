//! [`WorkQueue`](crate::backend::WorkQueue): visibility, hand-backs, bad entries, interests, backlog.

use super::*;

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
