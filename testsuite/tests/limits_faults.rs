//! Flow-control limits under faults and awkward interleavings, each a
//! regression found by review: a store that cannot be asked, a worker
//! that crashes behind a limit, a parked task that is cancelled, a
//! handler waiting for its instance, two steps sharing one limit.

mod common;

/// Two steps that share a limit's name: the second finds the first's slot freed, never parks behind it.
mod chain {
    use saga_runtime::prelude::*;
    use saga_runtime::AuditAction;

    struct Chain;

    #[saga(name = "chain")]
    impl Chain {
        #[saga_step(1)]
        #[limit(concurrency = 1, name = "psp")]
        async fn charge(&self, n: u32) -> Result<u32, StepError> {
            Ok(n)
        }

        #[saga_step(2)]
        #[limit(concurrency = 1, name = "psp")]
        async fn capture(&self, n: u32) -> Result<u32, StepError> {
            Ok(n)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_second_of_two_steps_sharing_a_limit_never_parks_behind_the_first() {
        let engine = Engine::builder()
            .saga(Chain)
            .workers(4)
            .build()
            .await
            .unwrap();
        let mut parked = 0;
        for n in 0..20 {
            let id = engine.start::<Chain>(n).await.unwrap();
            let task = engine.wait(id).await.unwrap();
            assert_eq!(task.status, TaskStatus::Completed);
            if task.audit_log.iter().any(|e| {
                matches!(e.action, AuditAction::LimitWait { .. })
                    && e.step.as_deref() == Some("capture")
            }) {
                parked += 1;
            }
        }
        println!("{parked} of 20 lone tasks parked behind their own previous step's slot");
        assert_eq!(parked, 0);
        engine.shutdown().await;
    }
}

/// A limited process-manager handler asks for its slot once it holds its instance's lock, so a slot is never left unrenewed while the handler waits.
mod pm {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use saga_runtime::prelude::*;
    use serde::{Deserialize, Serialize};

    #[derive(Message, Serialize, Deserialize)]
    struct Begin {
        #[correlation_id]
        order: String,
    }

    #[derive(Message, Serialize, Deserialize)]
    struct Charge {
        #[correlation_id]
        order: String,
        customer: u32,
        hold_s: u64,
    }

    #[derive(Default, Serialize, Deserialize)]
    struct St {
        n: u32,
    }

    #[derive(Clone, Default)]
    struct Count {
        running: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        done: Arc<AtomicUsize>,
    }

    struct Pm {
        c: Count,
    }

    #[process_manager(name = "pmlim", state = St)]
    impl Pm {
        #[starts]
        async fn begin(
            &self,
            _msg: Begin,
            state: &mut St,
            _ctx: &mut ProcessContext,
        ) -> Result<(), ProcessError> {
            // A slow, unlimited handler of the same instance.
            tokio::time::sleep(Duration::from_secs(25)).await;
            state.n += 1;
            Ok(())
        }

        #[starts]
        #[limit(concurrency = 1, key = msg.customer)]
        async fn charge(
            &self,
            msg: Charge,
            state: &mut St,
            _ctx: &mut ProcessContext,
        ) -> Result<(), ProcessError> {
            let now = self.c.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.c.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(msg.hold_s)).await;
            self.c.running.fetch_sub(1, Ordering::SeqCst);
            self.c.done.fetch_add(1, Ordering::SeqCst);
            state.n += 1;
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_waiting_for_its_instance_never_exceeds_its_limit() {
        let c = Count::default();
        let engine = Engine::builder()
            .process_manager(Pm { c: c.clone() })
            .workers(8)
            .build()
            .await
            .unwrap();
        engine.publish(Begin { order: "o1".into() }).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Takes customer 7's only slot, then waits 25 s for o1's lock.
        engine
            .publish(Charge {
                order: "o1".into(),
                customer: 7,
                hold_s: 1,
            })
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Same customer, another instance: must wait for the slot.
        engine
            .publish(Charge {
                order: "o2".into(),
                customer: 7,
                hold_s: 30,
            })
            .await
            .unwrap();
        for _ in 0..1200 {
            if c.done.load(Ordering::SeqCst) == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!(
            "charges done {}, most at once for customer 7: {}",
            c.done.load(Ordering::SeqCst),
            c.most.load(Ordering::SeqCst)
        );
        assert_eq!(
            c.most.load(Ordering::SeqCst),
            1,
            "concurrency = 1 per customer"
        );
        engine.shutdown().await;
    }
}

/// A task cancelled while parked gives up its place: the next in line gets the slot when it frees, not a reservation for the cancelled task.
mod cancel {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use saga_runtime::prelude::*;
    use tokio::time::Instant;

