//! `#[circuit_breaker(scope = shared, when_open = wait)]` on every store,
//! with two engines standing in for two machines: the breaker opens for
//! both after the threshold counted across both, lets one probe through
//! per break across both, and the tasks that met it are parked (no retry
//! spent, nothing compensated) and finish once it closes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use saga_runtime::prelude::*;
use saga_runtime::AuditAction;

use crate::common::stores::ScenarioStore;

/// The dependency both engines call: up or down, and every call it got.
#[derive(Default)]
struct Service {
    up: AtomicBool,
    calls: Mutex<Vec<(Instant, &'static str, bool)>>,
}

impl Service {
    /// A call from `engine`, recorded: refused while down.
    fn call(&self, engine: &'static str) -> Result<(), StepError> {
        let up = self.up.load(Ordering::SeqCst);
        self.calls
            .lock()
            .unwrap()
            .push((Instant::now(), engine, up));
        match up {
            true => Ok(()),
            false => Err(StepError::transient("connection refused")),
        }
    }
}

struct Notify {
    service: Arc<Service>,
    engine: &'static str,
}

#[saga(name = "notify")]
impl Notify {
    #[saga_step(1)]
    #[retry_policy(max_retries = 20, backoff = constant, base_delay_ms = 20)]
    #[circuit_breaker(failure_threshold = 3, duration_secs = 1, scope = shared, when_open = wait)]
    async fn send(&self, n: u32) -> Result<u32, StepError> {
        self.service.call(self.engine).map(|()| n)
    }

    #[compensate(send)]
    async fn unsend(&self, _n: u32) -> Result<(), StepError> {
        Ok(())
    }
}

async fn engine<S: ScenarioStore>(store: &S, service: &Arc<Service>, name: &'static str) -> Engine {
    Engine::builder()
        .backend_arc(store.backend(Duration::from_secs(30)).await)
        .saga(Notify {
            service: service.clone(),
            engine: name,
        })
        .timeout_poll_interval(Duration::from_millis(20))
        .worker_concurrency(4)
        .workers(1)
        .build()
        .await
        .unwrap()
}

pub async fn a_shared_breaker_opens_and_probes_across_engines_and_parked_tasks_finish<
    S: ScenarioStore,
>() {
    let store = S::start();
    let service = Arc::new(Service::default());
    let a = engine(&store, &service, "a").await;
    let b = engine(&store, &service, "b").await;
    let mut ids = Vec::new();
    for n in 0..8 {
        let engine = if n % 2 == 0 { &a } else { &b };
        ids.push(engine.start::<Notify>(n).await.unwrap());
    }
    // Down for 2.5 s: the three failures that open the breaker (counted
    // across both engines), then one failed probe per one-second break.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    service.up.store(true, Ordering::SeqCst);
    for id in &ids {
        let Ok(task) = tokio::time::timeout(Duration::from_secs(20), a.wait(*id)).await else {
            let task = a.task(*id).await.unwrap();
            panic!(
                "every parked task finishes once the breaker closes: {task:#?}\n{:?}",
                service.calls.lock().unwrap()
            );
        };
        let task = task.unwrap();
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
        assert!(
            task.steps[0].attempt_count <= 4,
            "waiting spent no retries: {task:#?}"
        );
        assert!(
            task.audit_log
                .iter()
                .any(|e| e.action == AuditAction::CircuitOpen),
            "it met the open breaker and waited: {task:#?}"
        );
    }

    let calls = service.calls.lock().unwrap().clone();
    let down: Vec<_> = calls.iter().filter(|(_, _, up)| !up).collect();
    let engines: std::collections::HashSet<_> = calls.iter().map(|(_, e, _)| *e).collect();
    assert_eq!(engines.len(), 2, "both engines ran tasks: {calls:?}");
    // The first failures come together: those that opened the breaker
    // (3, counted across both engines) and the calls already admitted
    // beside them (at most one per task).
    let first = down[0].0;
    let burst = down
        .iter()
        .take_while(|(at, _, _)| *at - first < Duration::from_millis(500))
        .count();
    assert!((3..=8).contains(&burst), "{down:?}");
    // After that, every call while down was a lone probe, a break (1 s)
    // after the one before, whichever engine made it; with a breaker per
    // engine each would have gone on failing on its own.
    assert!(
        down.len() - burst >= 1,
        "a probe while still down: {down:?}"
    );
    for pair in down[burst - 1..].windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(
            gap >= Duration::from_millis(900),
            "a call {gap:?} after the previous one while the breaker was open: {down:?}"
        );
    }
}

