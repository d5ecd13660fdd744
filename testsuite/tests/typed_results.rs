//! Typed results: `wait_output::<S>` and `output::<S>` hand back
//! `S::Output` itself, or say why there is none.

use std::sync::Arc;

use saga_runtime::prelude::*;
use saga_runtime::Error;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order: u32,
    charge: String,
}

/// Charges an order; an order of 0 is declined, and step 1 is undone.
struct Checkout;

#[saga(name = "checkout")]
impl Checkout {
    #[saga_step(1)]
    async fn reserve(&self, order: u32) -> Result<u32, StepError> {
        Ok(order)
    }

    #[compensate(reserve)]
    async fn release(&self, _order: u32) -> Result<(), StepError> {
        Ok(())
    }

    #[saga_step(2)]
    async fn charge(&self, order: u32) -> Result<Receipt, StepError> {
        if order == 0 {
            return Err(StepError::permanent("card declined"));
        }
        Ok(Receipt {
            order,
            charge: format!("ch_{order}"),
        })
    }
}

/// Fails for good without compensating.
struct Strict;

#[saga(name = "strict")]
impl Strict {
    #[saga_step(1)]
    #[retry_policy(max_retries = 0, backoff = constant, base_delay_ms = 0, on_exhausted = fail)]
    async fn validate(&self, n: u32) -> Result<u32, StepError> {
        Err(StepError::transient(format!("{n} is out of range")))
    }
}

/// Runs until cancelled.
struct Endless {
    running: Arc<Notify>,
}

#[cancellable]
#[saga(name = "endless")]
impl Endless {
    #[saga_step(1)]
    async fn run(&self, n: u32, ctx: &StepContext) -> Result<u32, StepError> {
        self.running.notify_one();
        ctx.cancelled().await;
        Err(StepError::permanent(format!("stopped at {n}")))
    }
}

/// Another saga, to name the wrong one.
struct Echo;

#[saga(name = "echo")]
impl Echo {
    #[saga_step(1)]
    async fn echo(&self, s: String) -> Result<String, StepError> {
        Ok(s)
    }
}

/// Holds its only step until released.
struct Held {
    release: Arc<Notify>,
}

#[saga(name = "held")]
impl Held {
    #[saga_step(1)]
    async fn hold(&self, n: u32) -> Result<u32, StepError> {
        self.release.notified().await;
        Ok(n + 1)
    }
}

async fn engine() -> Engine {
    Engine::builder()
        .saga(Checkout)
        .saga(Echo)
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_completed_task_gives_its_output_as_the_sagas_type() {
    let engine = engine().await;
    let id = engine.start::<Checkout>(7).await.unwrap();
    let receipt: Receipt = engine.wait_output::<Checkout>(id).await.unwrap();
    assert_eq!(
        receipt,
        Receipt {
            order: 7,
            charge: "ch_7".into()
        }
    );
    // Once finished, reading it again neither waits nor changes it.
    assert_eq!(
        engine.output::<Checkout>(id).await.unwrap(),
        Some(receipt.clone())
    );
    assert_eq!(engine.wait_output::<Checkout>(id).await.unwrap(), receipt);
}

#[tokio::test]
async fn a_task_that_did_not_complete_says_how_it_ended_and_why() {
    let engine = engine().await;
    let id = engine.start::<Checkout>(0).await.unwrap();
    let error = engine.wait_output::<Checkout>(id).await.unwrap_err();
    match &error {
        Error::TaskDidNotComplete {
            id: failed,
            status,
            error,
        } => {
            assert_eq!(*failed, id);
            assert_eq!(*status, TaskStatus::Compensated);
            let why = error.as_deref().expect("the step's error is carried");
            assert!(why.contains("card declined"), "{why}");
        }
        other => panic!("expected TaskDidNotComplete, got {other:?}"),
    }
    let text = error.to_string();
    assert!(
        text.contains(&id.to_string())
            && text.contains("Compensated")
            && text.contains("step `charge` failed: card declined"),
        "{text}"
    );
    // `output` says the same once the task has ended.
    assert!(matches!(
        engine.output::<Checkout>(id).await,
        Err(Error::TaskDidNotComplete {
            status: TaskStatus::Compensated,
            ..
        })
    ));
}

#[tokio::test]
async fn a_failed_task_carries_the_steps_error() {
    let engine = Engine::builder().saga(Strict).build().await.unwrap();
    let id = engine.start::<Strict>(99).await.unwrap();
    match engine.wait_output::<Strict>(id).await {
        Err(Error::TaskDidNotComplete {
            status: TaskStatus::Failed,
            error: Some(error),
            ..
        }) => assert_eq!(error, "step `validate` failed: 99 is out of range"),
        other => panic!("expected TaskDidNotComplete, got {other:?}"),
    }
}

#[tokio::test]
async fn a_cancelled_task_carries_what_its_step_said() {
    let running = Arc::new(Notify::new());
    let engine = Engine::builder()
        .saga(Endless {
            running: running.clone(),
        })
        .build()
        .await
        .unwrap();
    let id = engine.start::<Endless>(3).await.unwrap();
    running.notified().await;
    assert_eq!(
        engine.cancel::<Endless>(id).await.unwrap(),
        CancelResult::Cancelled
    );
    match engine.wait_output::<Endless>(id).await {
        Err(Error::TaskDidNotComplete {
            status: TaskStatus::Cancelled,
            error: Some(error),
            ..
        }) => assert!(error.contains("stopped at 3"), "{error}"),
        other => panic!("expected TaskDidNotComplete, got {other:?}"),
    }
}

#[tokio::test]
async fn naming_another_saga_is_wrong_saga_even_before_the_task_ends() {
    let release = Arc::new(Notify::new());
    let engine = Engine::builder()
        .saga(Echo)
        .saga(Held {
            release: release.clone(),
        })
        .build()
        .await
        .unwrap();
    let held = engine.start::<Held>(1).await.unwrap();
    // The task is still running: the mismatch is reported at once
    // instead of after the wait.
    match engine.wait_output::<Echo>(held).await {
        Err(Error::WrongSaga {
            task,
            expected,
            actual,
        }) => {
            assert_eq!(task, held);
            assert_eq!(expected, "echo");
            assert_eq!(actual, "held");
        }
        other => panic!("expected WrongSaga, got {other:?}"),
    }
    assert!(matches!(
        engine.output::<Echo>(held).await,
        Err(Error::WrongSaga { .. })
    ));
    // Not finished: no output yet, and no error either.
    assert_eq!(engine.output::<Held>(held).await.unwrap(), None);
    release.notify_one();
    assert_eq!(engine.wait_output::<Held>(held).await.unwrap(), 2);

    let echo = engine.start::<Echo>("hi".into()).await.unwrap();
    assert_eq!(engine.wait_output::<Echo>(echo).await.unwrap(), "hi");
    assert!(matches!(
        engine.wait_output::<Held>(echo).await,
        Err(Error::WrongSaga { .. })
    ));
}

#[tokio::test]
async fn an_unknown_task_is_not_found() {
    let engine = engine().await;
    let id = TaskId::new();
    assert!(matches!(
        engine.wait_output::<Checkout>(id).await,
        Err(Error::TaskNotFound(missing)) if missing == id
    ));
    assert!(matches!(
        engine.output::<Checkout>(id).await,
        Err(Error::TaskNotFound(_))
    ));
}
