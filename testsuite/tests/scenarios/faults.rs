//! Ordinary production faults, once for every store: each reproduces one
//! way an engine used to stall, loop, lose or grow, and proves that every
//! started task now ends as its record says.
//!
//! Executions of the `chaos` saga are recorded on a Redis of their own, out
//! of the way of the faults injected into the store.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use saga_runtime::prelude::*;
use saga_runtime::{Error, TaskFilter};
use sagas_tests::chaos::{check_task, Chaos, ChaosConfig};
use sagas_tests::double::{all_doubled_once, start_doubles, Double};

use super::rig::{finish, Rig};
use crate::common::stores::ScenarioStore;

fn quick() -> ChaosConfig {
    ChaosConfig {
        max_work: Duration::ZERO,
        failure_rate: 0.0,
        record: true,
        poison: None,
    }
}

/// An engine that starts and reads `double` tasks, running no workers.
async fn double_client<S: ScenarioStore>(store: &S, visibility: Duration) -> Engine {
    Engine::builder()
        .backend_arc(store.backend(visibility).await)
        .saga(Double)
        .workers(0)
        .build()
        .await
        .unwrap()
}

fn wall_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// A worker process SIGKILLed in the middle of a step: nobody takes the
/// task over while its lease and message could still be the dead
/// worker's, then another worker does, the killed attempt counted, and the
/// task completes (a killed worker's tasks used to wait for a five-minute
/// lock TTL).
pub async fn a_worker_killed_mid_step_hands_its_task_over_after_the_visibility_timeout<
    S: ScenarioStore,
