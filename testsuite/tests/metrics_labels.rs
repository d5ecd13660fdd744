//! Metrics label values come from the registered definitions only (issue
//! 23, item 5): a task record written straight into Redis, naming a saga
//! no engine runs, is parked at the delivery cap and counted under
//! `saga="other"`, not under a new label value of its own choosing (each
//! new value is a new time series in every scraper, kept for good). A
//! private redis-server; its own binary for the process's global recorder.

mod common;

use std::time::Duration;

use common::prometheus::sample;
use common::redis_server::TestRedis;
use saga_runtime::backend::QueueMessage;
use saga_runtime::prelude::*;

struct Ship;

#[saga(name = "labels-ship")]
impl Ship {
    #[saga_step(1)]
    async fn ship(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_records_saga_name_is_no_label_value() {
    let handle = saga_runtime::metrics::install().unwrap();
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .saga(Ship)
        .max_deliveries(2)
        .build()
        .await
        .unwrap();

    let forged = TaskInstance::new(
        "forged-4111-1111",
        serde_json::json!(1),
        [("ship".to_owned(), 1)],
    );
    let message = QueueMessage {
        task_id: forged.id,
        saga: forged.saga.clone(),
        seq: 0,
    };
    engine
        .backend()
        .create_task(&forged, &message)
        .await
        .unwrap();
    let good = engine.start::<Ship>(7).await.unwrap();
    assert_eq!(
        engine.wait(good).await.unwrap().status,
        TaskStatus::Completed
    );
    let parked = tokio::time::timeout(Duration::from_secs(60), engine.wait(forged.id))
        .await
        .expect("the forged task is parked at the delivery cap")
        .unwrap();
    assert_eq!(parked.status, TaskStatus::DeadLettered);

    let text = handle.render();
    assert!(
        !text.contains("forged"),
        "a record's saga name is a label:\n{text}"
    );
    assert_eq!(
        sample(
            &text,
            "saga_tasks_finished_total",
            &[("saga", "other"), ("status", "dead_lettered")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "saga_tasks_finished_total",
            &[("saga", "labels-ship"), ("status", "completed")]
        ),
        Some(1.0),
        "{text}"
    );
    engine.shutdown().await;
}
