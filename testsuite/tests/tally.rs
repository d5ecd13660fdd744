//! Tallies on the in-memory backend: through the test kit (virtual time)
//! and through the engine with concurrent checkers.

use std::time::Duration;

use saga_runtime::backend::InstanceStatus;
use saga_runtime::engine::Checked;
use saga_runtime::process::{Dispatched, TallyCheck};
use saga_runtime::testing::ProcessTest;
use saga_runtime::{Engine, Error};
use sagas_tests::batch::{Abandon, Batch, BatchStarted, Batches, Reopen};

fn started(batch: &str, items: u32) -> BatchStarted {
    BatchStarted {
        batch: batch.into(),
        items,
        deadline_secs: None,
        poll_secs: None,
    }
}

async fn state(test: &ProcessTest<Batches>, batch: &str) -> Batch {
    test.state(batch).await.expect("the batch exists")
}

#[tokio::test]
async fn the_last_check_completes_the_batch_once_and_checks_leave_the_instance_alone() {
    let mut test = ProcessTest::new(Batches);
    test.when(started("b1", 5)).await;
    let tally = state(&test, "b1").await.tally.unwrap();
    for item in ["0", "1", "2", "3"] {
        let (checked, handled) = test.check(&tally, item).await;
        assert!(
            matches!(checked, TallyCheck::Counted { late: false, .. }),
            "{checked:?}"
        );
        assert!(handled.is_empty(), "a check is not a message: {handled:?}");
        let (again, _) = test.check(&tally, item).await;
        assert_eq!(again, TallyCheck::AlreadyChecked);
    }
    assert_eq!(
        test.instance("b1").await.unwrap().version,
        1,
        "checks never wrote the instance"
    );
    assert_eq!(test.check(&tally, "9").await.0, TallyCheck::UnknownItem);
    let status = test.tally_status(&tally).await.unwrap();
    assert_eq!((status.total, status.checked), (5, 4));
    assert_eq!(status.missing, ["4"]);

    let (checked, handled) = test.check(&tally, "4").await;
    assert_eq!(checked, TallyCheck::Completed { late: false });
    assert!(
        matches!(&handled[..], [Dispatched::Handled { instance, .. }] if instance == "b1"),
        "{handled:?}"
    );
    let (dup, handled) = test.check(&tally, "4").await;
    assert_eq!(dup, TallyCheck::AlreadyChecked);
    assert!(handled.is_empty());
    let batch = state(&test, "b1").await;
    assert_eq!((batch.completions, batch.late), (1, false));
    let instance = test.instance("b1").await.unwrap();
    assert_eq!(instance.status, InstanceStatus::Completed);
    assert_eq!(instance.version, 2);
}

#[tokio::test]
async fn a_deadline_reports_what_is_missing_and_late_checks_still_count() {
    let mut test = ProcessTest::new(Batches);
    test.when(BatchStarted {
        deadline_secs: Some(60),
        ..started("b", 3)
    })
    .await;
    let tally = state(&test, "b").await.tally.unwrap();
    test.check(&tally, "0").await;
    assert!(test.advance(Duration::from_secs(59)).await.is_empty());
    let at_deadline = test.advance(Duration::from_secs(1)).await;
    assert!(
        matches!(&at_deadline[..], [Dispatched::Handled { .. }]),
        "{at_deadline:?}"
    );
    assert_eq!(
        state(&test, "b").await.missing_at_deadline,
        Some(vec!["1".to_owned(), "2".to_owned()])
    );
    assert_eq!(
        test.check(&tally, "1").await.0,
        TallyCheck::Counted {
            remaining: 1,
            late: true
        }
    );
    assert_eq!(
        test.check(&tally, "2").await.0,
        TallyCheck::Completed { late: true }
    );
    let batch = state(&test, "b").await;
    assert_eq!((batch.completions, batch.late), (1, true));
}

#[tokio::test]
async fn a_deadline_after_completion_is_not_delivered() {
    let mut test = ProcessTest::new(Batches);
    test.when(BatchStarted {
        deadline_secs: Some(60),
        ..started("b", 1)
    })
    .await;
    let tally = state(&test, "b").await.tally.unwrap();
    test.check(&tally, "0").await;
    let later = test.advance(Duration::from_secs(120)).await;
    assert!(
        matches!(&later[..], [Dispatched::Ignored { reason }] if reason.contains("completed before its deadline")),
        "{later:?}"
    );
    assert_eq!(state(&test, "b").await.missing_at_deadline, None);
}

