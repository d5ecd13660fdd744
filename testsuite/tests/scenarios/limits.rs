//! Flow-control limits (`#[limit]`) across a deployment, on every store,
//! with two engines of 8 workers each (as two machines would run): the
//! calls counted inside the step never exceed a concurrency limit yet
//! reach it, a rate paces starts to `burst + rate * T`, keys keep budgets
//! apart, a SIGKILLed worker's slot comes back after its lease and not
//! before, a long wait is audited once, a parked task is cancelled at once
//! and gives up its place, and a process-manager handler is limited the
//! same way.
//!
//! The worker that is SIGKILLed holding a slot is a `limit-worker`
//! process on the store; it signals on a private Redis of its own, out of
//! the store's way. Every scenario prints what it measured
//! (`-- --nocapture`).

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use saga_runtime::engine::EngineBuilder;
use saga_runtime::prelude::*;
use saga_runtime::AuditAction;
use serde::{Deserialize, Serialize};

use crate::common::redis_server::TestRedis;
use crate::common::stores::ScenarioStore;
use crate::scenarios::rig::Worker;

/// Calls counted inside the step: when each began (after `t0`), how many
/// ran at once at most, overall and per label.
#[derive(Clone)]
struct Calls {
    t0: Instant,
    starts: Arc<Mutex<Vec<(String, Duration)>>>,
    running: Arc<Mutex<BTreeMap<String, usize>>>,
    most: Arc<Mutex<BTreeMap<String, usize>>>,
    all_running: Arc<AtomicUsize>,
    all_most: Arc<AtomicUsize>,
}

impl Calls {
    fn new() -> Self {
        Calls {
            t0: Instant::now(),
            starts: Arc::default(),
            running: Arc::default(),
            most: Arc::default(),
            all_running: Arc::default(),
            all_most: Arc::default(),
        }
    }

    /// Records a call of `label` that runs for `hold`.
    async fn call(&self, label: &str, hold: Duration) {
        let now = self.all_running.fetch_add(1, Ordering::SeqCst) + 1;
        self.all_most.fetch_max(now, Ordering::SeqCst);
        {
            let mut running = self.running.lock().unwrap();
            let mine = running.entry(label.to_owned()).or_default();
            *mine += 1;
            let mut most = self.most.lock().unwrap();
            let top = most.entry(label.to_owned()).or_default();
            *top = (*top).max(*mine);
            let at = self.t0.elapsed();
            self.starts.lock().unwrap().push((label.to_owned(), at));
        }
        tokio::time::sleep(hold).await;
        *self
            .running
            .lock()
            .unwrap()
            .get_mut(label)
            .expect("counted above") -= 1;
        self.all_running.fetch_sub(1, Ordering::SeqCst);
    }

    /// The most calls of any label at once.
    fn most(&self) -> usize {
        self.all_most.load(Ordering::SeqCst)
    }

    /// The most calls of `label` at once.
    fn most_of(&self, label: &str) -> usize {
        self.most.lock().unwrap().get(label).copied().unwrap_or(0)
    }

    /// Every start, sorted, after `t0`.
    fn starts(&self) -> Vec<Duration> {
        let mut at: Vec<Duration> = self.starts.lock().unwrap().iter().map(|s| s.1).collect();
        at.sort_unstable();
        at
    }

    fn count(&self) -> usize {
        self.starts.lock().unwrap().len()
    }
}

/// Two engines on one store, 8 workers each: what `add` registers runs in
/// both, as on two machines.
async fn two_engines<S: ScenarioStore>(
    store: &S,
    add: impl Fn(EngineBuilder) -> EngineBuilder,
) -> [Engine; 2] {
    let mut engines = Vec::new();
    for _ in 0..2 {
        let builder = Engine::builder()
            .backend_arc(store.backend(Duration::from_secs(5)).await)
            .timeout_poll_interval(Duration::from_millis(10))
            .workers(8);
        engines.push(add(builder).build().await.unwrap());
    }
    [engines.remove(0), engines.remove(0)]
}

