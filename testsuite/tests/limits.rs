//! Flow-control limits (`#[limit]`) on the in-memory backend, timed on
//! tokio's paused clock: a rate paces starts exactly, a concurrency limit
//! hands a freed slot on at the moment it frees, waiting spends neither a
//! retry nor the step's timeout, a parked task is cancelled at once, keys
//! keep budgets apart, and one name is one budget across steps.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use saga_runtime::prelude::*;
use saga_runtime::AuditAction;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// When each call began (ms after `t0`), and how many ran at once at most.
#[derive(Clone)]
struct Calls {
    t0: Instant,
    starts: Arc<Mutex<Vec<(String, u64)>>>,
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Calls {
    fn new() -> Self {
        Calls {
            t0: Instant::now(),
            starts: Arc::default(),
            running: Arc::default(),
            most: Arc::default(),
        }
    }

    /// Records a call of `label` that runs for `hold`.
    async fn call(&self, label: &str, hold: Duration) {
        let at = self.t0.elapsed().as_millis() as u64;
        self.starts.lock().unwrap().push((label.to_owned(), at));
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(hold).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
    }

    /// The start times of `label`'s calls, in order.
    fn starts_of(&self, label: &str) -> Vec<u64> {
        let mut at: Vec<u64> = self
            .starts
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, _)| l == label)
            .map(|(_, t)| *t)
            .collect();
        at.sort_unstable();
        at
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

struct Paced {
    calls: Calls,
}

#[saga(name = "paced")]
impl Paced {
    #[saga_step(1)]
    #[limit(rate = 10, per = "1s")]
    async fn call(&self, n: u32) -> Result<u32, StepError> {
        self.calls.call("call", Duration::ZERO).await;
        Ok(n)
    }
}

#[tokio::test(start_paused = true)]
async fn a_rate_starts_one_per_interval_exactly_in_arrival_order() {
    let calls = Calls::new();
    let engine = Engine::builder()
        .saga(Paced {
            calls: calls.clone(),
        })
        .workers(4)
        .build()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(engine.start::<Paced>(n).await.unwrap());
    }
    for id in &ids {
        let task = engine.wait(*id).await.unwrap();
        assert_eq!(task.status, TaskStatus::Completed);
        assert_eq!(task.steps[0].attempt_count, 1, "waiting is not an attempt");
    }
    assert_eq!(
        calls.starts_of("call"),
        [0, 100, 200, 300, 400, 500],
        "10 per second, burst 1: one start every 100 ms"
    );
    engine.shutdown().await;
}

struct Burst {
    calls: Calls,
}

#[saga(name = "burst")]
impl Burst {
    #[saga_step(1)]
    #[limit(rate = 5, per = "1s", burst = 3)]
    async fn call(&self, n: u32) -> Result<u32, StepError> {
        self.calls.call("call", Duration::ZERO).await;
        Ok(n)
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_starts_at_once_then_the_rate_paces_the_rest() {
    let calls = Calls::new();
    let engine = Engine::builder()
        .saga(Burst {
            calls: calls.clone(),
        })
        .workers(8)
        .build()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(engine.start::<Burst>(n).await.unwrap());
    }
    for id in ids {
        engine.wait(id).await.unwrap();
    }
    assert_eq!(calls.starts_of("call"), [0, 0, 0, 200, 400, 600]);
    engine.shutdown().await;
}

struct Slots {
    calls: Calls,
}

#[saga(name = "slots")]
impl Slots {
    #[saga_step(1, timeout_ms = 1500)]
    #[limit(concurrency = 2)]
    async fn call(&self, n: u32) -> Result<u32, StepError> {
        self.calls.call("call", Duration::from_secs(1)).await;
        Ok(n)
    }
}

#[tokio::test(start_paused = true)]
async fn a_freed_slot_goes_to_the_next_in_line_at_once_and_waiting_costs_no_timeout() {
    let calls = Calls::new();
    let engine = Engine::builder()
        .saga(Slots {
            calls: calls.clone(),
        })
        .workers(8)
        .build()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(engine.start::<Slots>(n).await.unwrap());
    }
    let mut waited = 0;
    for id in ids {
        let task = engine.wait(id).await.unwrap();
        assert_eq!(
            task.status,
            TaskStatus::Completed,
            "a wait of 2 s does not count against a 1.5 s timeout"
        );
        assert_eq!(task.steps[0].attempt_count, 1);
        let waits = task
            .audit_log
            .iter()
            .filter(|e| matches!(&e.action, AuditAction::LimitWait { limit, key: None } if limit == "slots.call"))
            .count();
        assert!(waits <= 1, "a wait is recorded once: {:#?}", task.audit_log);
        waited += waits;
    }
    assert_eq!(waited, 4, "four tasks waited");
    assert_eq!(calls.most(), 2, "never more than 2 at once");
    assert_eq!(
        calls.starts_of("call"),
        [0, 0, 1000, 1000, 2000, 2000],
        "each freed slot is taken the moment it frees"
    );
    let limits = engine.limits().await.unwrap();
    assert_eq!(limits.len(), 1);
    assert_eq!(limits[0].name, "slots.call");
    assert_eq!(limits[0].concurrency, Some(2));
    assert_eq!(limits[0].used_by, ["slots.call"]);
    let usage = limits[0].usage.expect("unkeyed");
    assert_eq!(
        (usage.in_use, usage.waiting),
        (0, 0),
        "all freed: {usage:?}"
    );
    engine.shutdown().await;
}

