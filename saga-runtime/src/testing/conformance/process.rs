//! [`ProcessStore`](crate::backend::ProcessStore): instances, correlation entries, tombstones, outbox and timeouts (needs [`Backend::processes`](crate::backend::Backend::processes)).

use super::*;

/// Instances: optimistic versions, exclusive correlation entries, delete.
pub async fn process_instances_versions_and_correlation_entries(b: Arc<dyn Backend>) {
    let p = process_part(&b);
    let mut a = instance("a");
    // An instance lists the entries it holds (the engine keeps them so);
    // a store may find an instance by an entry only if it does.
    a.keys = vec![("order".into(), "42".into())];
    assert_eq!(
        p.process_commit("pm", write(&a, &[("order", "42")]))
            .await
            .unwrap()
            .unwrap(),
        1
    );
    // Creating it again (version 0) conflicts: two racing starters make one instance.
    let again = p.process_commit("pm", write(&instance("a"), &[])).await;
    assert!(
        matches!(again, Ok(Err(ProcessRefusal::Conflict))),
        "{again:?}"
    );
    // Another instance cannot claim a correlation value that "a" owns.
    let mut thief = instance("b");
    thief.keys = vec![("order".into(), "42".into())];
    let stolen = p
        .process_commit("pm", write(&thief, &[("order", "42")]))
        .await;
    assert!(
        matches!(stolen, Ok(Err(ProcessRefusal::Conflict))),
        "{stolen:?}"
    );
    assert!(
        p.process_load("pm", "b").await.unwrap().is_none(),
        "a refused commit writes nothing"
    );

    let found = p.process_find("pm", "order", "42").await.unwrap().unwrap();
    assert_eq!((found.id.as_str(), found.version), ("a", 1));
    a.version = 1;
    a.state = json!({"n": 1});
    assert_eq!(
        p.process_commit("pm", write(&a, &[]))
            .await
            .unwrap()
            .unwrap(),
        2
    );
    let stale = p.process_commit("pm", write(&a, &[])).await;
    assert!(
        matches!(stale, Ok(Err(ProcessRefusal::Conflict))),
        "stale version: {stale:?}"
    );

    // Deleting releases the correlation entries.
    a.version = 2;
    let mut delete = write(&a, &[]);
    delete.delete = true;
    delete.remove_keys = vec![("order".into(), "42".into())];
    p.process_commit("pm", delete).await.unwrap().unwrap();
    assert!(p.process_load("pm", "a").await.unwrap().is_none());
    assert!(p.process_find("pm", "order", "42").await.unwrap().is_none());
    assert!(p.process_list("pm").await.unwrap().is_empty());
}

/// A deleted instance leaves a tombstone of the message ids it handled,
/// under its id and under the correlation entries it released: creating an
/// instance there again with one of those messages, or handling one in the
/// instance created since, is refused (a late duplicate); another message
/// is not; the tombstone expires.
pub async fn process_tombstones_refuse_late_duplicates(b: Arc<dyn Backend>) {
    let p = process_part(&b);
    let mut a = instance("t");
    // `processed` is bounded: the creating message may have left it.
    a.processed = vec!["m-1".into(), "m-2".into()];
    a.started_by = Some("m-0".into());
    let mut create = write(&a, &[("order", "7")]);
    create.handling = Some("m-1");
    p.process_commit("pm", create).await.unwrap().unwrap();
    a.version = 1;
    let mut delete = write(&a, &[]);
    delete.delete = true;
    delete.remove_keys = vec![("order".into(), "7".into())];
    delete.tombstone_ttl = Duration::from_millis(400);
    p.process_commit("pm", delete).await.unwrap().unwrap();

    // Under the same id.
    let again = instance("t");
    let mut late = write(&again, &[]);
    late.handling = Some("m-2");
    let refused = p.process_commit("pm", late).await;
    assert!(
        matches!(&refused, Ok(Err(ProcessRefusal::Tombstoned { instance })) if instance == "t"),
        "a late duplicate recreated the instance: {refused:?}"
    );
    assert!(p.process_load("pm", "t").await.unwrap().is_none());
    // Under another id that claims the released correlation entry.
    let other = instance("u");
    let mut late = write(&other, &[("order", "7")]);
    late.handling = Some("m-1");
    assert!(matches!(
        p.process_commit("pm", late).await,
        Ok(Err(ProcessRefusal::Tombstoned { .. }))
    ));
    let mut late = write(&again, &[]);
    late.handling = Some("m-0");
    assert!(
        matches!(
            p.process_commit("pm", late).await,
            Ok(Err(ProcessRefusal::Tombstoned { .. }))
        ),
        "the creating message is remembered even once `processed` forgot it"
    );
    // A new message may start it again.
    let mut fresh = write(&again, &[]);
    fresh.handling = Some("m-3");
    assert_eq!(p.process_commit("pm", fresh).await.unwrap().unwrap(), 1);
    // ... and a late duplicate of what its predecessor handled does not
    // reach the new instance either.
    let mut recreated = instance("t");
    recreated.version = 1;
    let mut late = write(&recreated, &[]);
    late.handling = Some("m-2");
    assert!(
        matches!(
            p.process_commit("pm", late).await,
            Ok(Err(ProcessRefusal::Tombstoned { .. }))
        ),
        "the recreated instance handled its predecessor's message"
    );
    let mut next = write(&recreated, &[]);
    next.handling = Some("m-4");
    assert_eq!(p.process_commit("pm", next).await.unwrap().unwrap(), 2);

    // Past the TTL the tombstone is gone.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut late = write(&other, &[("order", "7")]);
    late.handling = Some("m-1");
    assert_eq!(p.process_commit("pm", late).await.unwrap().unwrap(), 1);
}