#[tokio::test]
async fn polls_read_the_sheet_until_it_is_complete() {
    let mut test = ProcessTest::new(Batches);
    test.when(BatchStarted {
        poll_secs: Some(10),
        ..started("b", 2)
    })
    .await;
    let tally = state(&test, "b").await.tally.unwrap();
    test.advance(Duration::from_secs(10)).await;
    test.check(&tally, "0").await;
    test.advance(Duration::from_secs(10)).await;
    assert_eq!(state(&test, "b").await.polls, [(0, 2), (1, 2)]);
    assert_eq!(test.scheduled().await.len(), 1, "still polling");
    test.check(&tally, "1").await;
    // The instance completed: the next poll is ignored and not renewed.
    test.advance(Duration::from_secs(10)).await;
    assert!(test.scheduled().await.is_empty());
}

#[tokio::test]
async fn an_empty_tally_completes_at_once() {
    let mut test = ProcessTest::new(Batches);
    let outcomes = test.when(started("b", 0)).await;
    assert!(matches!(outcomes, Dispatched::Handled { .. }));
    assert_eq!(state(&test, "b").await.completions, 1);
}

#[tokio::test]
async fn opening_a_tally_twice_or_under_a_bad_name_fails_the_handler() {
    let mut test = ProcessTest::new(Batches);
    test.when(started("b", 2)).await;
    let reopened = test
        .when(Reopen {
            batch: "b".into(),
            name: "items".into(),
        })
        .await;
    assert!(
        matches!(&reopened, Dispatched::Failed { error, .. } if error.contains("already open")),
        "{reopened:?}"
    );
    let bad = test
        .when(Reopen {
            batch: "b".into(),
            name: "my items".into(),
        })
        .await;
    assert!(
        matches!(&bad, Dispatched::Failed { error, .. } if error.contains("must be 1-200 characters")),
        "{bad:?}"
    );
    let tally = state(&test, "b").await.tally.unwrap();
    assert_eq!(test.tally_status(&tally).await.unwrap().total, 2);
}

#[tokio::test]
async fn a_recreated_instance_gets_none_of_its_predecessors_tally_messages() {
    let mut test = ProcessTest::new(Batches);
    test.when(BatchStarted {
        deadline_secs: Some(60),
        ..started("b", 1)
    })
    .await;
    let old = state(&test, "b").await.tally.unwrap();
    test.when(Abandon { batch: "b".into() }).await;
    assert!(test.instance("b").await.is_none());
    test.when(started("b", 1)).await;
    let new = state(&test, "b").await.tally.unwrap();
    assert_ne!(old, new, "another generation, another tally");

    // The old tally completes, and its deadline comes: neither reaches
    // the new instance.
    let (checked, handled) = test.check(&old, "0").await;
    assert_eq!(checked, TallyCheck::Completed { late: false });
    assert!(
        matches!(&handled[..], [Dispatched::Ignored { reason }] if reason.contains("earlier instance")),
        "{handled:?}"
    );
    test.advance(Duration::from_secs(60)).await;
    assert_eq!(
        state(&test, "b").await,
        Batch {
            tally: Some(new),
            ..Batch::default()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checkers_through_the_engine_complete_once() {
    let engine = Engine::builder()
        .process_manager(Batches)
        .workers(2)
        .build()
        .await
        .unwrap();
    engine.publish(started("b", 2_000)).await.unwrap();
    let tally = loop {
        if let Some(Batch { tally: Some(t), .. }) =
            engine.process_state::<Batches>("b").await.unwrap()
        {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let checkers = (0..4).map(|w| {
        let (engine, tally) = (engine.clone(), tally.clone());
        tokio::spawn(async move {
            let mut completed = 0;
            // Every checker does every item: 3 of every 4 checks are
            // duplicates.
            for i in (0..2_000).map(|i| (i + w * 500) % 2_000) {
                match engine.tally(&tally).check(i.to_string()).await.unwrap() {
                    Checked::Completed { .. } => completed += 1,
                    Checked::Counted { .. } | Checked::AlreadyChecked => {}
                }
            }
            completed
        })
    });
    let completed: u32 = futures::future::join_all(checkers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .sum();
    assert_eq!(completed, 1);
    let err = engine.tally(&tally).check("2000").await.unwrap_err();
    assert!(matches!(err, Error::UnknownTallyItem { .. }), "{err}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let instance = loop {
        let i = engine
            .process_instance::<Batches>("b")
            .await
            .unwrap()
            .unwrap();
        if i.status == InstanceStatus::Completed || tokio::time::Instant::now() > deadline {
            break i;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(instance.status, InstanceStatus::Completed);
    assert_eq!(
        instance.version, 2,
        "8,000 checks, and only the completion wrote it"
    );
    let status = engine.tally(&tally).status().await.unwrap();
    assert!(status.complete && status.checked == 2_000, "{status:?}");
    engine.shutdown().await;
}
