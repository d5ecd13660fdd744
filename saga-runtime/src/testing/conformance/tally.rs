//! [`Tallies`](crate::backend::Tallies) (needs [`Backend::processes`](crate::backend::Backend::processes)).

use super::*;

/// The tally of instance `i:1` named `name`.
fn tally(name: &str) -> TallyRef {
    TallyRef {
        process: "pm".into(),
        instance: "i:1".into(),
        generation: "g1".into(),
        name: name.into(),
    }
}

/// The completion a tally `name` sends (`late`: after its deadline).
fn done(name: &str, late: bool) -> Envelope {
    let mut e = envelope(if late { 91 } else { 90 });
    e.message_id = format!("{name}-done");
    e.payload = json!({"late": late});
    e
}

/// Opens the tally `name` with `items`, kept for `keep`.
fn open(name: &str, items: &[&str], keep: Duration) -> TallyOpen {
    TallyOpen {
        tally: tally(name),
        items: items.iter().map(|s| s.to_string()).collect(),
        keep_for: keep,
        completion: done(name, false),
        completion_late: done(name, true),
    }
}

/// Tallies: opened with a commit (not twice), each item counted once,
/// exactly one completion enqueued by the check of the last item (the late
/// one once the deadline is marked), progress readable.
pub async fn tallies_count_each_item_once_and_complete_once(b: Arc<dyn Backend>) {
    let p = process_part(&b);
    let i = instance("i:1");
    let mut c = write(&i, &[]);
    c.tallies = vec![open(
        "items",
        &["a", "b", "c", "a"],
        Duration::from_secs(60),
    )];
    assert_eq!(p.process_commit("pm", c).await.unwrap().unwrap(), 1);
    assert_eq!(
        p.tally_check(&tally("nope"), "a").await.unwrap(),
        TallyCheck::NoTally
    );
    assert_eq!(
        p.tally_progress(&tally("nope"), 10, false).await.unwrap(),
        None
    );

    // Opening it again refuses the whole write.
    let mut again = instance("i:1");
    again.version = 1;
    let mut c = write(&again, &[]);
    c.enqueue = vec![envelope(7)];
    c.tallies = vec![open("items", &["z"], Duration::from_secs(60))];
    let refused = p.process_commit("pm", c).await;
    assert!(
        matches!(&refused, Ok(Err(ProcessRefusal::TallyExists(t))) if *t == tally("items")),
        "{refused:?}"
    );
    assert_eq!(
        p.process_load("pm", "i:1").await.unwrap().unwrap().version,
        1
    );

    assert_eq!(
        p.tally_check(&tally("items"), "z").await.unwrap(),
        TallyCheck::UnknownItem
    );
    assert_eq!(
        p.tally_check(&tally("items"), "a").await.unwrap(),
        TallyCheck::Counted {
            remaining: 2,
            late: false
        }
    );
    assert_eq!(
        p.tally_check(&tally("items"), "a").await.unwrap(),
        TallyCheck::AlreadyChecked
    );
    let mut progress = p
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
    let one = p
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
    let marked = p
        .tally_progress(&tally("items"), 0, true)
        .await
        .unwrap()
        .unwrap();
    assert!(marked.deadline_passed && marked.missing.is_empty());
    assert_eq!(
        p.tally_check(&tally("items"), "b").await.unwrap(),
        TallyCheck::Counted {
            remaining: 1,
            late: true
        }
    );
    nothing_for(&*b, "c", Duration::from_millis(100)).await;
    let items = tally("items");
    let (last, dup) = tokio::join!(p.tally_check(&items, "c"), p.tally_check(&items, "c"));
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
    let after = p
        .tally_progress(&tally("items"), 10, true)
        .await
        .unwrap()
        .unwrap();
    assert!(after.complete && after.checked == 3 && after.missing.is_empty());
}

/// A tally with no items completes at once; one that outlives its life
/// is gone.
pub async fn tallies_without_items_complete_at_once_and_expire(b: Arc<dyn Backend>) {
    let p = process_part(&b);
    let i = instance("i:1");
    let mut c = write(&i, &[]);
    c.tallies = vec![
        open("empty", &[], Duration::from_secs(60)),
        open("short", &["x"], Duration::from_millis(300)),
    ];
    assert_eq!(p.process_commit("pm", c).await.unwrap().unwrap(), 1);
    assert_eq!(
        receive(&*b, "c").await.item,
        Ok(WorkItem::Process(done("empty", false)))
    );
    assert!(
        p.tally_progress(&tally("empty"), 1, false)
            .await
            .unwrap()
            .unwrap()
            .complete
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        p.tally_check(&tally("short"), "x").await.unwrap(),
        TallyCheck::NoTally
    );
}
