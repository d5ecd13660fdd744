//! A backend that implements only the core of the storage seam (tasks,
//! the work queue with its dead letters, housekeeping) runs sagas end to
//! end and passes the core conformance cases; an engine with a process
//! manager refuses to build on it, saying why.
//!
//! The backend here delegates to the in-memory one, method by method, so
//! that the count of what a saga-only backend must write is visible: every
//! `fn` below is a required method.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use saga_runtime::backend::memory::MemoryBackend;
use saga_runtime::backend::write::{Answer, Write};
use saga_runtime::backend::{
    Backend, BackendError, Created, DeadLetter, DeadLetterQuery, DeadLetters, Delivery, Handling,
    Heartbeat, Housekeeping, Housekept, Interest, Lease, Locked, Page, QueueMessage, Retention,
    TaskQuery, TaskStore, WorkItem, WorkQueue,
};
use saga_runtime::prelude::*;
use saga_runtime::task::Timestamp;
use serde::{Deserialize, Serialize};

/// Sagas only: no process store, no shared leases or breakers.
#[derive(Clone)]
struct SagaOnly(MemoryBackend);

#[async_trait]
impl TaskStore for SagaOnly {
    async fn create_task(
        &self,
        task: &TaskInstance,
        first: &QueueMessage,
    ) -> Result<Created, BackendError> {
        self.0.create_task(task, first).await
    }
    async fn load_task(&self, id: TaskId) -> Result<Option<TaskInstance>, BackendError> {
        self.0.load_task(id).await
    }
    async fn list_tasks(&self, query: &TaskQuery) -> Result<Vec<TaskInstance>, BackendError> {
        self.0.list_tasks(query).await
    }
    async fn lock_and_load(
        &self,
        id: TaskId,
        ttl: Duration,
    ) -> Result<Option<Locked>, BackendError> {
        self.0.lock_and_load(id, ttl).await
    }
    async fn apply(&self, write: &Write<'_>) -> Result<Answer, BackendError> {
        self.0.apply(write).await
    }
    async fn heartbeat(
        &self,
        lease: &Lease,
        delivery: &Delivery,
        ttl: Duration,
    ) -> Result<Heartbeat, BackendError> {
        self.0.heartbeat(lease, delivery, ttl).await
    }
    async fn unlock(&self, lease: &Lease) -> Result<bool, BackendError> {
        self.0.unlock(lease).await
    }
    async fn request_cancel(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
    ) -> Result<Option<Timestamp>, BackendError> {
        self.0.request_cancel(id, token, wake).await
    }
    async fn cancel_requested(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError> {
        self.0.cancel_requested(id).await
    }
    async fn cancellations(&self) -> Result<BoxStream<'static, TaskId>, BackendError> {
        self.0.cancellations().await
    }
}

#[async_trait]
impl WorkQueue for SagaOnly {
    fn visibility_timeout(&self) -> Duration {
        self.0.visibility_timeout()
    }
    async fn enqueue(&self, items: &[WorkItem]) -> Result<(), BackendError> {
        self.0.enqueue(items).await
    }
    async fn enqueue_raw(&self, payload: &[u8]) -> Result<(), BackendError> {
        self.0.enqueue_raw(payload).await
    }
    async fn receive(
        &self,
        consumer: &str,
        interest: Interest,
        wait: Duration,
    ) -> Result<Option<Delivery>, BackendError> {
        self.0.receive(consumer, interest, wait).await
    }
    async fn touch(&self, delivery: &Delivery) -> Result<(), BackendError> {
        self.0.touch(delivery).await
    }
    async fn settle_delivery(
        &self,
        delivery: &Delivery,
        how: Handling<'_>,
    ) -> Result<(), BackendError> {
        self.0.settle_delivery(delivery, how).await
    }
    async fn release_due(&self, limit: usize) -> Result<usize, BackendError> {
        self.0.release_due(limit).await
    }
}

#[async_trait]
impl DeadLetters for SagaOnly {
    async fn dead_letters(
        &self,
        query: &DeadLetterQuery,
    ) -> Result<Page<DeadLetter>, BackendError> {
        self.0.dead_letters(query).await
    }
    async fn dead_letter_by_id(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        self.0.dead_letter_by_id(id).await
    }
    async fn requeue_dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        self.0.requeue_dead_letter(id).await
    }
    async fn discard_dead_letter(&self, id: &str) -> Result<bool, BackendError> {
        self.0.discard_dead_letter(id).await
    }
}

