//! Stopping an engine: `shutdown().await` returns once every worker of the
//! engine finished (a running step within the shutdown grace), and
//! `run_workers_until` stops on the caller's signal. On the paused clock,
//! so that "within the grace" is exact.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Journal;
use saga_runtime::backend::memory::MemoryBackend;
use saga_runtime::prelude::*;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

/// Step 1 holds until released; step 2 is quick.
struct Held {
    journal: Journal,
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

impl Held {
    fn new(journal: &Journal) -> Self {
        Held {
            journal: journal.clone(),
            entered: Arc::new(Notify::new()),
            release: Arc::new(Notify::new()),
        }
    }
}

#[saga(name = "held")]
impl Held {
    #[saga_step(1)]
    async fn first(&self, n: u32) -> Result<u32, StepError> {
        self.entered.notify_one();
        self.release.notified().await;
        self.journal.record("first finished");
        Ok(n + 1)
    }

    #[saga_step(2)]
    async fn second(&self, n: u32) -> Result<u32, StepError> {
        self.journal.record("second");
        Ok(n + 1)
    }
}

/// A step that runs for an hour, heeding `ctx.cancelled()` or not.
struct Long {
    entered: Arc<Notify>,
    heeds_cancellation: bool,
}

#[saga(name = "long")]
impl Long {
    #[saga_step(1, timeout_ms = 7_200_000)]
    async fn work(&self, n: u32, ctx: &StepContext) -> Result<u32, StepError> {
        self.entered.notify_one();
        if self.heeds_cancellation {
            ctx.cancelled().await;
            return Err(StepError::transient("stopped half-way"));
        }
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(n)
    }
}

const GRACE: Duration = Duration::from_secs(10);
const STOP_GRACE: Duration = Duration::from_secs(2);

async fn long_engine(heeds_cancellation: bool) -> (Engine, Arc<Notify>) {
    let entered = Arc::new(Notify::new());
    let engine = Engine::builder()
        .saga(Long {
            entered: entered.clone(),
            heeds_cancellation,
        })
        .workers(1)
        .shutdown_grace(GRACE)
        .stop_grace(STOP_GRACE)
        .build()
        .await
        .unwrap();
    (engine, entered)
}

/// Shuts `engine` down in a task of its own, recording when that returned.
fn shut_down_in_background(engine: &Engine, journal: &Journal) -> tokio::task::JoinHandle<()> {
    let (engine, journal) = (engine.clone(), journal.clone());
    tokio::spawn(async move {
        engine.shutdown().await;
        journal.record("shutdown returned");
    })
}

#[tokio::test(start_paused = true)]
async fn shutdown_returns_after_the_running_step_finished_and_its_progress_is_kept() {
    let backend = MemoryBackend::new();
    let journal = Journal::default();
    let saga = Held::new(&journal);
    let (entered, release) = (saga.entered.clone(), saga.release.clone());
    let engine = Engine::builder()
        .backend(backend.clone())
        .saga(saga)
        .workers(1)
        .build()
        .await
        .unwrap();
    let id = engine.start::<Held>(1).await.unwrap();
    entered.notified().await;

    let stopping = shut_down_in_background(&engine, &journal);
    // Ten seconds (of the paused clock), well within the 30 s grace: the
    // shutdown is still waiting for the step.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!stopping.is_finished(), "shutdown left a step running");
    release.notify_one();
    stopping.await.unwrap();
    assert_eq!(journal.labels(), ["first finished", "shutdown returned"]);

    // Step 1's completion is recorded; step 2 was left for later.
    let task = engine.task(id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Running);
    assert_eq!(task.steps[0].status, StepStatus::Completed);
    assert_eq!(task.steps[0].output, Some(serde_json::json!(2)));
    assert_eq!(task.steps[1].status, StepStatus::Pending);

    // An engine started after it goes on from step 2 at once.
    let next = Engine::builder()
        .backend(backend)
        .saga(Held::new(&journal))
        .build()
        .await
        .unwrap();
    assert_eq!(next.wait_output::<Held>(id).await.unwrap(), 3);
    assert_eq!(
        journal.labels(),
        ["first finished", "shutdown returned", "second"]
    );
    next.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn run_workers_until_returns_once_its_signal_completed() {
    let journal = Journal::default();
    let saga = Held::new(&journal);
    let release = saga.release.clone();
    release.notify_one(); // step 1 goes straight through
    let engine = Engine::builder()
        .saga(saga)
        .workers(0)
        .build()
        .await
        .unwrap();
    let (stop, signal) = oneshot::channel::<()>();
    let running = tokio::spawn({
        let engine = engine.clone();
        async move {
            let signal = async {
                let _ = signal.await;
            };
            engine.run_workers_until(2, signal).await
        }
    });
    let id = engine.start::<Held>(1).await.unwrap();
    assert_eq!(engine.wait_output::<Held>(id).await.unwrap(), 3);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!running.is_finished(), "the workers stopped on their own");

    let sent = Instant::now();
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    // The idle workers each had a read in flight: it is let finish, and it
    // returns within the receive wait (1 s).
    assert!(
        sent.elapsed() <= Duration::from_secs(1),
        "{:?}",
        sent.elapsed()
    );

    // The signal shut the engine down: nothing works on a new task, and a
    // shutdown now has nothing left to wait for.
    let id = engine.start::<Held>(1).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let task = engine.task(id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Pending);
    let again = Instant::now();
    engine.shutdown().await;
    assert_eq!(again.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn run_workers_stops_when_another_clone_shuts_down_which_waits_for_its_steps() {
    let journal = Journal::default();
    let saga = Held::new(&journal);
    let (entered, release) = (saga.entered.clone(), saga.release.clone());
    let engine = Engine::builder()
        .saga(saga)
        .workers(0)
        .build()
        .await
        .unwrap();
    let running = tokio::spawn({
        let (engine, journal) = (engine.clone(), journal.clone());
        async move {
            engine.run_workers(1).await.unwrap();
            journal.record("run_workers returned");
        }
    });
    let id = engine.start::<Held>(1).await.unwrap();
    entered.notified().await;
    let stopping = shut_down_in_background(&engine, &journal);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!running.is_finished() && !stopping.is_finished());
    release.notify_one();
    running.await.unwrap();
    stopping.await.unwrap();
    let labels = journal.labels();
    assert_eq!(labels[0], "first finished", "{labels:?}");
    assert_eq!(labels.len(), 3, "{labels:?}");
    let task = engine.task(id).await.unwrap().unwrap();
    assert_eq!(task.steps[0].status, StepStatus::Completed);
}

/// The step heeds `ctx.cancelled()`: the shutdown lasts the grace exactly.
/// The step's interruption is a timer started when the engine's token is
/// cancelled, due `shutdown_grace` later; it fires `ctx.cancelled()`, the
/// step returns at once, and committing the interruption and handing the
/// message back take no time on the in-memory backend. Nothing else holds
/// the shutdown up: the timer poller, the janitor and the cancellation
/// listener stop as soon as the token is cancelled, and the only worker is
/// busy with the step (concurrency 1), not in a read.
#[tokio::test(start_paused = true)]
async fn a_step_heeding_cancellation_holds_shutdown_up_for_the_grace_exactly() {
    let (engine, entered) = long_engine(true).await;
    let id = engine.start::<Long>(1).await.unwrap();
    entered.notified().await;
    let started = Instant::now();
    engine.shutdown().await;
    assert_eq!(started.elapsed(), GRACE);

    // The attempt was interrupted, not failed: made again elsewhere without
    // counting against its retry budget.
    let task = engine.task(id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Running);
    assert_eq!(task.steps[0].status, StepStatus::Pending);
    assert!(interrupted(&task), "{:#?}", task.audit_log);
}

/// Whether the task's audit log records an attempt interrupted by a
/// shutdown.
fn interrupted(task: &TaskInstance) -> bool {
    task.audit_log.iter().any(|e| {
        e.error
            .as_deref()
            .is_some_and(|e| e.contains("interrupted by its worker's shutdown"))
    })
}

/// The step ignores `ctx.cancelled()`: it gets the stop grace on top of the
/// shutdown grace, then is dropped; the shutdown does not wait for the
/// hour it would take.
#[tokio::test(start_paused = true)]
async fn a_step_ignoring_cancellation_is_dropped_after_the_grace_and_the_stop_grace() {
    let (engine, entered) = long_engine(false).await;
    let id = engine.start::<Long>(1).await.unwrap();
    entered.notified().await;
    let started = Instant::now();
    engine.shutdown().await;
    assert_eq!(started.elapsed(), GRACE + STOP_GRACE);
    let task = engine.task(id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Running);
    assert_eq!(task.steps[0].status, StepStatus::Pending);
    assert!(interrupted(&task), "{:#?}", task.audit_log);
}

#[tokio::test(start_paused = true)]
async fn shutdown_may_be_called_twice_and_from_several_clones_at_once() {
    let journal = Journal::default();
    let saga = Held::new(&journal);
    let (entered, release) = (saga.entered.clone(), saga.release.clone());
    let engine = Engine::builder()
        .saga(saga)
        .workers(2)
        .build()
        .await
        .unwrap();
    engine.start::<Held>(1).await.unwrap();
    entered.notified().await;
    let stop = |label: &'static str| {
        let (engine, journal) = (engine.clone(), journal.clone());
        tokio::spawn(async move {
            engine.shutdown().await;
            journal.record(label);
        })
    };
    let (one, two) = (stop("one returned"), stop("two returned"));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!one.is_finished() && !two.is_finished());
    release.notify_one();
    one.await.unwrap();
    two.await.unwrap();
    let labels = journal.labels();
    assert_eq!(labels[0], "first finished", "{labels:?}");
    assert_eq!(labels.len(), 3, "{labels:?}");

