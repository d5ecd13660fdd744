//! A step whose outcome was lost is compensated too, when its compensation
//! takes `Outcome<Output, Input>`: on the in-memory backend, under tokio's
//! paused clock, a worker dies (its workers aborted where they are) after
//! `charge` took the money and before the write that records it; the task
//! is then cancelled, or `charge` fails for good on another worker, and
//! `refund` is called with `Outcome::Unknown(order)` and the step's key,
//! before the completed `reserve` is released. A step known to have failed
//! is not compensated; a compensation that takes the step's output is not
//! called for a lost outcome (it has nothing to take); an attempt dropped
//! for ignoring its timeout is a lost outcome too.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use saga_runtime::backend::memory::MemoryBackend;
use saga_runtime::prelude::*;
use saga_runtime::AuditAction;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u32,
    cents: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    order: u32,
    id: String,
}

/// What the payment provider and the warehouse saw, in order.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    /// `charge` took `cents` under `key` (its `ctx.idempotency_key()`).
    Charged { key: String, cents: u64 },
    /// `refund` undid a charge it was given.
    RefundedCompleted { charge: String },
    /// `refund` undid by the step's key what it does not know happened.
    RefundedUnknown { key: String, order: Order },
    /// `release` gave the reservation back.
    Released(u32),
}

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Seen>>>);

impl Log {
    fn push(&self, seen: Seen) {
        self.0.lock().unwrap().push(seen);
    }
    fn seen(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }
}

/// How `charge` behaves on one engine.
#[derive(Clone, Copy, PartialEq)]
enum Charging {
    /// Takes the money, says so, then never returns: the worker dies here.
    TakeThenHang,
    /// Takes the money and returns.
    Take,
    /// Declines at once: a known failure, nothing taken.
    Decline,
    /// Takes the money, then ignores its timeout for an hour (dropped).
    TakeThenIgnoreTimeout,
}

struct Pay {
    log: Log,
    charging: Charging,
    /// Notified once `charge` took the money.
    charged: Arc<Notify>,
    ship_fails: bool,
}

#[saga(name = "pay")]
#[cancellable]
impl Pay {
    #[saga_step(1)]
    async fn reserve(&self, order: Order) -> Result<Order, StepError> {
        Ok(order)
    }

    #[compensate(reserve)]
    async fn release(&self, order: Order) -> Result<(), StepError> {
        self.log.push(Seen::Released(order.id));
        Ok(())
    }

    #[saga_step(2, timeout_ms = 1000)]
    #[retry_policy(max_retries = 1, backoff = constant, base_delay_ms = 0)]
    async fn charge(&self, order: Order, ctx: &StepContext) -> Result<Charge, StepError> {
        let take = || {
            self.log.push(Seen::Charged {
                key: ctx.idempotency_key(),
                cents: order.cents,
            })
        };
        match self.charging {
            Charging::Decline => return Err(StepError::permanent("card declined")),
            Charging::Take => take(),
            Charging::TakeThenHang => {
                take();
                self.charged.notify_one();
                std::future::pending::<()>().await;
            }
            Charging::TakeThenIgnoreTimeout if ctx.attempt() == 1 => {
                take();
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Charging::TakeThenIgnoreTimeout => return Err(StepError::permanent("card declined")),
        }
        Ok(Charge {
            order: order.id,
            id: format!("ch_{}", order.id),
        })
    }

    #[compensate(charge)]
    async fn refund(
        &self,
        out: Outcome<Charge, Order>,
        ctx: &StepContext,
    ) -> Result<(), StepError> {
        self.log.push(match out {
            Outcome::Completed(charge) => Seen::RefundedCompleted { charge: charge.id },
            Outcome::Unknown(order) => Seen::RefundedUnknown {
                key: ctx.step_idempotency_key(),
                order,
            },
        });
        Ok(())
    }

    #[saga_step(3)]
    async fn ship(&self, charge: Charge) -> Result<Charge, StepError> {
        match self.ship_fails {
            true => Err(StepError::permanent("out of stock")),
            false => Ok(charge),
        }
    }
}

/// The same payment with a compensation that takes the charge alone: it
/// has nothing to be called with for a charge whose outcome was lost.
struct PayPlain {
    log: Log,
    charged: Arc<Notify>,
}

#[saga(name = "pay-plain")]
#[cancellable]
impl PayPlain {
    #[saga_step(1)]
    async fn charge(&self, order: Order, ctx: &StepContext) -> Result<Charge, StepError> {
        self.log.push(Seen::Charged {
            key: ctx.idempotency_key(),
            cents: order.cents,
        });
        self.charged.notify_one();
        std::future::pending::<()>().await;
        Ok(Charge {
            order: order.id,
            id: format!("ch_{}", order.id),
        })
    }