>() {
    let rig = Rig::<S>::start();
    let client = rig.chaos_engine(quick(), 0).await;
    let mut recorder = rig.recorder().await;
    let id = client.start::<Chaos>(7).await.unwrap();
    let others: Vec<(u64, TaskId)> = {
        let mut others = Vec::new();
        for n in 10..14 {
            others.push((n, client.start::<Chaos>(n).await.unwrap()));
        }
        others
    };
    let visibility = Duration::from_millis(1000);
    // No LOCK_TTL_MS: the engine's default lease.
    let envs = |work: &'static str| {
        [
            ("WORKERS", "1"),
            ("VISIBILITY_MS", "1000"),
            ("MAX_WORK_MS", work),
            ("FAILURE_RATE", "0"),
        ]
    };
    // Its steps take up to a minute: it is killed inside the first.
    let mut slow = rig.spawn_worker(&envs("60000"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let task = client.task(id).await.unwrap().unwrap();
        if task.steps[0].attempt_count == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the step never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    slow.kill().unwrap(); // SIGKILL, mid-step
    slow.wait().unwrap();
    let (killed_at, killed_wall) = (Instant::now(), wall_us());
    assert!(
        Chaos::executions(&mut recorder, id)
            .await
            .unwrap()
            .is_empty(),
        "killed before the step's body returned"
    );
    let mut replacement = rig.spawn_worker(&envs("0"));
    let task = finish(&client, id, Duration::from_secs(20)).await;
    let took = killed_at.elapsed();
    rig.all_completed(&client, &others).await;
    let _ = replacement.kill();
    let _ = replacement.wait();

    assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
    let attempts: Vec<u32> = task.steps.iter().map(|s| s.attempt_count).collect();
    assert_eq!(attempts, [2, 1, 1], "the killed attempt is counted");
    let executions = Chaos::executions(&mut recorder, id).await.unwrap();
    check_task(&task, &executions).unwrap();
    let replacement_pid = format!("pid-{}", replacement.id());
    assert!(
        executions.len() == 3 && executions.iter().all(|e| e.worker == replacement_pid),
        "the other worker ran every step: {executions:?}"
    );
    // The dead worker's lease was last renewed a heartbeat (a third of the
    // lease) before the kill at the earliest: the task was not taken over
    // before that lease could have run out.
    let resumed_after =
        Duration::from_micros(executions[0].start_us.saturating_sub(killed_wall) as u64);
    assert!(
        resumed_after >= visibility / 2,
        "taken over {resumed_after:?} after the kill, while the dead worker's lease may have held"
    );
    assert!(
        took < visibility + Duration::from_secs(6),
        "the killed worker's task took {took:?} to finish"
    );
    println!("resumed {resumed_after:?} after the kill, finished after {took:?}");
}

/// Where a test that crashes the server is: before the crash, while the
/// server is down, after the restart.
const UP: u8 = 0;
const DOWN: u8 = 1;
const RESTARTED: u8 = 2;

/// Whether a call that began in `before` and returned in `after` was in
/// flight while the server was down.
fn spanned_the_outage(before: u8, after: u8) -> bool {
    before <= DOWN && after >= DOWN
}

/// What the caller of [`start_paced`] saw: the tasks they started (input,
/// id), what their calls failed with, and how many calls were in flight
/// while the server was down.
struct Called {
    ids: Vec<(u64, TaskId)>,
    errors: Vec<String>,
    spanning: usize,
}

/// Starts tasks `0..n` (every other one with a key), one every `pace`,
/// then waits for them.
fn start_paced(
    engine: &Engine,
    n: u64,
    pace: Duration,
    phase: &Arc<AtomicU8>,
) -> tokio::task::JoinHandle<Called> {
    let (engine, phase) = (engine.clone(), phase.clone());
    tokio::spawn(async move {
        let (mut ids, mut errors, mut spanning) = (Vec::new(), Vec::new(), 0);
        for i in 0..n {
            let before = phase.load(Ordering::SeqCst);
            let started = match i % 2 {
                0 => engine.start::<Chaos>(i).await,
                _ => engine.start_with_key::<Chaos>(&format!("k-{i}"), i).await,
            };
            spanning += usize::from(spanned_the_outage(before, phase.load(Ordering::SeqCst)));
            match started {
                Ok(id) => ids.push((i, id)),
                Err(e) => errors.push(format!("start {i}: {e}")),
            }
            tokio::time::sleep(pace).await;
        }
        for (_, id) in &ids {
            if let Err(e) = engine.wait(*id).await {
                errors.push(format!("wait {id}: {e}"));
            }
        }
        Called {
            ids,
            errors,
            spanning,
        }
    })
}

/// Waits for every task not finished yet, each in a call of its own;
/// returns what the calls failed with and how many were in flight while
/// the server was down.
async fn wait_unfinished(
    engine: &Engine,
    phase: &Arc<AtomicU8>,
) -> tokio::task::JoinHandle<(Vec<String>, usize)> {
    let mut unfinished = Vec::new();
    for status in [TaskStatus::Pending, TaskStatus::Running] {
        let filter = TaskFilter::new().saga("chaos").status(status).limit(1000);
        let page = engine.tasks(filter).await.unwrap();
        unfinished.extend(page.tasks.into_iter().map(|t| t.id));
    }
    let waits: Vec<_> = unfinished
        .into_iter()
        .map(|id| {
            let (engine, phase) = (engine.clone(), phase.clone());
            tokio::spawn(async move {
                let before = phase.load(Ordering::SeqCst);
                let waited = engine.wait(id).await;
                let spanned = spanned_the_outage(before, phase.load(Ordering::SeqCst));
                (waited.err().map(|e| format!("wait {id}: {e}")), spanned)
            })
        })
        .collect();
    tokio::spawn(async move {
        let (mut errors, mut spanning) = (Vec::new(), 0);
        for wait in waits {
            let (error, spanned) = wait.await.unwrap();
            errors.extend(error);
            spanning += usize::from(spanned);
        }
        (errors, spanning)
    })
}

/// The server crashes and comes back a second later while tasks run and
/// callers start and wait for more: the in-process engine rides it out (no
/// call fails), and every task completes as recorded.
pub async fn an_engine_rides_out_a_server_crash_and_restart<S: ScenarioStore>() {
    let mut rig = Rig::<S>::start();
    let chaos = ChaosConfig {
        max_work: Duration::from_millis(30),
        failure_rate: 0.1,
        ..quick()
    };
    let engine = rig.chaos_engine(chaos, 2).await;
    let phase = Arc::new(AtomicU8::new(UP));
    let caller = start_paced(&engine, 80, Duration::from_millis(25), &phase);
    // Some tasks have finished and some are in flight when it crashes.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let counts = engine.backend().count_tasks("chaos").await.unwrap();
        let count = |s: TaskStatus| counts.iter().find(|c| c.0 == s).map_or(0, |c| c.1);
        let total = counts.iter().map(|c| c.1).sum::<usize>();
        if count(TaskStatus::Completed) >= 10 && total > count(TaskStatus::Completed) {
            break;
        }
        assert!(Instant::now() < deadline, "tasks did not get going");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waiter = wait_unfinished(&engine, &phase).await;
    tokio::task::block_in_place(|| {
        rig.store.crash();
        phase.store(DOWN, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(1));
        rig.store.restart();
        phase.store(RESTARTED, Ordering::SeqCst);
    });
    let Called {
        ids,
        mut errors,
        spanning: starts_spanning,
    } = caller.await.unwrap();
    let (wait_errors, waits_spanning) = waiter.await.unwrap();
    errors.extend(wait_errors);
    assert!(errors.is_empty(), "callers saw errors: {errors:#?}");
    assert!(
        starts_spanning >= 1 && waits_spanning >= 1,
        "calls were in flight while the server was down ({starts_spanning} starts, {waits_spanning} waits)"
    );
    assert_eq!(ids.len(), 80);
    rig.all_completed(&engine, &ids).await;
    println!(
        "in flight while the server was down: {starts_spanning} starts, {waits_spanning} waits"
    );
}

/// A task record this version cannot read (a status it does not know, as
/// a newer version may write during a rolling deploy), taken in one read
/// with good messages. The read used to fail as a whole: the good messages
/// waited out the visibility timeout, the bad one came back for ever, and
/// listing the saga failed. Now the good ones run at once, the bad one is
/// handed back for a version that can read it and dead-lettered at the cap
/// with a reason, and listings (paged or not) leave it out.
pub async fn an_unreadable_task_record_is_dead_lettered_alone_and_holds_nothing_up<
    S: ScenarioStore,
>() {
    let store = S::start();
    let visibility = Duration::from_secs(8);
    let client = double_client(&store, visibility).await;
    let mut good = start_doubles(&client, 1..4).await;
    let bad = client.start::<Double>(99).await.unwrap();
    good.extend(start_doubles(&client, 4..7).await);
    store.corrupt_status(bad, "Exploded");
    // One worker taking up to 8 at once: the first read takes all seven.
    let started = Instant::now();
    let _workers = Engine::builder()
        .backend_arc(store.backend(visibility).await)
        .saga(Double)
        .worker_concurrency(8)
        .max_deliveries(2)
        .lock_retry_delay(Duration::from_millis(50))
        .workers(1)
        .build()
        .await
        .unwrap();
    all_doubled_once(&client, &good, Duration::from_secs(20)).await;
    let took = started.elapsed();
    assert!(
        took < visibility / 2,
        "the good tasks waited {took:?} (visibility timeout {visibility:?})"
    );
    println!("the good tasks were done in {took:?}");

    let deadline = Instant::now() + Duration::from_secs(20);
    let letter = loop {
        let page = client.dead_letters(Default::default()).await.unwrap();
        if let Some(letter) = page.letters.into_iter().next() {
            break letter;
        }
        assert!(
            Instant::now() < deadline,
            "the unreadable task's message was never dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(letter.task_id, Some(bad), "{letter:#?}");
    assert!(
        letter.reason.contains("cannot read the record") && letter.reason.contains("Exploded"),
        "{letter:#?}"
    );
    assert_eq!(store.unsettled(), 0, "nothing left unsettled on the queue");

    let listed = client.tasks_of("double").await.unwrap();
    let ids: Vec<TaskId> = listed.iter().map(|t| t.id).collect();
    assert_eq!(listed.len(), good.len(), "{ids:?}");
    assert!(!ids.contains(&bad));
    // Paged three at a time: the first page's read meets it, and reads on
    // past it rather than end the listing there.
    let mut paged = Vec::new();
    let mut filter = TaskFilter::new().saga("double").limit(3);
    loop {
        let page = client.tasks(filter.clone()).await.unwrap();
        paged.extend(page.tasks.iter().map(|t| t.id));
        match page.next {
            Some(next) => filter = filter.after(next),
            None => break,
        }
    }
    assert_eq!(paged.len(), good.len(), "{paged:?}");
    let error = client.task(bad).await.unwrap_err().to_string();
    assert!(error.contains("Exploded"), "{error}");
}

/// Every connection of the engine cut every few dozen milliseconds while
/// 100 tasks run: `wait` used to fail on the first cut connection and
/// `start` could fail after creating its task, so a retrying caller made a
/// second one. Now nothing is lost or made twice, no caller sees an error,
/// and a key names one task.
pub async fn callers_ride_out_cut_connections_and_keyed_starts_are_idempotent<S: ScenarioStore>() {
    let rig = Arc::new(Rig::<S>::start());
    let chaos = ChaosConfig {
        max_work: Duration::from_millis(10),
        ..quick()
    };
    let engine = rig.chaos_engine(chaos, 2).await;
    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(Mutex::new(Vec::<usize>::new()));
    let killer = {
        let (stop, kills, rig) = (stop.clone(), kills.clone(), rig.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let cut = rig.store.kill_connections();
                kills.lock().unwrap().push(cut);
                std::thread::sleep(Duration::from_millis(40));
            }
        })
    };
    // The cutting is under way before the first call, and goes on until
    // every task has finished.
    while kills.lock().unwrap().len() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let kills_before = kills.lock().unwrap().len();
    let never_down = Arc::new(AtomicU8::new(UP));
    let Called { ids, errors, .. } = start_paced(&engine, 100, Duration::ZERO, &never_down)
        .await
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    killer.join().unwrap();
    assert!(errors.is_empty(), "callers saw errors: {errors:#?}");
    let kills = kills.lock().unwrap()[kills_before..].to_vec();
    let cut: usize = kills.iter().sum();
    assert!(
        kills.len() >= 5 && cut >= 10,
        "connections were cut only {cut} times in {} rounds",
        kills.len()
    );
    rig.all_completed(&engine, &ids).await;
    let listed = engine
        .tasks(TaskFilter::new().saga("chaos").limit(1000))
        .await
        .unwrap();
    assert_eq!(listed.tasks.len(), 100, "no start made a second task");
    let again = engine.start_with_key::<Chaos>("k-1", 1).await.unwrap();
    assert_eq!(again, ids[1].1, "the same key is the same task");
    let reused = engine.start_with_key::<Chaos>("k-1", 2).await;
    assert!(matches!(reused, Err(Error::KeyReused { .. })), "{reused:?}");
    println!(
        "{cut} connections cut in {} rounds while 100 tasks ran",
        kills.len()
    );
}

/// A message whose handling kills its worker (abort, out of memory) used to
/// be redelivered for ever (and on Redis each restart left a dead consumer
/// behind): it is dead-lettered after the cap, with its task, and holds
/// nothing else up.
pub async fn a_message_that_kills_its_worker_is_dead_lettered_after_the_cap<S: ScenarioStore>() {
    let rig = Rig::<S>::start();
    let client = rig.chaos_engine(quick(), 0).await;
    let mut ids = Vec::new();
    for n in 1..=4u64 {
        ids.push((n, client.start::<Chaos>(n).await.unwrap()));
    }
    let poison = client.start::<Chaos>(666).await.unwrap();
    let envs = [
        ("WORKERS", "1"),
        ("POISON", "666"),
        ("MAX_DELIVERIES", "3"),
        ("VISIBILITY_MS", "500"),
        ("MAX_WORK_MS", "0"),
        ("FAILURE_RATE", "0"),
        ("HOUSEKEEPING_MS", "200"),
        ("IDLE_CONSUMER_MS", "1000"),
    ];
    let mut worker = rig.spawn_worker(&envs);
    let mut crashes = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let task = client.task(poison).await.unwrap().unwrap();
        if task.status.is_terminal() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the poison message was still looping after {crashes} crashes"
        );
        if worker.try_wait().unwrap().is_some() {
            crashes += 1;
            worker = rig.spawn_worker(&envs);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let task = client.task(poison).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::DeadLettered, "{task:#?}");
    let error = task.error.clone().unwrap();
    assert!(
        error.contains("delivered 3 times without completing"),
        "{error}"
    );
    assert!(crashes >= 3, "each delivery killed a worker ({crashes})");
    rig.all_completed(&client, &ids).await;
    let letters = client
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    assert!(
        letters
            .iter()
            .any(|l| l.task_id == Some(poison) && l.reason.contains("delivered 3 times")),
        "{letters:#?}"
    );
    // What the dead workers left registered is removed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.store.stale_consumers() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(rig.store.stale_consumers(), 0, "only the live worker stays");
    let _ = worker.kill();
    let _ = worker.wait();
}

/// As many hung calls as workers used to stop all progress; a step's
/// attempt now has a timeout.
pub async fn hung_steps_time_out_and_every_task_still_finishes<S: ScenarioStore>() {
    struct HangOnce {
        calls: Arc<AtomicUsize>,
    }
    #[saga(name = "hang-once")]
    impl HangOnce {
        #[saga_step(1, timeout_ms = 500)]
        #[retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 10)]
        async fn call(&self, n: u32) -> Result<u32, StepError> {
            // The first two calls (one per worker) never return.
            if self.calls.fetch_add(1, Ordering::SeqCst) < 2 {
                std::future::pending::<()>().await;
            }
            Ok(n)
        }
    }
    let store = S::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .backend_arc(store.backend(Duration::from_secs(2)).await)
        .saga(HangOnce {
            calls: calls.clone(),
        })
        .stop_grace(Duration::from_millis(100))
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(2)
        .build()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(engine.start::<HangOnce>(n).await.unwrap());
    }
    for id in ids {
        let task = finish(&engine, id, Duration::from_secs(15)).await;
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        7,
        "5 tasks, 2 timed-out attempts"
    );
}