    struct Gate {
        t0: Instant,
        starts: Arc<Mutex<Vec<(u32, u64)>>>,
    }

    #[saga(name = "gate")]
    #[cancellable]
    impl Gate {
        #[saga_step(1)]
        #[limit(concurrency = 1)]
        async fn call(&self, hold_ms: u32) -> Result<u32, StepError> {
            self.starts
                .lock()
                .unwrap()
                .push((hold_ms, self.t0.elapsed().as_millis() as u64));
            tokio::time::sleep(Duration::from_millis(hold_ms as u64)).await;
            Ok(hold_ms)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_parked_task_gives_up_its_place() {
        let starts = Arc::new(Mutex::new(Vec::new()));
        let engine = Engine::builder()
            .saga(Gate {
                t0: Instant::now(),
                starts: starts.clone(),
            })
            .workers(4)
            .build()
            .await
            .unwrap();
        let a = engine.start::<Gate>(2000).await.unwrap();
        let b = engine.start::<Gate>(11).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            engine.cancel::<Gate>(b).await.unwrap(),
            CancelResult::Cancelled
        );
        assert_eq!(engine.wait(b).await.unwrap().status, TaskStatus::Cancelled);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let c = engine.start::<Gate>(12).await.unwrap();
        engine.wait(a).await.unwrap();
        let task = engine.wait(c).await.unwrap();
        assert_eq!(task.status, TaskStatus::Completed);
        let starts = starts.lock().unwrap().clone();
        println!("starts (hold_ms, at_ms): {starts:?}");
        let c_at = starts.iter().find(|s| s.0 == 12).unwrap().1;
        assert!(
            c_at <= 2100,
            "C should start when A frees the slot at 2000 ms, started at {c_at} ms"
        );
        engine.shutdown().await;
    }
}

/// A message recovered from a dead worker and parked by its limit keeps the step's next attempt the suspect: a second crash is counted, not forgiven.
mod crash {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use saga_runtime::backend::memory::MemoryBackend;
    use saga_runtime::prelude::*;
    use saga_runtime::AuditAction;

    struct Limited {
        runs: Arc<AtomicUsize>,
    }

    #[saga(name = "limited")]
    impl Limited {
        #[saga_step(1, timeout_ms = 600000)]
        #[limit(concurrency = 1)]
        async fn call(&self, n: u32) -> Result<u32, StepError> {
            if n == 666 {
                self.runs.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(1000)).await;
            Ok(n)
        }
    }

    struct Free {
        runs: Arc<AtomicUsize>,
    }

    #[saga(name = "free")]
    impl Free {
        #[saga_step(1, timeout_ms = 600000)]
        async fn call(&self, n: u32) -> Result<u32, StepError> {
            if n == 666 {
                self.runs.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
            }
            Ok(n)
        }
    }