/// Waits for every task (started on either engine) and checks it completed
/// with one attempt: waiting for a limit is not an attempt. Returns how
/// many recorded a wait for `limit`.
async fn all_completed(engine: &Engine, ids: &[TaskId], limit: &str) -> usize {
    let mut waited = 0;
    for id in ids {
        let task = tokio::time::timeout(Duration::from_secs(30), engine.wait(*id))
            .await
            .expect("the task did not finish in 30 s")
            .unwrap();
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
        assert_eq!(task.steps[0].attempt_count, 1, "{task:#?}");
        let waits = task
            .audit_log
            .iter()
            .any(|e| matches!(&e.action, AuditAction::LimitWait { limit: l, .. } if l == limit));
        waited += usize::from(waits);
    }
    waited
}

/// Waits (2 s at most) until no slot of `limit` (for `key`) is held or
/// reserved: a finished attempt frees its slots in the background, just
/// after its task's last write.
async fn all_freed(engine: &Engine, limit: &str, key: Option<&str>) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let usage = engine.limit_usage(limit, key).await.unwrap();
        if (usage.in_use, usage.waiting) == (0, 0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{limit} {key:?} not freed: {usage:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Three {
    calls: Calls,
}

#[saga(name = "three")]
impl Three {
    #[saga_step(1)]
    #[limit(concurrency = 3)]
    async fn call(&self, n: u32) -> Result<u32, StepError> {
        self.calls.call("call", Duration::from_millis(20)).await;
        Ok(n)
    }
}

pub async fn a_concurrency_of_three_holds_across_two_engines_and_is_used<S: ScenarioStore>() {
    let store = S::start();
    let calls = Calls::new();
    let engines = two_engines(&store, |b| {
        b.saga(Three {
            calls: calls.clone(),
        })
    })
    .await;
    const TASKS: u32 = 200;
    let t = Instant::now();
    let mut ids = Vec::new();
    for n in 0..TASKS {
        ids.push(engines[n as usize % 2].start::<Three>(n).await.unwrap());
    }
    let waited = all_completed(&engines[0], &ids, "three.call").await;
    let took = t.elapsed();
    println!(
        "concurrency 3, {TASKS} tasks x 20 ms over 2 engines x 8 workers: at most {} at once, \
         {waited} tasks waited, {took:.2?} ({:.0} calls/s; the limit allows 150)",
        calls.most(),
        TASKS as f64 / took.as_secs_f64()
    );
    assert_eq!(calls.count(), TASKS as usize, "each step ran once");
    assert_eq!(calls.most(), 3, "at most 3 at once, and 3 reached");
    assert!(waited > 0, "with 16 workers some tasks must have waited");
    all_freed(&engines[1], "three.call", None).await;
    for engine in engines {
        engine.shutdown().await;
    }
}

struct Paced {
    calls: Calls,
}

#[saga(name = "paced")]
impl Paced {
    #[saga_step(1)]
    #[limit(rate = 50, per = "1s", burst = 5)]
    async fn call(&self, n: u32) -> Result<u32, StepError> {
        self.calls.call("call", Duration::ZERO).await;
        Ok(n)
    }
}

/// The most of `starts` (sorted) within any closed window of `width`.
fn most_in_window(starts: &[Duration], width: Duration) -> usize {
    (0..starts.len())
        .map(|i| starts[i..].partition_point(|s| *s <= starts[i] + width))
        .max()
        .unwrap_or(0)
}

/// Runs `TASKS` tasks of `Paced`, all started at once on two engines of 8
/// workers, and checks the starts counted inside the step against the
/// rate's promise: at most `burst + rate * T` over any window `T` (+1 for
/// a closed window, +1 for the jitter between a grant and the step's first
/// line), and paced rather than starved. `warm`: the engines run for a
/// second before the demand arrives (their timer poller is up).
async fn paced<S: ScenarioStore>(warm: bool) {
    let store = S::start();
    let calls = Calls::new();
    let engines = two_engines(&store, |b| {
        b.saga(Paced {
            calls: calls.clone(),
        })
    })
    .await;
    if warm {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // 7 s of demand at 50/s, all of it there at once: the first 5 s are
    // under continuous demand.
    const TASKS: u32 = 350;
    let mut ids = Vec::new();
    for n in 0..TASKS {
        ids.push(engines[n as usize % 2].start::<Paced>(n).await.unwrap());
    }
    all_completed(&engines[0], &ids, "paced.call").await;
    let starts = calls.starts();
    let first = starts[0];
    let five = Duration::from_secs(5);
    let in_first = starts.iter().filter(|s| **s <= first + five).count();
    let most = most_in_window(&starts, five);
    let most_1s = most_in_window(&starts, Duration::from_secs(1));
    let most_100ms = most_in_window(&starts, Duration::from_millis(100));
    let span = *starts.last().unwrap() - first;
    let warmth = if warm { "warm" } else { "cold" };
    println!(
        "rate 50/s burst 5, {TASKS} tasks at once over 2 {warmth} engines x 8 workers: {in_first} starts \
         in the first 5 s; at most {most} in any 5 s, {most_1s} in any 1 s, {most_100ms} in any 100 ms \
         (the limit allows 255, 55, 10); all {TASKS} over {span:.2?} ({:.1}/s)",
        (TASKS - 1) as f64 / span.as_secs_f64()
    );
    // `LIMITS_DEBUG=1`: every start, to see where a window overflows.
    if std::env::var_os("LIMITS_DEBUG").is_some() {
        let ms: Vec<u128> = starts.iter().map(|s| (*s - first).as_millis()).collect();
        println!("starts (ms after the first): {ms:?}");
    }
    assert!(in_first <= 256, "{in_first} starts in the first 5 s");
    assert!(in_first >= 200, "paced, not starved: {in_first} in 5 s");
    assert!(most <= 257, "{most} starts in a 5 s window (limit 255)");
    assert!(most_1s <= 57, "{most_1s} starts in a 1 s window (limit 55)");
    for engine in engines {
        engine.shutdown().await;
    }
}

pub async fn a_rate_of_fifty_a_second_starts_250_plus_the_burst_in_five_seconds<
    S: ScenarioStore,
>() {
    paced::<S>(true).await;
}

/// The same demand meeting engines that have just started (a deploy, a
/// restart): the rate's promise holds from the first moment.
pub async fn a_rate_holds_when_the_demand_meets_engines_just_started<S: ScenarioStore>() {
    paced::<S>(false).await;
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payment {
    merchant: u32,
    n: u32,
}

struct Merchants {
    calls: Calls,
}

#[saga(name = "merchants")]
impl Merchants {
    #[saga_step(1)]
    #[limit(concurrency = 1, key = input.merchant)]
    async fn charge(&self, p: Payment) -> Result<u32, StepError> {
        let label = format!("merchant-{}", p.merchant);
        self.calls.call(&label, Duration::from_millis(50)).await;
        Ok(p.n)
    }
}

pub async fn a_keyed_limit_keeps_two_merchants_independent<S: ScenarioStore>() {
    let store = S::start();
    let calls = Calls::new();
    let engines = two_engines(&store, |b| {
        b.saga(Merchants {
            calls: calls.clone(),
        })
    })
    .await;
    const EACH: u32 = 15;
    let t = Instant::now();
    let mut ids = Vec::new();
    for n in 0..EACH {
        for merchant in [1, 2] {
            let payment = Payment { merchant, n };
            ids.push(
                engines[n as usize % 2]
                    .start::<Merchants>(payment)
                    .await
                    .unwrap(),
            );
        }
    }
    all_completed(&engines[0], &ids, "merchants.charge").await;
    let took = t.elapsed();
    let (one, two) = (calls.most_of("merchant-1"), calls.most_of("merchant-2"));
    println!(
        "concurrency 1 per merchant, {EACH} x 50 ms for each of 2 merchants over 2 engines x 8 workers: \
         at most {one} and {two} at once per merchant, {} at once overall, {took:.2?}",
        calls.most()
    );
    assert_eq!(
        (one, two),
        (1, 1),
        "never two calls of one merchant at once"
    );
    assert_eq!(calls.most(), 2, "the two merchants' calls overlap");
    for merchant in ["1", "2"] {
        all_freed(&engines[0], "merchants.charge", Some(merchant)).await;
    }
    for engine in engines {
        engine.shutdown().await;
    }
}

/// This process's use of the limit the `limit-worker` process holds: a
/// saga of its own (`holder-child` runs only there) sharing the slot by
/// name. Its step holds the slot briefly and counts.
struct Holder {
    calls: Calls,
}

#[saga(name = "holder")]
impl Holder {
    #[saga_step(1)]
    #[limit(concurrency = 1, name = "holder-slot")]
    async fn hold(&self, n: u32) -> Result<u32, StepError> {
        self.calls.call("hold", Duration::from_millis(100)).await;
        Ok(n)
    }
}

/// What `limit-worker` sets on its recording Redis once its engine runs,
/// and pushes there when its step starts.
const CHILD_READY: &str = "limit-worker:ready";
const CHILD_STARTS: &str = "limit-worker:starts";

/// A `limit-worker` process on the store at `url`, signalling on the
/// Redis at `record`; killed when dropped.
fn spawn_child(url: &str, record: &str, lease: Duration) -> Worker {
    let child = Command::new(env!("CARGO_BIN_EXE_limit-worker"))
        .env("BACKEND_URL", url)
        .env("RECORD_URL", record)
        .env("LEASE_MS", lease.as_millis().to_string())
        .env("POLL_MS", "50")
        .env("RUST_LOG", "off")
        .spawn()
        .expect("spawn limit-worker");
    Worker(child)
}

/// Polls the recording Redis until `key` (a list or a string) is there.
async fn await_key(record: &TestRedis, key: &str, what: &str) {
    let mut conn = record.conn();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !redis::cmd("EXISTS")
        .arg(key)
        .query::<bool>(&mut conn)
        .unwrap()
    {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A `limit-worker` process takes the slot of a `concurrency = 1` limit
/// and blocks in its step; a task of this process waits for the slot
/// through three leases (the child renews it), then the child is
/// SIGKILLed. Returns how long after the kill this process's call began.
/// `child_first`: the child starts before this process's workers, so that
/// it also holds the deployment's timer lease when it dies.
async fn slot_of_a_killed_worker<S: ScenarioStore>(child_first: bool) -> Duration {
    let store = S::start();
    let record = TestRedis::start_with_aof(false);
    let lease = Duration::from_secs(1);
    let calls = Calls::new();
    let build = || async {
        Engine::builder()
            .backend_arc(store.backend(lease).await)
            .saga(Holder {
                calls: calls.clone(),
            })
            .lock_ttl(lease)
            .timeout_poll_interval(Duration::from_millis(10))
            .workers(8)
            .build()
            .await
            .unwrap()
    };
    let mut child = spawn_child(&store.url(), &record.url(), lease);
    let engine = match child_first {
        true => {
            await_key(&record, CHILD_READY, "the child never started").await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            build().await
        }
        false => {
            let engine = build().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            await_key(&record, CHILD_READY, "the child never started").await;
            engine
        }
    };
    // The child starts its own task (only it runs `holder-child`: this
    // process hands the message back if it reads it).
    await_key(&record, CHILD_STARTS, "the child never started its step").await;
    let waiting = engine.start::<Holder>(2).await.unwrap();
    tokio::time::sleep(3 * lease).await;
    assert_eq!(calls.count(), 0, "the held slot admitted another call");
    let usage = engine.limit_usage("holder-slot", None).await.unwrap();
    assert_eq!((usage.in_use, usage.waiting), (1, 1), "{usage:?}");
    let parked = engine.task(waiting).await.unwrap().unwrap();
    assert!(
        parked
            .audit_log
            .iter()
            .any(|e| matches!(e.action, AuditAction::LimitWait { .. })),
        "{:#?}",
        parked.audit_log
    );
    child.0.kill().unwrap(); // SIGKILL, mid-step, slot held
    child.0.wait().unwrap();
    let killed_at = calls.t0.elapsed();
    let task = tokio::time::timeout(Duration::from_secs(20), engine.wait(waiting))
        .await
        .expect("the waiting task did not finish in 20 s")
        .unwrap();
    assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
    assert_eq!(task.steps[0].attempt_count, 1);
    let after = calls.starts()[0] - killed_at;
    let holder = match child_first {
        true => "the child held the timer lease too",
        false => "this process held the timer lease",
    };
    println!(
        "lease {lease:?}, {holder}: while the child lived, {usage:?}; this process's call began \
         {after:.2?} after the SIGKILL"
    );
    assert_eq!(calls.count(), 1);
    // The child's last renewal came at most a third of a lease before the
    // kill: its slot lasted at least two thirds of a lease more.
    assert!(
        after >= lease * 6 / 10,
        "the slot was given away {after:?} after the kill, before its lease ran out"
    );
    engine.shutdown().await;
    after
}

pub async fn a_sigkilled_workers_slot_comes_back_after_its_lease_and_not_before<
    S: ScenarioStore,
>() {
    let lease = Duration::from_secs(1);
    let after = slot_of_a_killed_worker::<S>(false).await;
    // The margin is for a busy machine (the scenarios run side by side);
    // the slot would otherwise stay taken for good.
    assert!(
        after <= lease + Duration::from_millis(1500),
        "the dead worker's slot came back only {after:?} after the kill (lease {lease:?})"
    );
}

/// The same when the killed worker also held the deployment's timer lease.
/// An expiry is noticed only by a call, and the waiter's return is a
/// delayed message: it comes back once another engine has taken the
/// timers over (their lease lasts 2 s; the others look every 500 ms), so
/// the wait is the longer of the slot's lease and that takeover.
pub async fn a_sigkilled_timer_holders_slot_comes_back_once_the_timers_are_taken_over<
    S: ScenarioStore,
>() {
    let lease = Duration::from_secs(1);
    let takeover = Duration::from_millis(2500);
    let after = slot_of_a_killed_worker::<S>(true).await;
    assert!(
        after <= lease.max(takeover) + Duration::from_millis(1500),
        "the dead worker's slot came back only {after:?} after the kill (lease {lease:?})"
    );
}

struct Slow {
    calls: Calls,
}

#[saga(name = "slow")]
impl Slow {
    #[saga_step(1)]
    #[limit(concurrency = 1)]
    async fn call(&self, n: u32) -> Result<u32, StepError> {
        self.calls.call("slow", Duration::from_millis(1500)).await;
        Ok(n)
    }
}

/// A task that waits through several of the holder's lease renewals comes
/// back each time the slot was due to expire, and still waits: its audit
/// log records the wait once, when it began (as on the memory backend),
/// so that waiting behind a busy provider does not push the task's
/// history out of its capped log.
pub async fn a_long_wait_is_audited_once<S: ScenarioStore>() {
    let store = S::start();
    let lease = Duration::from_millis(300);
    let calls = Calls::new();
    let engine = Engine::builder()
        .backend_arc(store.backend(lease).await)
        .saga(Slow {
            calls: calls.clone(),
        })
        .lock_ttl(lease)
        .timeout_poll_interval(Duration::from_millis(10))
        .workers(4)
        .build()
        .await
        .unwrap();
    let first = engine.start::<Slow>(1).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.count() == 0 {
        assert!(Instant::now() < deadline, "the first task never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = engine.start::<Slow>(2).await.unwrap();
    all_completed(&engine, &[first, second], "slow.call").await;
    let task = engine.task(second).await.unwrap().unwrap();
    let waits: Vec<_> = task
        .audit_log
        .iter()
        .filter(|e| matches!(e.action, AuditAction::LimitWait { .. }))
        .map(|e| e.at)
        .collect();
    println!(
        "a 1.5 s wait behind a {lease:?} lease: {} LimitWait audit entries at {waits:?}",
        waits.len()
    );
    assert_eq!(calls.most(), 1);
    assert_eq!(
        waits.len(),
        1,
        "the wait is recorded at every return: {:?}",
        task.audit_log.iter().map(|e| &e.action).collect::<Vec<_>>()
    );
    engine.shutdown().await;
}

struct Gate {
    calls: Calls,
}

#[saga(name = "gate")]
#[cancellable]
impl Gate {
    #[saga_step(1)]
    #[limit(concurrency = 1)]
    async fn pass(&self, n: u32, ctx: &StepContext) -> Result<u32, StepError> {
        tokio::select! {
            _ = self.calls.call("pass", Duration::from_secs(60)) => Ok(n),
            _ = ctx.cancelled() => Err(StepError::permanent("cancelled")),
        }
    }
}

/// A task parked behind a slot held on the other engine is cancelled at
/// once (it holds no worker and no lease), and leaves the line.
pub async fn a_parked_task_is_cancelled_at_once_from_either_engine<S: ScenarioStore>() {
    let store = S::start();
    let calls = Calls::new();
    let engines = two_engines(&store, |b| {
        b.saga(Gate {
            calls: calls.clone(),
        })
    })
    .await;
    let holding = engines[0].start::<Gate>(1).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.count() == 0 {
        assert!(Instant::now() < deadline, "the first task never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let parked = engines[1].start::<Gate>(2).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while engines[0]
        .limit_usage("gate.pass", None)
        .await
        .unwrap()
        .waiting
        == 0
    {
        assert!(Instant::now() < deadline, "the second task never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t = Instant::now();
    let cancelled = engines[0].cancel::<Gate>(parked).await.unwrap();
    let task = engines[0].wait(parked).await.unwrap();
    let took = t.elapsed();
    println!("a parked task cancelled in {took:.2?} ({cancelled:?})");
    assert_eq!(cancelled, CancelResult::Cancelled);
    assert_eq!(task.status, TaskStatus::Cancelled, "{task:#?}");
    assert!(took < Duration::from_secs(1), "cancelled after {took:?}");
    assert_eq!(calls.count(), 1, "the parked task never ran");
    engines[1].cancel::<Gate>(holding).await.unwrap();
    let task = engines[1].wait(holding).await.unwrap();
    assert_eq!(task.status, TaskStatus::Cancelled);
    // The slot is free for whoever comes next: the cancelled task left
    // the line, so no reservation waits for it.
    let t = Instant::now();
    let next = engines[1].start::<Gate>(3).await.unwrap();
    while calls.count() < 2 {
        let usage = engines[1].limit_usage("gate.pass", None).await.unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "a task started after both were cancelled waits for the slot: {usage:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "the next task started {:.2?} after both were cancelled",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    engines[0].cancel::<Gate>(next).await.unwrap();
    engines[0].wait(next).await.unwrap();
    for engine in engines {
        engine.shutdown().await;
    }
}

#[derive(Message, Serialize, Deserialize)]
struct Open {
    #[correlation_id]
    account: String,
}

#[derive(Message, Serialize, Deserialize)]
struct Post {
    #[correlation_id]
    account: String,
}

#[derive(Default, Serialize, Deserialize)]
struct Ledger {
    posts: u32,
}

struct Ledgers {
    calls: Calls,
}

#[process_manager(name = "ledgers", state = Ledger)]
impl Ledgers {
    #[starts]
    #[limit(concurrency = 1, name = "ledger")]
    async fn open(
        &self,
        _m: Open,
        _s: &mut Ledger,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        self.calls.call("ledger", Duration::from_millis(20)).await;
        Ok(())
    }

    #[handles]
    #[limit(concurrency = 1, name = "ledger")]
    async fn post(
        &self,
        _m: Post,
        s: &mut Ledger,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        self.calls.call("ledger", Duration::from_millis(20)).await;
        s.posts += 1;
        Ok(())
    }
}

pub async fn a_limited_handler_runs_one_at_a_time_across_instances_and_engines<S: ScenarioStore>() {
    let store = S::start();
    let calls = Calls::new();
    let engines = two_engines(&store, |b| {
        b.process_manager(Ledgers {
            calls: calls.clone(),
        })
    })
    .await;
    const ACCOUNTS: u32 = 4;
    const POSTS: u32 = 5;
    let t = Instant::now();
    for a in 0..ACCOUNTS {
        let account = format!("acct-{a}");
        engines[0].publish(Open { account }).await.unwrap();
    }
    // A post before its instance exists would match none: posts follow
    // the openings.
    let deadline = Instant::now() + Duration::from_secs(30);
    for a in 0..ACCOUNTS {
        let account = format!("acct-{a}");
        while engines[1]
            .process_state::<Ledgers>(&account)
            .await
            .unwrap()
            .is_none()
        {
            assert!(Instant::now() < deadline, "{account} never opened");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for p in 0..POSTS {
        for a in 0..ACCOUNTS {
            let account = format!("acct-{a}");
            engines[(p % 2) as usize]
                .publish(Post { account })
                .await
                .unwrap();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut posted = Vec::new();
    loop {
        posted.clear();
        for a in 0..ACCOUNTS {
            let state = engines[1]
                .process_state::<Ledgers>(&format!("acct-{a}"))
                .await
                .unwrap();
            posted.push(state.map_or(0, |s| s.posts));
        }
        if posted.iter().all(|p| *p == POSTS) {
            break;
        }
        assert!(Instant::now() < deadline, "not all handled: {posted:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = t.elapsed();
    let handled = ACCOUNTS * (POSTS + 1);
    println!(
        "handler concurrency 1, {handled} messages x 20 ms to {ACCOUNTS} instances over 2 engines x 8 workers: \
         at most {} at once, {} handler calls, {took:.2?}",
        calls.most(),
        calls.count()
    );
    assert_eq!(calls.most(), 1, "never two handler calls at once");
    assert!(calls.count() >= handled as usize, "every message handled");
    for engine in engines {
        engine.shutdown().await;
    }
}