#[async_trait]
impl Housekeeping for SagaOnly {
    async fn housekeep(&self, retention: &Retention) -> Result<Housekept, BackendError> {
        self.0.housekeep(retention).await
    }
}

/// Nothing beyond the core: every accessor keeps its `None` default.
impl Backend for SagaOnly {}

mod conformance {
    use std::sync::Arc;

    use saga_runtime::backend::memory::MemoryBackend;
    use saga_runtime::backend::Backend;
    use saga_runtime::testing::conformance::VISIBILITY;

    async fn fresh() -> (Arc<dyn Backend>, ()) {
        let memory = MemoryBackend::with_visibility_timeout(VISIBILITY);
        (Arc::new(super::SagaOnly(memory)), ())
    }

    saga_runtime::backend_conformance!(fresh, core);
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    cents: u64,
}

struct Shop {
    undone: Arc<std::sync::atomic::AtomicU32>,
}

#[saga(name = "shop")]
#[cancellable]
impl Shop {
    #[saga_step(1)]
    #[retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 10)]
    async fn reserve(&self, order: Order, ctx: &StepContext) -> Result<Order, StepError> {
        // The first attempt of every task fails: the retry goes through a
        // delayed message, the timer poller and its (in-process) lease.
        if ctx.attempt() == 1 {
            return Err(StepError::transient("not yet"));
        }
        Ok(order)
    }

    #[compensate(reserve)]
    async fn release(&self, _order: Order) -> Result<(), StepError> {
        self.undone
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 0, on_exhausted = compensate)]
    #[circuit_breaker(failure_threshold = 100, duration_secs = 1, scope = shared)]
    async fn charge(&self, order: Order) -> Result<u64, StepError> {
        match order.cents {
            0 => Err(StepError::permanent("nothing to charge")),
            1 => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(1)
            }
            cents => Ok(cents),
        }
    }
}

#[derive(Message, Serialize, Deserialize)]
struct Ping {
    #[correlation_id]
    id: String,
}

#[derive(Default, Serialize, Deserialize)]
struct Seen;

struct Pinger;

#[process_manager(name = "pinger", state = Seen)]
impl Pinger {
    #[starts]
    async fn ping(
        &self,
        _msg: Ping,
        _state: &mut Seen,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        Ok(())
    }
}

fn backend() -> Arc<dyn Backend> {
    Arc::new(SagaOnly(MemoryBackend::with_visibility_timeout(
        Duration::from_millis(500),
    )))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sagas_run_end_to_end_on_the_core_alone() {
    let undone = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let engine = Engine::builder()
        .backend_arc(backend())
        .saga(Shop {
            undone: undone.clone(),
        })
        .build()
        .await
        .unwrap();
    assert!(
        engine.process_store().is_err(),
        "no process store to hand out"
    );

    // Retried once, then completed (a shared breaker kept in this process).
    let done = engine.start::<Shop>(Order { cents: 700 }).await.unwrap();
    assert_eq!(engine.wait_output::<Shop>(done).await.unwrap(), 700);
    let task = engine.wait(done).await.unwrap();
    assert_eq!(task.steps[0].attempt_count, 2, "{task:?}");

    // A permanent failure compensates the completed step.
    let failed = engine.start::<Shop>(Order { cents: 0 }).await.unwrap();
    let task = engine.wait(failed).await.unwrap();
    assert_eq!(task.status, TaskStatus::Compensated, "{task:?}");
    assert_eq!(undone.load(std::sync::atomic::Ordering::SeqCst), 1);

    // Cancelled while its step runs: compensated too.
    let slow = engine.start::<Shop>(Order { cents: 1 }).await.unwrap();
    loop {
        let task = engine.task(slow).await.unwrap().unwrap();
        if task.steps[1].attempt_count > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        engine.cancel::<Shop>(slow).await.unwrap(),
        CancelResult::Cancelled
    );
    let task = engine.wait(slow).await.unwrap();
    assert_eq!(task.status, TaskStatus::Cancelled, "{task:?}");
    assert_eq!(undone.load(std::sync::atomic::Ordering::SeqCst), 2);
    engine.shutdown().await;
}

#[tokio::test]
async fn a_process_manager_needs_a_process_store() {
    let refused = Engine::builder()
        .backend_arc(backend())
        .process_manager(Pinger)
        .build()
        .await;
    match refused {
        Err(saga_runtime::Error::Config(why)) => {
            assert!(why.contains("stores no process managers"), "{why}")
        }
        other => panic!("expected a configuration error, got {other:?}"),
    }
}