    async fn until(what: &str, mut f: impl AsyncFnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !f().await {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn parked(task: &TaskInstance) -> bool {
        task.audit_log
            .iter()
            .any(|e| matches!(e.action, AuditAction::LimitWait { .. }))
    }

    macro_rules! scenario {
        ($saga:ident, $queue_others:expr) => {{
            let backend = MemoryBackend::with_visibility_timeout(Duration::from_millis(300));
            let runs = Arc::new(AtomicUsize::new(0));
            let mut bad = None;
            for round in 0..3usize {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                let engine = rt
                    .block_on(
                        Engine::builder()
                            .backend(backend.clone())
                            .saga($saga { runs: runs.clone() })
                            .workers(4)
                            .build(),
                    )
                    .unwrap();
                let task = rt.block_on(async {
                    if bad.is_none() {
                        bad = Some(engine.start::<$saga>(666).await.unwrap());
                    }
                    let id = bad.unwrap();
                    until("the bad step runs or its task ends", async || {
                        runs.load(Ordering::SeqCst) > round
                            || engine.task(id).await.unwrap().unwrap().status.is_terminal()
                    })
                    .await;
                    let task = engine.task(id).await.unwrap().unwrap();
                    println!("bad now: {:?} step {:?} audit {:?}", task.status, task.steps[0], task.audit_log.iter().map(|e| format!("{:?}/{:?}", e.action, e.error)).collect::<Vec<_>>());
                    if $queue_others && round < 2 {
                        // Someone waits in line behind the crashing holder.
                        let good = engine.start::<$saga>(round as u32).await.unwrap();
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        let g = engine.task(good).await.unwrap().unwrap();
                        println!("good: {:?} {:?}", g.status, g.audit_log.iter().map(|e| format!("{:?}", e.action)).collect::<Vec<_>>());
                        until("the good task parks", async || {
                            parked(&engine.task(good).await.unwrap().unwrap())
                        })
                        .await;
                    }
                    task
                });
                let abandoned = task
                    .audit_log
                    .iter()
                    .filter(|e| {
                        matches!(e.action, AuditAction::AttemptAbandoned)
                            && e.error.as_deref().is_some_and(|t| t.contains("not counted"))
                    })
                    .count();
                println!(
                    "{} round {} (status {:?}, runs {}): attempt_count {}, in budget {}, step {:?}, forgiven crashes so far {}",
                    stringify!($saga),
                    round + 1,
                    task.status,
                    runs.load(Ordering::SeqCst),
                    task.steps[0].attempt_count,
                    task.steps[0].attempts_in_budget(),
                    task.steps[0],
                    abandoned
                );
                // The crash: the runtime goes away with the step mid-call.
                std::mem::forget(engine);
                rt.shutdown_background();
                if round == 2 || task.status.is_terminal() {
                    return abandoned;
                }
            }
            unreachable!()
        }};
    }

    fn free() -> usize {
        scenario!(Free, false)
    }

    /// `limited`'s engines are killed with the bad step mid-call; right after
    /// each kill a waiter of another machine (asked directly on the backend)
    /// queues for the slot, so the recovered message finds the slot taken.
    fn limited() -> usize {
        use saga_runtime::backend::{LimitRequest, Limits};
        use saga_runtime::limit::LimitConfig;
        let config = LimitConfig {
            concurrency: Some(1),
            rate: None,
        };
        let backend = MemoryBackend::with_visibility_timeout(Duration::from_millis(300));
        let runs = Arc::new(AtomicUsize::new(0));
        let mut bad = None;
        for round in 0..3usize {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let engine = rt
                .block_on(
                    Engine::builder()
                        .backend(backend.clone())
                        .saga(Limited { runs: runs.clone() })
                        .workers(4)
                        .build(),
                )
                .unwrap();
            let task = rt.block_on(async {
                if bad.is_none() {
                    bad = Some(engine.start::<Limited>(666).await.unwrap());
                }
                let id = bad.unwrap();
                if round > 0 {
                    // The recovered message is refused (the other machine's
                    // waiter is first in line); then the other machine is done.
                    until("the recovered message parks", async || {
                        let t = engine.task(id).await.unwrap().unwrap();
                        t.audit_log
                            .last()
                            .is_some_and(|e| matches!(e.action, AuditAction::LimitWait { .. }))
                    })
                    .await;
                    let r = backend
                        .limit_release("limited.call", None, "w:other", config)
                        .await
                        .unwrap();
                    println!("round {round}: the other machine's reservation freed: {r:?}");
                }
                until("the bad step runs or its task ends", async || {
                    runs.load(Ordering::SeqCst) > round
                        || engine.task(id).await.unwrap().unwrap().status.is_terminal()
                })
                .await;
                engine.task(id).await.unwrap().unwrap()
            });
            let forgiven = task
                .audit_log
                .iter()
                .filter(|e| {
                    matches!(e.action, AuditAction::AttemptAbandoned)
                        && e.error
                            .as_deref()
                            .is_some_and(|t| t.contains("not counted"))
                })
                .count();
            println!(
                "Limited round {} (status {:?}, runs {}): attempt_count {}, in budget {}, step {:?}, forgiven {}",
                round + 1, task.status, runs.load(Ordering::SeqCst), task.steps[0].attempt_count,
                task.steps[0].attempts_in_budget(), task.steps[0], forgiven
            );
            std::mem::forget(engine);
            rt.shutdown_background();
            if round == 2 || task.status.is_terminal() {
                return forgiven;
            }
            // Another machine's attempt queues for the slot the dead step holds.
            let b = backend.clone();
            let asked = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    b.limit_acquire(&LimitRequest {
                        limit: "limited.call",
                        key: None,
                        config,
                        holder: "other-holder",
                        waiter: "other",
                        hold_for: Duration::from_secs(10),
                        wake: Some("{}"),
                    })
                    .await
                    .unwrap()
                });
            println!("the other machine asked: {asked:?}");
        }
        unreachable!()
    }