/// A retry's backoff used to be a sleep inside the lease: it held a worker
/// and the task's lock for the whole delay.
pub async fn a_retry_backoff_holds_neither_a_worker_nor_the_lock<S: ScenarioStore>() {
    struct Flaky {
        calls: Arc<AtomicUsize>,
    }
    #[saga(name = "flaky")]
    impl Flaky {
        #[saga_step(1)]
        #[retry_policy(max_retries = 1, backoff = constant, base_delay_ms = 3000)]
        async fn call(&self, n: u32) -> Result<u32, StepError> {
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(StepError::transient("503"));
            }
            Ok(n)
        }
    }
    let store = S::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .backend_arc(store.backend(Duration::from_secs(2)).await)
        .saga(Flaky {
            calls: calls.clone(),
        })
        .saga(Double)
        .workers(1)
        .build()
        .await
        .unwrap();
    let flaky = engine.start::<Flaky>(1).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    // The only worker is free while the retry waits.
    let double = engine.start::<Double>(21).await.unwrap();
    let task = finish(&engine, double, Duration::from_secs(10)).await;
    assert_eq!(task.output_as::<u32>().unwrap().unwrap(), 42);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the other task waited {:?} for the backoff",
        started.elapsed()
    );
    // And so is the lock: anyone may take it meanwhile.
    let locked = engine
        .backend()
        .lock_and_load(flaky, Duration::from_millis(100))
        .await
        .unwrap()
        .expect("the lock is free during the backoff");
    engine.backend().unlock(&locked.lease).await.unwrap();
    let task = finish(&engine, flaky, Duration::from_secs(10)).await;
    assert_eq!(task.status, TaskStatus::Completed);
    assert!(started.elapsed() >= Duration::from_millis(2500));
}