    // Once stopped, stopping again returns at once.
    let again = Instant::now();
    engine.shutdown().await;
    engine.shutdown().await;
    assert_eq!(again.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn an_idle_engine_stops_within_the_receive_wait() {
    let engine = Engine::builder()
        .saga(Held::new(&Journal::default()))
        .workers(4)
        .build()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let started = Instant::now();
    engine.shutdown().await;
    // Each idle worker's read is let finish (it takes what arrives until
    // then): at most the receive wait, 1 s.
    assert!(
        started.elapsed() <= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

/// `shutdown_signal` completes on SIGTERM and on SIGINT (Ctrl-C). The test
/// listens for each first, so that the signal it sends itself does not end
/// the test process.
#[cfg(unix)]
#[tokio::test]
async fn shutdown_signal_completes_on_sigterm_and_on_ctrl_c() {
    use tokio::signal::unix::{signal, SignalKind};

    for (kind, name) in [
        (SignalKind::terminate(), "-TERM"),
        (SignalKind::interrupt(), "-INT"),
    ] {
        let mut delivered = signal(kind).unwrap();
        let mut stop = tokio::spawn(saga_runtime::shutdown_signal());
        // `shutdown_signal` listens from its first poll on, and a signal
        // sent before that is not seen: send until one is.
        let mut seen = false;
        for _ in 0..50 {
            let sent = std::process::Command::new("kill")
                .args([name, &std::process::id().to_string()])
                .status()
                .unwrap();
            assert!(sent.success());
            delivered.recv().await;
            if tokio::time::timeout(Duration::from_millis(100), &mut stop)
                .await
                .is_ok()
            {
                seen = true;
                break;
            }
        }
        assert!(seen, "shutdown_signal did not complete on {name}");
    }
}