    #[compensate(charge)]
    async fn refund(&self, charge: Charge) -> Result<(), StepError> {
        self.log.push(Seen::RefundedCompleted { charge: charge.id });
        Ok(())
    }
}

fn order() -> Order {
    Order { id: 7, cents: 1200 }
}

fn pay(log: &Log, charging: Charging, ship_fails: bool) -> (Pay, Arc<Notify>) {
    let charged = Arc::new(Notify::new());
    let saga = Pay {
        log: log.clone(),
        charging,
        charged: charged.clone(),
        ship_fails,
    };
    (saga, charged)
}

/// Starts a task of `saga` on an engine whose worker dies in the step
/// that notifies `charged`, after the money was taken and before anything
/// recorded it: the worker's future is dropped where it is, as a killed
/// process stops. Returns the backend left behind and the task.
async fn crash_in_charge<S>(saga: S, charged: Arc<Notify>) -> (MemoryBackend, TaskId)
where
    S: Saga<Input = Order>,
{
    let backend = MemoryBackend::new();
    let first = Engine::builder()
        .backend(backend.clone())
        .saga(saga)
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = first.start::<S>(order()).await.unwrap();
    let workers = tokio::spawn({
        let first = first.clone();
        async move { first.run_workers_until(1, std::future::pending()).await }
    });
    charged.notified().await;
    workers.abort();
    let _ = workers.await;
    drop(first);
    (backend, id)
}

/// An engine on what the dead one left, running `saga`.
async fn survivor<S: Saga>(backend: MemoryBackend, saga: S) -> Engine {
    Engine::builder()
        .backend(backend)
        .saga(saga)
        .build()
        .await
        .unwrap()
}

async fn ended(engine: &Engine, id: TaskId) -> TaskInstance {
    tokio::time::timeout(Duration::from_secs(3600), engine.wait(id))
        .await
        .expect("the task did not end within an hour of virtual time")
        .unwrap()
}

fn charged(id: TaskId) -> Seen {
    Seen::Charged {
        key: format!("{id}:charge"),
        cents: 1200,
    }
}

fn refunded_unknown(id: TaskId) -> Seen {
    Seen::RefundedUnknown {
        key: format!("{id}:charge"),
        order: order(),
    }
}

/// The compensation audited for `step`, with its details.
fn compensated_details(task: &TaskInstance, step: &str) -> Option<String> {
    task.audit_log
        .iter()
        .find(|e| e.action == AuditAction::StepCompensated && e.step.as_deref() == Some(step))
        .and_then(|e| e.details.clone())
}

#[tokio::test(start_paused = true)]
async fn a_charge_whose_outcome_was_lost_is_refunded_by_its_key_when_the_task_is_cancelled() {
    let log = Log::default();
    let (saga, charged_once) = pay(&log, Charging::TakeThenHang, false);
    let (backend, id) = crash_in_charge(saga, charged_once).await;

    let engine = survivor(backend, pay(&log, Charging::Take, false).0).await;
    assert_eq!(
        engine.cancel::<Pay>(id).await.unwrap(),
        CancelResult::Cancelled
    );
    let task = ended(&engine, id).await;

    assert_eq!(task.status, TaskStatus::Cancelled, "{task:#?}");
    assert_eq!(
        log.seen(),
        [charged(id), refunded_unknown(id), Seen::Released(7)],
        "the lost charge is refunded by the step's key, before the reservation is released"
    );
    let charge = task.step("charge").unwrap();
    assert_eq!(charge.status, StepStatus::Compensated);
    assert_eq!(charge.lost_outcomes, 1);
    assert_eq!(charge.output, None);
    assert!(compensated_details(&task, "charge").is_some_and(|d| d.contains("unknown")));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_charge_whose_outcome_was_lost_is_refunded_when_its_next_attempt_fails_for_good() {
    let log = Log::default();
    let (saga, charged_once) = pay(&log, Charging::TakeThenHang, false);
    let (backend, id) = crash_in_charge(saga, charged_once).await;

    let engine = survivor(backend, pay(&log, Charging::Decline, false).0).await;
    let task = ended(&engine, id).await;

    assert_eq!(task.status, TaskStatus::Compensated, "{task:#?}");
    assert_eq!(
        log.seen(),
        [charged(id), refunded_unknown(id), Seen::Released(7)]
    );
    let charge = task.step("charge").unwrap();
    assert_eq!(
        charge.attempt_count, 2,
        "the crashed attempt, then the declined one"
    );
    assert_eq!(charge.lost_outcomes, 1);
    assert_eq!(charge.status, StepStatus::Compensated);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_charge_known_to_have_failed_is_not_compensated() {
    let log = Log::default();
    let engine = survivor(MemoryBackend::new(), pay(&log, Charging::Decline, false).0).await;
    let id = engine.start::<Pay>(order()).await.unwrap();
    let task = ended(&engine, id).await;

    assert_eq!(task.status, TaskStatus::Compensated);
    assert_eq!(log.seen(), [Seen::Released(7)], "nothing was charged");
    let charge = task.step("charge").unwrap();
    assert_eq!(charge.status, StepStatus::Failed);
    assert_eq!((charge.attempt_count, charge.lost_outcomes), (1, 0));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_completed_charge_is_refunded_from_its_output() {
    let log = Log::default();
    let engine = survivor(MemoryBackend::new(), pay(&log, Charging::Take, true).0).await;
    let id = engine.start::<Pay>(order()).await.unwrap();
    let task = ended(&engine, id).await;

    assert_eq!(task.status, TaskStatus::Compensated);
    assert_eq!(
        log.seen(),
        [
            charged(id),
            Seen::RefundedCompleted {
                charge: "ch_7".into()
            },
            Seen::Released(7)
        ]
    );
    assert_eq!(compensated_details(&task, "charge"), None);
    engine.shutdown().await;
}

/// An attempt that ignores its timeout is dropped after the stop grace:
/// what it did is as unknown as a crashed one's.
#[tokio::test(start_paused = true)]
async fn an_attempt_dropped_for_ignoring_its_timeout_is_refunded_as_unknown() {
    let log = Log::default();
    let saga = pay(&log, Charging::TakeThenIgnoreTimeout, false).0;
    let engine = survivor(MemoryBackend::new(), saga).await;
    let id = engine.start::<Pay>(order()).await.unwrap();
    let task = ended(&engine, id).await;

    assert_eq!(task.status, TaskStatus::Compensated, "{task:#?}");
    assert_eq!(
        log.seen(),
        [charged(id), refunded_unknown(id), Seen::Released(7)]
    );
    assert_eq!(task.step("charge").unwrap().lost_outcomes, 1);
    engine.shutdown().await;
}

/// A compensation that takes the step's output is called for completed
/// steps only: a lost charge stays (and the record says it was lost).
#[tokio::test(start_paused = true)]
async fn a_compensation_that_takes_the_output_is_not_called_for_a_lost_outcome() {
    let log = Log::default();
    let charged_once = Arc::new(Notify::new());
    let saga = PayPlain {
        log: log.clone(),
        charged: charged_once.clone(),
    };
    let (backend, id) = crash_in_charge(saga, charged_once).await;
    let engine = survivor(
        backend,
        PayPlain {
            log: log.clone(),
            charged: Arc::new(Notify::new()),
        },
    )
    .await;
    assert_eq!(
        engine.cancel::<PayPlain>(id).await.unwrap(),
        CancelResult::Cancelled
    );
    let task = ended(&engine, id).await;

    assert_eq!(task.status, TaskStatus::Cancelled);
    assert_eq!(
        log.seen(),
        [charged(id)],
        "not refunded: nothing to refund from"
    );
    let charge = task.step("charge").unwrap();
    assert_eq!(
        (charge.status, charge.lost_outcomes),
        (StepStatus::Failed, 1)
    );
    engine.shutdown().await;
}
