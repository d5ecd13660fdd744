//! A fault kit for your own sagas: runs one in process, on tokio's paused
//! clock, under faults drawn from a seed, checks the engine's invariants,
//! and reports how many times each step and compensation body ran.
//!
//! Retries, crashes and duplicate deliveries mean a step's body can run
//! more than once: the engine guarantees each step's *outcome* is recorded
//! once, not that its side effect happens once. The kit makes those
//! re-runs happen, deterministically, so that a test can assert that the
//! side effects are idempotent (`report.max_runs("charge")` is above 1,
//! yet the card was charged once) and that compensations complete.
//!
//! The faults, each decided per task from the seed (see [`Faults`]):
//! a worker crash after a body ran and before its outcome was written
//! (the body runs again), a lost acknowledgement (the message comes back),
//! a duplicate delivery, a delayed (reordered) delivery, a cancellation
//! (for `#[cancellable]` sagas) at the start or before or after a step, and
//! a compensation that fails transiently, before or after its body ran.
//!
//! The invariants: every task reaches a terminal status other than
//! `DeadLettered` or `CompensationFailed`; a step runs only once the one
//! before it succeeded; a completed task ran every step to success and no
//! compensation; a compensated, cancelled or failed task has no step whose
//! success was recorded left uncompensated, and its compensations
//! succeeded in reverse order; a compensated or cancelled task has no step
//! whose success was lost with a crash left uncompensated either, when
//! that step's compensation takes [`Outcome`](crate::Outcome); no body
//! runs once its task ended. (A compensation that takes the step's output
//! has nothing to be called with for a success lost with a crash: the
//! report lists such steps, [`TaskReport::uncompensated`].) A run that breaks one fails
//! with the seed, and [`FaultKit::seed`] (or `SAGA_FAULT_SEED=n`) replays
//! it exactly: decisions depend only on the seed and on each task's own
//! history, and the clock is virtual.
//!
//! ```
//! # use saga_runtime::prelude::*;
//! # use saga_runtime::testing::FaultKit;
//! # struct Shop;
//! # #[saga(name = "shop")]
//! # impl Shop {
//! #     #[saga_step(1)]
//! #     #[retry_policy(max_retries = 3)]
//! #     async fn charge(&self, n: u32) -> Result<u32, StepError> { Ok(n) }
//! # }
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let report = FaultKit::new(|| Shop).inputs(0..20u32).seed(7).run().await;
//! assert_eq!(report.ended(TaskStatus::Completed), 20);
//! assert!(report.max_runs("charge") <= 3);
//! # }
//! ```
//!
//! For process managers, [`ProcessFaultKit`] delivers their messages
//! through the real dispatch with duplicates and in a seeded shuffled
//! order, fails when a duplicate changed anything, and reports whether the
//! order did. It injects no crashes or lost acknowledgements there: the
//! in-memory dispatch runs no worker to crash.

mod backend;
mod journal;
mod observed;
mod process;
mod report;

pub use process::{ProcessFaultKit, ProcessFaultReport};
pub use report::{BodyRuns, CancelPoint, Fault, FaultFailure, FaultReport, TaskReport};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::memory::MemoryBackend;
use crate::engine::Engine;
use crate::saga::Saga;
use crate::util::Unpoisoned;
use backend::FaultyBackend;
use journal::Journal;
use observed::Observed;

/// The environment variable that, when set, overrides the seed: the way to
/// replay a failure printed by a test without editing it.
pub const SEED_VAR: &str = "SAGA_FAULT_SEED";

/// How often each fault is injected: probabilities in [0, 1], drawn per
/// task and per point (a body's run, a commit, a message).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// A crash after a body ran, before its outcome was written (at most
    /// twice per body and task).
    pub crash: f64,
    /// A commit whose acknowledgement is lost.
    pub lost_ack: f64,
    /// A commit whose next message is delivered twice.
    pub duplicate: f64,
    /// A message held back (up to 30 s) the first time it is delivered.
    pub delay: f64,
    /// A task cancelled (only `#[cancellable]` sagas), at a point chosen
    /// among its start and before or after each step.
    pub cancel: f64,
    /// A compensation's first run failing transiently.
    pub compensation_failure: f64,
    /// How much virtual time the tasks get to end.
    pub deadline: Duration,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            crash: 0.3,
            lost_ack: 0.15,
            duplicate: 0.15,
            delay: 0.15,
            cancel: 0.2,
            compensation_failure: 0.3,
            deadline: Duration::from_secs(24 * 3600),
        }
    }
}

impl Faults {
    /// No faults at all: a baseline run.
    pub const NONE: Faults = Faults {
        crash: 0.0,
        lost_ack: 0.0,
        duplicate: 0.0,
        delay: 0.0,
        cancel: 0.0,
        compensation_failure: 0.0,
        deadline: Duration::from_secs(24 * 3600),
    };
}

type Make<S> = Box<dyn Fn() -> S + Send + Sync>;

/// Runs a saga's tasks under seeded faults; see the [module docs](self).
pub struct FaultKit<S: Saga> {
    make: Make<S>,
    inputs: Vec<S::Input>,
    seed: u64,
    faults: Faults,
}

