//! Redelivery and duplicates on the in-memory backend: a step whose
//! completion was recorded never runs again; an abandoned step resumes with
//! its attempt count intact; a panicking step is a failed attempt.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Journal;
use saga_runtime::backend::memory::MemoryBackend;
use saga_runtime::backend::{QueueMessage, WorkItem};
use saga_runtime::prelude::*;
use tokio::sync::Notify;

struct TwoSteps {
    journal: Journal,
    /// Step 2 hangs on its first call (until the worker is stopped).
    hang_once: Arc<AtomicUsize>,
    started: Arc<Notify>,
}

#[saga(name = "two-steps")]
impl TwoSteps {
    #[saga_step(1)]
    async fn first(&self, n: u32) -> Result<u32, StepError> {
        self.journal.record("first");
        Ok(n + 1)
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 10)]
    async fn second(&self, n: u32, ctx: &StepContext) -> Result<u32, StepError> {
        self.journal.record(format!("second@{}", ctx.attempt()));
        self.started.notify_one();
        if self.hang_once.fetch_add(1, Ordering::SeqCst) == 0 {
            std::future::pending::<()>().await;
        }
        Ok(n + 1)
    }
}

fn saga(journal: &Journal, hang: usize) -> (TwoSteps, Arc<Notify>) {
    let started = Arc::new(Notify::new());
    let saga = TwoSteps {
        journal: journal.clone(),
        hang_once: Arc::new(AtomicUsize::new(hang)),
        started: started.clone(),
    };
    (saga, started)
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_step_resumes_elsewhere_without_rerunning_completed_steps() {
    let backend = MemoryBackend::new();
    let journal = Journal::default();
    let (first_saga, started) = saga(&journal, 0);
    let first = Engine::builder()
        .backend(backend.clone())
        .saga(first_saga)
        .workers(1)
        .shutdown_grace(Duration::ZERO)
        .build()
        .await
        .unwrap();
    let id = first.start::<TwoSteps>(1).await.unwrap();
    started.notified().await;
    first.shutdown().await;
    drop(first);

    let (second_saga, _) = saga(&journal, 1);
    let second = Engine::builder()
        .backend(backend)
        .saga(second_saga)
        .build()
        .await
        .unwrap();
    let task = second.wait(id).await.unwrap();

    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.output_as::<u32>().unwrap().unwrap(), 3);
    assert_eq!(
        journal.labels(),
        ["first", "second@1", "second@2"],
        "step 1 ran once; step 2 resumed at attempt 2"
    );
    assert_eq!(task.steps[1].attempt_count, 2);
}

#[tokio::test(start_paused = true)]
async fn duplicate_deliveries_of_a_processed_message_change_nothing() {
    let journal = Journal::default();
    let (s, _) = saga(&journal, 1);
    let engine = Engine::builder().saga(s).build().await.unwrap();
    let id = engine.start::<TwoSteps>(1).await.unwrap();
    let before = engine.wait(id).await.unwrap();

    for seq in 0..3 {
        let duplicate = QueueMessage {
            task_id: id,
            saga: "two-steps".into(),
            seq,
        };
        engine
            .backend()
            .enqueue(&[WorkItem::Saga(duplicate)])
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(5)).await;

    assert_eq!(journal.labels(), ["first", "second@1"]);
    assert_eq!(engine.task(id).await.unwrap().unwrap(), before);
    assert!(engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters
        .is_empty());
}

struct Panicky {
    calls: Arc<AtomicUsize>,
}

#[saga]
impl Panicky {
    #[saga_step(1)]
    #[retry_policy(max_retries = 1, backoff = constant, base_delay_ms = 0)]
    async fn flaky(&self, n: u32) -> Result<u32, StepError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("index out of bounds");
        }
        Ok(n)
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_step_is_a_failed_attempt_and_the_worker_survives() {
    let calls = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .saga(Panicky {
            calls: calls.clone(),
        })
        .workers(1)
        .build()
        .await
        .unwrap();
    let task = engine
        .wait(engine.start::<Panicky>(5).await.unwrap())
        .await
        .unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.steps[0].attempt_count, 2);
    assert!(
        task.audit_log
            .iter()
            .any(|e| e.error.as_deref() == Some("step panicked: index out of bounds")),
        "{:#?}",
        task.audit_log
    );
    // The single worker is still alive.
    let again = engine
        .wait(engine.start::<Panicky>(6).await.unwrap())
        .await
        .unwrap();
    assert_eq!(again.status, TaskStatus::Completed);
}

#[tokio::test(start_paused = true)]
async fn many_tasks_on_many_workers_all_finish() {
    let journal = Journal::default();
    let (s, _) = saga(&journal, 1);
    let engine = Engine::builder().saga(s).workers(8).build().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..200 {
        ids.push(engine.start::<TwoSteps>(n).await.unwrap());
    }
    for (n, id) in ids.into_iter().enumerate() {
        let task = engine.wait(id).await.unwrap();
        assert_eq!(task.output_as::<u32>().unwrap().unwrap(), n as u32 + 2);
    }
    assert_eq!(journal.count("first"), 200);
}

#[tokio::test(start_paused = true)]
async fn an_already_claimed_attempt_is_counted_not_rerun_and_the_task_still_finishes() {
    let journal = Journal::default();
    let backend = MemoryBackend::new();
    let (s, _) = saga(&journal, 1);
    let client = Engine::builder()
        .backend(backend.clone())
        .saga(s)
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = client.start::<TwoSteps>(1).await.unwrap();
    // As if a duplicate delivery had already started attempt 1 of step 1.
    use saga_runtime::backend::TaskStore;
    let locked = backend
        .lock_and_load(id, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let task = locked.task.unwrap();
    let (_, claimed) = backend
        .record_attempt(&task, task.status, &locked.lease, "first:1")
        .await
        .unwrap()
        .expect("written");
    assert!(claimed);
    backend.unlock(&locked.lease).await.unwrap();

    let (s, _) = saga(&journal, 1);
    let _workers = Engine::builder()
        .backend(backend)
        .saga(s)
        .build()
        .await
        .unwrap();
    let task = client.wait(id).await.unwrap();
    assert_eq!(
        task.status,
        TaskStatus::Completed,
        "a claimed key never strands the task"
    );
    assert_eq!(
        journal.labels(),
        ["first", "second@1"],
        "step 1 body ran once, as attempt 2"
    );
    assert_eq!(task.steps[0].attempt_count, 2);
    assert!(task
        .audit_log
        .iter()
        .any(|e| e.action == saga_runtime::AuditAction::DuplicateAttempt && e.attempt == Some(1)));
}