/// The outbox and scheduled timeouts moved exactly once.
pub async fn process_outbox_schedule_and_single_delivery_of_due_entries(b: Arc<dyn Backend>) {
    let p = process_part(&b);
    let i = instance("x");
    let mut c = write(&i, &[]);
    c.endpoints = vec![("billing".into(), "invoice-1".into())];
    c.schedule = vec![(1_000, envelope(1)), (5_000, envelope(2))];
    c.enqueue = vec![envelope(0)];
    p.process_commit("pm", c).await.unwrap().unwrap();
    assert_eq!(p.endpoint_messages("billing").await.unwrap(), ["invoice-1"]);
    assert_eq!(
        receive(&*b, "c").await.item,
        Ok(WorkItem::Process(envelope(0)))
    );
    assert_eq!(p.process_scheduled().await.unwrap().len(), 2);

    // Two pollers racing at t=2000: the due entry moves exactly once.
    let (m1, m2) = tokio::join!(
        p.process_release_due(2_000, 10),
        p.process_release_due(2_000, 10)
    );
    assert_eq!(m1.unwrap() + m2.unwrap(), 1);
    assert_eq!(
        receive(&*b, "c").await.item,
        Ok(WorkItem::Process(envelope(1)))
    );
    assert_eq!(p.process_scheduled().await.unwrap(), [(5_000, envelope(2))]);
}

/// A continuing message held until its instance exists (see
/// [`Hold`](crate::backend::Hold)); `value` under field `field` (`None`:
/// an instance id), held until `until`.
fn held(n: u32, field: Option<&str>, value: &str, until: u64) -> Envelope {
    Envelope {
        key: Some(value.to_owned()),
        key_field: field.map(str::to_owned),
        hold_until: Some(until),
        ..envelope(n)
    }
}

/// Holds `e` for what its key names, settling `delivery` (if any).
async fn hold<'a>(
    p: &dyn ProcessBackend,
    e: &'a Envelope,
    cap: usize,
    settle: Settle<'a>,
) -> Result<u64, ProcessRefusal> {
    let commit = ProcessCommit {
        hold: Some(crate::backend::Hold {
            field: e.key_field.as_deref(),
            value: e.key.as_deref().unwrap_or_default(),
            envelope: e,
            cap,
        }),
        handling: Some(&e.message_id),
        ..ProcessCommit::new(None, settle)
    };
    p.process_commit("pm", commit).await.unwrap()
}