    #[test]
    fn a_crash_after_a_limit_park_is_counted_not_forgiven() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("saga_runtime=debug")
            .with_test_writer()
            .try_init();
        let free = free();
        let limited = limited();
        println!("forgiven crashes: free {free}, limited {limited}");
        assert_eq!(
            free, 1,
            "control: only the first crash (beside others) is forgiven"
        );
        assert_eq!(
            limited, 1,
            "with a limit, the recovered message parks and its next attempt runs beside others: every crash is forgiven"
        );
    }
}

/// A limit store that cannot be asked (a dropped connection, a refused write) parks the task for a moment; the step completed before it under the same delivery is still recorded, not run again.
mod err {

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::common::redis_server::TestRedis;
    use saga_runtime::prelude::*;

    struct TwoStep {
        first: Arc<AtomicUsize>,
    }

    #[saga(name = "twostep")]
    impl TwoStep {
        #[saga_step(1)]
        async fn first(&self, n: u32) -> Result<u32, StepError> {
            self.first.fetch_add(1, Ordering::SeqCst);
            Ok(n)
        }

        #[saga_step(2)]
        #[limit(concurrency = 5)]
        async fn second(&self, n: u32) -> Result<u32, StepError> {
            Ok(n)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_limit_write_does_not_rerun_the_completed_step() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("saga_runtime=debug")
            .with_test_writer()
            .try_init();
        let redis = TestRedis::start();
        // Make every limit call on `twostep.second` fail (as a blip would).
        let _: () = redis::cmd("SET")
            .arg("saga:{saga:limit:twostep.second}:holders")
            .arg("not a zset")
            .query(&mut redis.conn())
            .unwrap();
        let first = Arc::new(AtomicUsize::new(0));
        let engine = Engine::builder()
            .backend(redis.backend().await)
            .saga(TwoStep {
                first: first.clone(),
            })
            .workers(2)
            .build()
            .await
            .unwrap();
        let id = engine.start::<TwoStep>(7).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        println!("---- 3s ----");
        let runs = first.load(Ordering::SeqCst);
        let task = engine.task(id).await.unwrap().unwrap();
        println!(
            "step `first` ran {runs} times; its record: status {:?}, attempts {}, in budget {}",
            task.steps[0].status,
            task.steps[0].attempt_count,
            task.steps[0].attempts_in_budget()
        );
        for e in &task.audit_log {
            println!("  {:?} {:?} {:?}", e.action, e.step, e.error);
        }
        let _: () = redis::cmd("DEL")
            .arg("saga:{saga:limit:twostep.second}:holders")
            .query(&mut redis.conn())
            .unwrap();
        let task = tokio::time::timeout(Duration::from_secs(10), engine.wait(id))
            .await
            .expect("the task never finished after the limit recovered")
            .unwrap();
        println!(
            "after the limit recovered: {:?}, `first` ran {} times",
            task.status,
            first.load(Ordering::SeqCst)
        );
        assert_eq!(
            runs, 1,
            "a completed step must not run again because the next step's limit failed"
        );
        engine.shutdown().await;
    }

