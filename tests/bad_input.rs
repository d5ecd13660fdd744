//! Bad input never disappears: a malformed message, an unknown saga name or a
//! payload that does not deserialize is dead-lettered with a clear reason,
//! and the other tasks are unaffected.

use std::time::Duration;

use saga_runtime::backend::{QueueMessage, WorkItem};
use saga_runtime::prelude::*;

struct Double;

#[saga]
impl Double {
    #[saga_step(1)]
    async fn double(&self, n: u32) -> Result<u32, StepError> {
        Ok(n * 2)
    }
}

#[tokio::test(start_paused = true)]
async fn malformed_unknown_and_undeserializable_messages_are_dead_lettered() {
    let engine = Engine::builder().saga(Double).build().await.unwrap();
    let backend = engine.backend().clone();

    backend.enqueue_raw(b"{not json").await.unwrap();
    let stray = TaskId::new();
    let unknown = QueueMessage {
        task_id: stray,
        saga: "no-such-saga".into(),
        seq: 0,
    };
    backend.enqueue(&[WorkItem::Saga(unknown)]).await.unwrap();
    // A task whose stored input is not a u32 (as after an incompatible deploy).
    let bad = TaskInstance::new(
        "double",
        serde_json::json!({"n": "three"}),
        [("double".to_owned(), 1)],
    );
    let bad_id = bad.id;
    backend
        .create_task(
            &bad,
            &QueueMessage {
                task_id: bad.id,
                saga: "double".into(),
                seq: 0,
            },
        )
        .await
        .unwrap();
    let good = engine.start::<Double>(21).await.unwrap();

    let done = engine.wait(good).await.unwrap();
    assert_eq!(
        done.output_as::<u32>().unwrap().unwrap(),
        42,
        "other tasks are unaffected"
    );
    let parked = engine.wait(bad_id).await.unwrap();
    assert_eq!(parked.status, TaskStatus::DeadLettered);

    // A message for a saga this worker does not run goes back for a worker
    // that does (a rolling deploy), with growing delays; only at the
    // delivery cap is it dead-lettered.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let letters = engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    let reason = |pred: &dyn Fn(&saga_runtime::DeadLetter) -> bool| {
        letters
            .iter()
            .find(|l| pred(l))
            .map(|l| l.reason.clone())
            .expect("dead letter missing")
    };
    assert_eq!(letters.len(), 3, "{letters:#?}");
    let malformed = reason(&|l| l.payload == "{not json");
    assert!(malformed.starts_with("malformed message"), "{malformed}");
    let unknown = reason(&|l| l.task_id == Some(stray));
    assert!(
        unknown.contains("unknown saga `no-such-saga`") && unknown.contains("[double]"),
        "{unknown}"
    );
    let undeserializable = reason(&|l| l.task_id == Some(bad_id));
    assert!(
        undeserializable.contains("does not deserialize as `u32`"),
        "{undeserializable}"
    );
}

#[tokio::test(start_paused = true)]
async fn starting_an_unregistered_saga_is_an_error_not_a_lost_task() {
    let engine = Engine::builder().build().await.unwrap();
    let err = engine.start::<Double>(1).await.unwrap_err();
    assert!(
        err.to_string().contains("`double` is not registered"),
        "{err}"
    );
}