/// A two-step saga behind a shared breaker that parks tasks, with
/// `max_retries = 3`: an exhausted `send` compensates `hold`, which
/// counts in `undone`.
struct Hold {
    service: Arc<Service>,
    undone: Arc<std::sync::atomic::AtomicUsize>,
    engine: &'static str,
}

#[saga(name = "hold")]
impl Hold {
    #[saga_step(1)]
    async fn hold(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[compensate(hold)]
    async fn unhold(&self, _n: u32) -> Result<(), StepError> {
        self.undone.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 50)]
    #[circuit_breaker(failure_threshold = 3, duration_secs = 1, scope = shared, when_open = wait)]
    async fn send(&self, n: u32) -> Result<u32, StepError> {
        self.service.call(self.engine).map(|()| n)
    }
}

async fn hold_engine<S: ScenarioStore>(
    store: &S,
    service: &Arc<Service>,
    undone: &Arc<std::sync::atomic::AtomicUsize>,
    name: &'static str,
) -> Engine {
    Engine::builder()
        .backend_arc(store.backend(Duration::from_secs(30)).await)
        .saga(Hold {
            service: service.clone(),
            undone: undone.clone(),
            engine: name,
        })
        .timeout_poll_interval(Duration::from_millis(20))
        .worker_concurrency(4)
        .workers(1)
        .build()
        .await
        .unwrap()
}

/// Issue 23's outage, across two engines sharing
/// the breaker: 1 s breaks, `max_retries = 3`, 10 tasks, the dependency
/// down for 6 s (six breaks, each probed). A failed probe costs its task
/// nothing, so nothing is compensated and every task completes once the
/// dependency is back, having spent only the attempts it made while the
/// breaker was closed. Before, each probe spent a retry of the task that
/// made it and the tasks that probed most were compensated.
pub async fn a_long_outage_behind_a_shared_waiting_breaker_compensates_nothing<S: ScenarioStore>() {
    let store = S::start();
    let service = Arc::new(Service::default());
    let undone = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let a = hold_engine(&store, &service, &undone, "a").await;
    let b = hold_engine(&store, &service, &undone, "b").await;
    let mut ids = Vec::new();
    for n in 0..10 {
        let engine = if n % 2 == 0 { &a } else { &b };
        ids.push(engine.start::<Hold>(n).await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    service.up.store(true, Ordering::SeqCst);
    let down = service
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| !c.2)
        .count();
    let (mut probed, mut counted) = (0, 0);
    for id in &ids {
        let Ok(task) = tokio::time::timeout(Duration::from_secs(20), a.wait(*id)).await else {
            panic!(
                "every parked task finishes: {:#?}",
                a.task(*id).await.unwrap()
            );
        };
        let task = task.unwrap();
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
        let rec = &task.steps[1];
        let free = task
            .audit_log
            .iter()
            .filter(|e| {
                e.details
                    .as_deref()
                    .is_some_and(|d| d.contains("probe failed"))
            })
            .count() as u32;
        probed += free as usize;
        counted += (rec.attempts_in_budget() - 1) as usize;
        assert_eq!(
            rec.attempts_in_budget(),
            rec.attempt_count - free,
            "failed probes are recorded and not counted: {task:#?}"
        );
        assert!(
            rec.attempts_in_budget() <= 3,
            "only calls through the closed breaker were counted: {task:#?}"
        );
    }
    eprintln!("{down} calls while down: {counted} counted, {probed} failed probes");
    assert_eq!(undone.load(Ordering::SeqCst), 0, "nothing was undone");
    assert_eq!(
        counted + probed,
        down,
        "each call while down is one or the other"
    );
    assert!(probed >= 3, "the outage was probed: {probed} of {down}");
}