    struct Slow {
        first: Arc<AtomicUsize>,
    }

    #[saga(name = "slowtwo")]
    impl Slow {
        #[saga_step(1)]
        async fn first(&self, n: u32) -> Result<u32, StepError> {
            self.first.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1000)).await;
            Ok(n)
        }

        #[saga_step(2)]
        #[limit(concurrency = 5)]
        async fn second(&self, n: u32) -> Result<u32, StepError> {
            Ok(n)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redis_blip_at_the_limit_does_not_rerun_the_completed_step() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("saga_runtime=debug")
            .with_test_writer()
            .try_init();
        let mut redis = TestRedis::start();
        let first = Arc::new(AtomicUsize::new(0));
        let engine = Engine::builder()
            .backend(redis.backend().await)
            .saga(Slow {
                first: first.clone(),
            })
            .workers(2)
            .build()
            .await
            .unwrap();
        let id = engine.start::<Slow>(7).await.unwrap();
        while first.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(960)).await;
        println!("---- kill ----");
        redis.kill();
        tokio::time::sleep(Duration::from_millis(100)).await;
        redis.restart();
        println!("---- restarted ----");
        let task = tokio::time::timeout(Duration::from_secs(20), engine.wait(id))
            .await
            .expect("finished")
            .unwrap();
        println!(
            "status {:?}; `first` ran {} times; in budget {}",
            task.status,
            first.load(Ordering::SeqCst),
            task.steps[0].attempts_in_budget()
        );
        for e in &task.audit_log {
            println!("  {:?} {:?} {:?}", e.action, e.step, e.error);
        }
        assert_eq!(
            first.load(Ordering::SeqCst),
            1,
            "the completed step ran again"
        );
        engine.shutdown().await;
    }

    struct SlowFree {
        first: Arc<AtomicUsize>,
    }

    #[saga(name = "slowfree")]
    impl SlowFree {
        #[saga_step(1)]
        async fn first(&self, n: u32) -> Result<u32, StepError> {
            self.first.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1000)).await;
            Ok(n)
        }

        #[saga_step(2)]
        async fn second(&self, n: u32) -> Result<u32, StepError> {
            Ok(n)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redis_blip_without_a_limit_does_not_rerun_the_completed_step() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("saga_runtime=debug")
            .with_test_writer()
            .try_init();
        let mut redis = TestRedis::start();
        let first = Arc::new(AtomicUsize::new(0));
        let engine = Engine::builder()
            .backend(redis.backend().await)
            .saga(SlowFree {
                first: first.clone(),
            })
            .workers(2)
            .build()
            .await
            .unwrap();
        let id = engine.start::<SlowFree>(7).await.unwrap();
        while first.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(960)).await;
        println!("---- kill ----");
        redis.kill();
        tokio::time::sleep(Duration::from_millis(100)).await;
        redis.restart();
        println!("---- restarted ----");
        let task = tokio::time::timeout(Duration::from_secs(20), engine.wait(id))
            .await
            .expect("finished")
            .unwrap();
        println!(
            "status {:?}; `first` ran {} times; in budget {}",
            task.status,
            first.load(Ordering::SeqCst),
            task.steps[0].attempts_in_budget()
        );
        for e in &task.audit_log {
            println!("  {:?} {:?} {:?}", e.action, e.step, e.error);
        }
        assert_eq!(
            first.load(Ordering::SeqCst),
            1,
            "the completed step ran again"
        );
        engine.shutdown().await;
    }
}