/// A message handed back because its task was locked used to wait a whole
/// visibility timeout (`release` did nothing on Redis); it comes back at
/// once.
pub async fn a_handed_back_message_comes_back_promptly<S: ScenarioStore>() {
    let store = S::start();
    let visibility = Duration::from_secs(30);
    let client = double_client(&store, visibility).await;
    let id = client.start::<Double>(4).await.unwrap();
    // Another worker holds the task for a moment.
    let held = client
        .backend()
        .lock_and_load(id, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let _workers = Engine::builder()
        .backend_arc(store.backend(visibility).await)
        .saga(Double)
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(1)
        .build()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        client.task(id).await.unwrap().unwrap().status,
        TaskStatus::Pending,
        "locked meanwhile"
    );
    client.backend().unlock(&held.lease).await.unwrap();
    let released = Instant::now();
    let task = finish(&client, id, Duration::from_secs(10)).await;
    assert_eq!(task.output_as::<u32>().unwrap().unwrap(), 8);
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "handed back, not left for the {visibility:?} visibility timeout ({:?})",
        released.elapsed()
    );
}

/// What `now` holds beyond `baseline`.
fn beyond(now: BTreeMap<String, usize>, baseline: &BTreeMap<String, usize>) -> Vec<String> {
    now.into_iter()
        .filter(|(what, n)| n > baseline.get(what).unwrap_or(&0))
        .map(|(what, n)| format!("{what} ({n})"))
        .collect()
}