struct Held {
    calls: Calls,
}

#[saga(name = "held")]
#[cancellable]
impl Held {
    #[saga_step(1)]
    #[limit(concurrency = 1)]
    async fn call(&self, n: u32, ctx: &StepContext) -> Result<u32, StepError> {
        tokio::select! {
            _ = self.calls.call("call", Duration::from_secs(60)) => Ok(n),
            _ = ctx.cancelled() => Err(StepError::permanent("cancelled")),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_parked_task_is_cancelled_at_once_and_frees_its_place() {
    let calls = Calls::new();
    let engine = Engine::builder()
        .saga(Held {
            calls: calls.clone(),
        })
        .workers(4)
        .build()
        .await
        .unwrap();
    let first = engine.start::<Held>(1).await.unwrap();
    let parked = engine.start::<Held>(2).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let task = engine.task(parked).await.unwrap().unwrap();
    assert!(
        task.audit_log
            .iter()
            .any(|e| matches!(e.action, AuditAction::LimitWait { .. })),
        "the second task waits for the slot: {:#?}",
        task.audit_log
    );
    let t = Instant::now();
    assert_eq!(
        engine.cancel::<Held>(parked).await.unwrap(),
        CancelResult::Cancelled
    );
    let task = engine.wait(parked).await.unwrap();
    assert_eq!(task.status, TaskStatus::Cancelled);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "cancelled at once, not after the slot frees: {:?}",
        t.elapsed()
    );
    assert_eq!(calls.starts_of("call"), [0], "the parked task never ran");
    // A third task waits behind the cancelled one's place, which the
    // cancellation gave up: once the first ends, the slot goes to the
    // third at once (not to a reservation for the cancelled task, which
    // would hold it for a lease).
    let third = engine.start::<Held>(3).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    engine.cancel::<Held>(first).await.unwrap();
    assert_eq!(
        engine.wait(first).await.unwrap().status,
        TaskStatus::Cancelled
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let starts = calls.starts_of("call");
    assert_eq!(starts.len(), 2, "the third task started: {starts:?}");
    assert!(starts[1] < 1000, "at once: {starts:?}");
    engine.cancel::<Held>(third).await.unwrap();
    engine.wait(third).await.unwrap();
    engine.shutdown().await;
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payment {
    merchant: u32,
    amount: u64,
}

struct Psp {
    calls: Calls,
}

#[saga(name = "charge")]
impl Psp {
    #[saga_step(1)]
    #[limit(concurrency = 1, key = input.merchant, name = "psp")]
    async fn charge(&self, p: Payment) -> Result<Payment, StepError> {
        let label = format!("merchant-{}", p.merchant);
        self.calls.call(&label, Duration::from_millis(500)).await;
        Ok(p)
    }
}

struct Refunds {
    calls: Calls,
}

#[saga(name = "refund")]
impl Refunds {
    #[saga_step(1)]
    #[limit(concurrency = 1, key = input.merchant, name = "psp")]
    async fn refund(&self, p: Payment) -> Result<Payment, StepError> {
        let label = format!("merchant-{}", p.merchant);
        self.calls.call(&label, Duration::from_millis(500)).await;
        Ok(p)
    }
}

#[tokio::test(start_paused = true)]
async fn keys_keep_budgets_apart_and_a_name_is_one_budget_across_sagas() {
    let calls = Calls::new();
    let engine = Engine::builder()
        .saga(Psp {
            calls: calls.clone(),
        })
        .saga(Refunds {
            calls: calls.clone(),
        })
        .workers(8)
        .build()
        .await
        .unwrap();
    let pay = |merchant| Payment {
        merchant,
        amount: 10,
    };
    let ids = [
        engine.start::<Psp>(pay(1)).await.unwrap(),
        engine.start::<Psp>(pay(2)).await.unwrap(),
        engine.start::<Refunds>(pay(1)).await.unwrap(),
        engine.start::<Refunds>(pay(2)).await.unwrap(),
    ];
    for id in ids {
        assert_eq!(engine.wait(id).await.unwrap().status, TaskStatus::Completed);
    }
    assert_eq!(
        calls.starts_of("merchant-1"),
        [0, 500],
        "a charge and a refund of one merchant share its slot"
    );
    assert_eq!(
        calls.starts_of("merchant-2"),
        [0, 500],
        "merchant 2 does not wait for merchant 1"
    );
    let limits = engine.limits().await.unwrap();
    assert_eq!(limits.len(), 1);
    assert!(limits[0].keyed && limits[0].usage.is_none());
    assert_eq!(limits[0].used_by, ["charge.charge", "refund.refund"]);
    let usage = engine.limit_usage("psp", Some("1")).await.unwrap();
    assert_eq!(usage.in_use, 0);
    assert!(engine.limit_usage("nope", None).await.is_err());
    engine.shutdown().await;
}

struct Other {
    calls: Calls,
}

#[saga(name = "other")]
impl Other {
    #[saga_step(1)]
    #[limit(concurrency = 3, name = "psp")]
    async fn call(&self, p: Payment) -> Result<Payment, StepError> {
        self.calls.call("other", Duration::ZERO).await;
        Ok(p)
    }
}

#[tokio::test]
async fn two_declarations_of_one_name_must_agree() {
    let calls = Calls::new();
    let error = Engine::builder()
        .saga(Psp {
            calls: calls.clone(),
        })
        .saga(Other { calls })
        .build()
        .await
        .expect_err("concurrency 1 and 3 under one name");
    let text = error.to_string();
    assert!(
        text.contains("limit `psp`")
            && text.contains("charge.charge")
            && text.contains("other.call"),
        "{text}"
    );
}

#[derive(Message, Serialize, Deserialize)]
struct Reserve {
    #[correlation_id]
    order: String,
    customer: u32,
}

#[derive(Default, Serialize, Deserialize)]
struct Order {
    reserved: bool,
}

struct Fulfil {
    calls: Calls,
}

#[process_manager(name = "fulfil", state = Order)]
impl Fulfil {
    #[starts]
    #[limit(concurrency = 1, key = msg.customer)]
    async fn reserve(
        &self,
        msg: Reserve,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let label = format!("customer-{}", msg.customer);
        self.calls.call(&label, Duration::from_millis(300)).await;
        state.reserved = true;
        ctx.mark_complete();
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_handler_limit_holds_messages_back_per_key_without_losing_any() {
    let calls = Calls::new();
    let engine = Engine::builder()
        .process_manager(Fulfil {
            calls: calls.clone(),
        })
        .workers(8)
        .build()
        .await
        .unwrap();
    for n in 0..6u32 {
        engine
            .publish(Reserve {
                order: format!("o-{n}"),
                customer: n % 2,
            })
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = engine
            .process_instances::<Fulfil>()
            .await
            .unwrap()
            .iter()
            .filter(|i| i.status != saga_runtime::backend::InstanceStatus::Active)
            .count();
        if done == 6 {
            break;
        }
        assert!(Instant::now() < deadline, "{done} of 6 handled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for customer in 0..2 {
        let starts = calls.starts_of(&format!("customer-{customer}"));
        assert_eq!(starts.len(), 3, "{starts:?}");
        for pair in starts.windows(2) {
            assert!(
                pair[1] >= pair[0] + 300,
                "one at a time per customer: {starts:?}"
            );
        }
    }
    assert_eq!(calls.most(), 2, "the two customers ran side by side");
    engine.shutdown().await;
}

#[tokio::test]
async fn the_api_lists_the_limits_with_their_use() {
    let calls = Calls::new();
    let engine = Engine::builder()
        .saga(Slots {
            calls: calls.clone(),
        })
        .saga(Psp { calls })
        .build()
        .await
        .unwrap();
    let api = common::http_client::Client::serve(saga_runtime::http::router(engine.clone())).await;
    let (status, body) = api.get("/api/limits").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        serde_json::json!([
            {"name": "psp", "concurrency": 1, "rate": null, "keyed": true,
             "used_by": ["charge.charge"], "usage": null},
            {"name": "slots.call", "concurrency": 2, "rate": null, "keyed": false,
             "used_by": ["slots.call"], "usage": {"in_use": 0, "waiting": 0, "booked": 0}},
        ])
    );
    engine.shutdown().await;
}