/// Messages held for an instance id and for a correlation value: each
/// held once (by message id) and its delivery acknowledged; the write
/// that creates the instance releases those held under its id, in the
/// order held, and the one that claims the value those held under it;
/// none is released twice, and one left alone is delivered when its hold
/// ends.
pub async fn held_messages_are_released_by_the_write_that_creates_or_claims(b: Arc<dyn Backend>) {
    let p = process_part(&b);
    let far = Timestamp::now().0 + 3_600_000;
    // Three for instance "h", one for value 9 of `order`, one for value
    // 10 (never claimed), each from a delivery it settles.
    let for_id: Vec<Envelope> = (1..=3).map(|n| held(n, None, "h", far)).collect();
    let for_order = held(4, Some("order"), "9", far);
    let left_alone = held(5, Some("order"), "10", 2_000);
    for e in for_id.iter().chain([&for_order, &left_alone]) {
        b.enqueue(&[WorkItem::Process(e.clone())]).await.unwrap();
        let d = receive(&*b, "c").await;
        assert_eq!(hold(&*p, e, 10, Settle::Ack(&d)).await, Ok(0), "{e:?}");
    }
    // Held once: the same message again is not held twice.
    assert_eq!(hold(&*p, &for_id[0], 10, Settle::Nothing).await, Ok(0));
    assert_eq!(p.process_scheduled().await.unwrap().len(), 5);
    // Every delivery was settled with its hold.
    assert!(b.receive("c", Interest::ALL, WAIT).await.unwrap().is_none());

    // Creating "h" releases its three, in order, and nothing else.
    let h = instance("h");
    p.process_commit("pm", write(&h, &[]))
        .await
        .unwrap()
        .unwrap();
    // (Each settled before the next: a store may hand out one message
    // of an instance at a time.)
    for e in &for_id {
        let d = receive(&*b, "c").await;
        assert_eq!(&expect_process(d.item.clone()), e);
        b.ack(&d).await.unwrap();
    }
    assert!(b.receive("c", Interest::ALL, WAIT).await.unwrap().is_none());
    // A later write of "h" claiming value 9 releases the one held under it.
    let mut h = instance("h");
    h.version = 1;
    h.keys = vec![("order".into(), "9".into())];
    p.process_commit("pm", write(&h, &[("order", "9")]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(expect_process(receive(&*b, "c").await.item), for_order);
    assert!(b.receive("c", Interest::ALL, WAIT).await.unwrap().is_none());
    // Released messages are no longer scheduled; the one left alone is,
    // and comes when its hold ends, once.
    assert_eq!(
        p.process_scheduled().await.unwrap(),
        [(2_000, left_alone.clone())]
    );
    assert_eq!(p.process_release_due(3_000, 10).await.unwrap(), 1);
    assert_eq!(expect_process(receive(&*b, "c").await.item), left_alone);
    assert_eq!(p.process_release_due(3_000, 10).await.unwrap(), 0);
}

/// A hold is refused, writing nothing, when what it waits for exists (a
/// conflict: the message is handled instead), when a tombstone there
/// remembers the message (a late duplicate), and past its cap.
pub async fn holds_are_refused_when_the_instance_exists_or_the_cap_is_reached(b: Arc<dyn Backend>) {
    let p = process_part(&b);
    let far = Timestamp::now().0 + 3_600_000;
    let mut a = instance("a");
    a.keys = vec![("order".into(), "1".into())];
    p.process_commit("pm", write(&a, &[("order", "1")]))
        .await
        .unwrap()
        .unwrap();
    for e in [held(1, None, "a", far), held(2, Some("order"), "1", far)] {
        let refused = hold(&*p, &e, 10, Settle::Nothing).await;
        assert_eq!(refused, Err(ProcessRefusal::Conflict), "{e:?}");
    }
    // A deleted instance's tombstone remembers what it handled.
    let mut gone = instance("gone");
    gone.processed = vec!["m-3".into()];
    p.process_commit("pm", write(&gone, &[]))
        .await
        .unwrap()
        .unwrap();
    gone.version = 1;
    let mut delete = write(&gone, &[]);
    delete.delete = true;
    p.process_commit("pm", delete).await.unwrap().unwrap();
    let late = held(3, None, "gone", far);
    assert!(
        matches!(
            hold(&*p, &late, 10, Settle::Nothing).await,
            Err(ProcessRefusal::Tombstoned { .. })
        ),
        "a late duplicate of a deleted instance's message was held"
    );
    // The cap: two held for value "full", the third refused.
    for n in 4..=5 {
        let e = held(n, Some("order"), "full", far);
        assert_eq!(hold(&*p, &e, 2, Settle::Nothing).await, Ok(0));
    }
    let third = held(6, Some("order"), "full", far);
    assert_eq!(
        hold(&*p, &third, 2, Settle::Nothing).await,
        Err(ProcessRefusal::HoldFull { held: 2 })
    );
    assert_eq!(p.process_scheduled().await.unwrap().len(), 2);
}

fn expect_process(item: Result<WorkItem, String>) -> Envelope {
    match item {
        Ok(WorkItem::Process(e)) => e,
        other => panic!("expected an envelope, got {other:?}"),
    }
}