impl<S: Saga> FaultKit<S>
where
    S::Input: Clone,
{
    /// A kit for the saga `make` builds (once per run: each run gets fresh
    /// dependencies), with no inputs yet, seed 0 and the default faults.
    pub fn new(make: impl Fn() -> S + Send + Sync + 'static) -> Self {
        FaultKit {
            make: Box::new(make),
            inputs: Vec::new(),
            seed: 0,
            faults: Faults::default(),
        }
    }

    /// Adds one task's input.
    pub fn input(mut self, input: S::Input) -> Self {
        self.inputs.push(input);
        self
    }

    /// Adds a task per input.
    pub fn inputs(mut self, inputs: impl IntoIterator<Item = S::Input>) -> Self {
        self.inputs.extend(inputs);
        self
    }

    /// The seed to draw faults from (`SAGA_FAULT_SEED` overrides it).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// How often each fault happens.
    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// The seed a run uses: `SAGA_FAULT_SEED` if set, else [`seed`](Self::seed).
    pub fn effective_seed(&self) -> u64 {
        std::env::var(SEED_VAR)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(self.seed)
    }

    /// Runs every task to its end under the faults and returns the report.
    ///
    /// # Panics
    ///
    /// When an invariant was broken (the message has the seed), or when
    /// the clock is not paused (`#[tokio::test(start_paused = true)]`).
    pub async fn run(&self) -> FaultReport {
        match self.try_run().await {
            Ok(report) => report,
            Err(failure) => panic!("{failure}"),
        }
    }

    /// [`run`](Self::run) over several seeds (only `SAGA_FAULT_SEED` when
    /// it is set); returns the reports in order, panicking at the first
    /// failing seed.
    pub async fn run_seeds(&self, seeds: impl IntoIterator<Item = u64>) -> Vec<FaultReport> {
        let seeds: Vec<u64> = match std::env::var(SEED_VAR)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            Some(seed) => vec![seed],
            None => seeds.into_iter().collect(),
        };
        let mut reports = Vec::new();
        for seed in seeds {
            match self.run_seed(seed).await {
                Ok(report) => reports.push(report),
                Err(failure) => panic!("{failure}"),
            }
        }
        reports
    }

    /// [`run`](Self::run), returning a broken invariant as an error.
    pub async fn try_run(&self) -> Result<FaultReport, FaultFailure> {
        self.run_seed(self.effective_seed()).await
    }

    async fn run_seed(&self, seed: u64) -> Result<FaultReport, FaultFailure> {
        assert_paused().await;
        let def = S::definition();
        let journal = Arc::new(Journal::new(seed, self.faults, def, self.inputs.len()));
        let slot: observed::EngineSlot = Arc::new(Mutex::new(None));
        let saga = Observed {
            saga: (self.make)(),
            journal: journal.clone(),
            engine: slot.clone(),
        };
        let engine = Engine::builder()
            .saga(saga)
            .backend(FaultyBackend::new(MemoryBackend::new(), journal.clone()))
            .workers(0)
            .build()
            .await
            .unwrap_or_else(|e| panic!("fault kit: the engine did not build: {e}"));
        *slot.locked() = Some(engine.clone());
        let mut ids = Vec::new();
        for (i, input) in self.inputs.iter().enumerate() {
            let id = engine
                .start_with_key::<Observed<S>>(&format!("fault-kit-{i}"), input.clone())
                .await
                .unwrap_or_else(|e| panic!("fault kit: task {i} did not start: {e}"));
            journal.register(id, i);
            ids.push(id);
            let at_start = journal.state().tasks[i].cancel_at == Some(CancelPoint::Start);
            if at_start
                && matches!(
                    engine.cancel_by_id(id).await,
                    Ok(crate::engine::CancelResult::Cancelled)
                )
            {
                journal.fault(
                    i,
                    Fault::Cancelled {
                        at: CancelPoint::Start,
                    },
                );
            }
        }
        let workers = {
            let engine = engine.clone();
            tokio::spawn(async move { engine.run_workers(1).await })
        };
        let records = settle(&engine, &ids, self.faults.deadline).await;
        engine.shutdown().await;
        let _ = workers.await;
        slot.locked().take();
        let state = journal.state();
        let (report, violations) = report::check(seed, def, &state, &records);
        match violations.is_empty() {
            true => Ok(report),
            false => Err(FaultFailure {
                seed,
                violations,
                report,
            }),
        }
    }
}

/// Waits (in virtual time) for every task to end, then for the stragglers
/// (duplicates, redeliveries of lost acknowledgements) to be delivered, so
/// that a body run after its task ended is seen. Returns the records.
async fn settle(
    engine: &Engine,
    ids: &[crate::model::task::TaskId],
    deadline: Duration,
) -> Vec<Option<crate::model::task::TaskInstance>> {
    let until = tokio::time::Instant::now() + deadline;
    loop {
        let mut ended = true;
        for id in ids {
            let task = engine.task(*id).await.ok().flatten();
            ended &= task.is_some_and(|t| t.status.is_terminal());
        }
        if ended || tokio::time::Instant::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    // Duplicates come up to 20 s + a retry's backoff late, redeliveries a
    // visibility timeout (15 s) late; give them all time.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let mut records = Vec::new();
    for id in ids {
        records.push(engine.task(*id).await.ok().flatten());
    }
    records
}

/// The kit's determinism rests on the virtual clock: a run on the real one
/// would wait out every timeout and delay for real.
async fn assert_paused() {
    let wall = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        wall.elapsed() < Duration::from_millis(20),
        "FaultKit runs on tokio's paused clock: use #[tokio::test(start_paused = true)] \
         (or tokio::time::pause() on a current-thread runtime)"
    );
}