/// Nothing used to be deleted. With a retention, everything a finished
/// task stored goes (records, steps, audit, index entries, claims),
/// dead letters are trimmed, and the store returns to what it held before
/// the tasks.
pub async fn finished_tasks_leave_nothing_behind_once_retention_passes<S: ScenarioStore>() {
    struct Mixed;
    #[saga(name = "mixed")]
    impl Mixed {
        #[saga_step(1)]
        async fn reserve(&self, n: u32) -> Result<u32, StepError> {
            Ok(n)
        }
        #[compensate(reserve)]
        async fn release(&self, _n: u32) -> Result<(), StepError> {
            Ok(())
        }
        #[saga_step(2)]
        #[retry_policy(max_retries = 1, backoff = constant, base_delay_ms = 10, on_exhausted = compensate)]
        async fn charge(&self, n: u32) -> Result<u32, StepError> {
            match n % 3 {
                0 => Ok(n),
                1 => Err(StepError::transient("declined")),
                _ => Err(StepError::permanent("fraud")),
            }
        }
    }
    let store = S::start();
    let engine = Engine::builder()
        .backend_arc(store.backend(Duration::from_secs(2)).await)
        .saga(Mixed)
        .retention(Some(Duration::from_millis(500)))
        .attention_retention(Some(Duration::from_millis(500)))
        .housekeeping_interval(Duration::from_millis(100))
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(2)
        .build()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let baseline = store.stored();
    // Each wait begins as its task starts: a task that ended early may be
    // gone (its retention passed) by the time a later one ends.
    let mut ids = Vec::new();
    let mut waits = Vec::new();
    for n in 0..30 {
        let id = engine.start::<Mixed>(n).await.unwrap();
        let engine = engine.clone();
        waits.push(tokio::spawn(async move {
            finish(&engine, id, Duration::from_secs(10)).await
        }));
        ids.push(id);
    }
    for wait in waits {
        assert!(wait.await.unwrap().status.is_terminal());
    }
    engine.backend().enqueue_raw(b"garbage").await.unwrap();
    let stored: usize = store
        .stored()
        .iter()
        .map(|(what, n)| n.saturating_sub(*baseline.get(what).unwrap_or(&0)))
        .sum();
    assert!(
        stored > 30,
        "the tasks were stored ({stored} beyond the baseline)"
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    let leftover = loop {
        let leftover = beyond(store.stored(), &baseline);
        if leftover.is_empty() || Instant::now() > deadline {
            break leftover;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(leftover.is_empty(), "left behind: {leftover:?}");
    for id in &ids {
        assert!(engine.task(*id).await.unwrap().is_none());
    }
    let listed = engine.tasks(TaskFilter::new().saga("mixed")).await.unwrap();
    assert!(listed.tasks.is_empty());
    let letters = engine.dead_letters(Default::default()).await.unwrap();
    assert!(letters.letters.is_empty());
}

/// Whether a cancellation cuts a wait short used to be decided by each
/// store, which enqueued any delayed message at once while the task's
/// cancellation flag was set. The flag stays set once the cancellation is
/// applied, so a cancelled task's compensations were retried with no
/// backoff at all. The engine decides now: a running task that waits out
/// a retry is cancelled at once; a compensation waits out its own policy.
pub async fn a_cancellation_cuts_a_retrys_wait_short_but_not_a_compensations<S: ScenarioStore>() {
    struct Refund {
        client: Arc<Mutex<Option<Engine>>>,
        undo_calls: Arc<Mutex<Vec<Instant>>>,
    }
    #[cancellable]
    #[saga(name = "refund")]
    impl Refund {
        #[saga_step(1)]
        #[compensation_retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 600)]
        async fn hold(&self, n: u32) -> Result<u32, StepError> {
            Ok(n)
        }

        #[compensate(hold)]
        async fn unhold(&self, _n: u32) -> Result<(), StepError> {
            let mut calls = self.undo_calls.lock().unwrap();
            calls.push(Instant::now());
            match calls.len() {
                1 | 2 => Err(StepError::transient("the provider is busy")),
                _ => Ok(()),
            }
        }

        // Asks for its own cancellation (as another process would), then
        // fails for a retry an hour away: the task must not wait it out.
        #[saga_step(2)]
        #[retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 3_600_000)]
        async fn pay(&self, n: u32, ctx: &StepContext) -> Result<u32, StepError> {
            let client = self.client.lock().unwrap().clone().expect("set");
            let cancelled = client.cancel::<Refund>(ctx.task_id()).await.unwrap();
            assert_eq!(cancelled, CancelResult::Cancelled);
            Err(StepError::transient(format!("declined {n}")))
        }
    }
    let store = S::start();
    let client = Arc::new(Mutex::new(None));
    let undo_calls = Arc::new(Mutex::new(Vec::new()));
    let engine = Engine::builder()
        .backend_arc(store.backend(Duration::from_secs(5)).await)
        .saga(Refund {
            client: client.clone(),
            undo_calls: undo_calls.clone(),
        })
        .workers(1)
        .build()
        .await
        .unwrap();
    *client.lock().unwrap() = Some(engine.clone());
    let id = engine.start::<Refund>(7).await.unwrap();
    let task = finish(&engine, id, Duration::from_secs(20)).await;
    assert_eq!(task.status, TaskStatus::Cancelled, "{task:#?}");
    assert_eq!(task.steps[1].attempt_count, 1, "the retry never ran");
    let calls = undo_calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 3, "two failed compensation attempts, then one");
    for pair in calls.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= Duration::from_millis(550),
            "the compensation was retried {gap:?} after its last attempt, not after its 600 ms backoff"
        );
    }
}
