//! What a fault-kit run found: the faults each task saw, how many times
//! each body ran, and the engine's invariants checked against both.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::journal::{Phase, State, TaskLog};
use crate::model::task::{StepStatus, TaskId, TaskInstance, TaskStatus};
use crate::saga::SagaDefinition;

/// Where a task was cancelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelPoint {
    /// Right after it was started, before any step ran.
    Start,
    /// As the first run of this step began (the step then runs with its
    /// cancellation already requested).
    BeforeStep(String),
    /// After the first run of this step returned, before its outcome was
    /// written.
    AfterStep(String),
}

/// A fault the kit injected into one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The worker died after run `run` of `after` (a step or a
    /// compensation) and before its outcome was written: the body runs
    /// again (or, without retries left, its step fails).
    Crash {
        /// The body whose outcome was lost.
        after: String,
        /// Which run of it.
        run: u32,
    },
    /// A commit landed but its message was not acknowledged: it was
    /// delivered again after the visibility timeout.
    LostAck,
    /// A message was delivered twice, the copy this much later.
    Duplicate {
        /// How much later than the original the copy was due.
        after: Duration,
    },
    /// A message was held back this long (reordering it against others).
    Delayed {
        /// How long.
        by: Duration,
    },
    /// The task was cancelled here.
    Cancelled {
        /// Where.
        at: CancelPoint,
    },
    /// A compensation reported a transient failure.
    CompensationFailed {
        /// The compensation.
        compensation: String,
        /// Whether its body ran before the failure (its effect happened).
        body_ran: bool,
    },
}

/// How many times one body (a step or a compensation) ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BodyRuns {
    /// Runs over all tasks.
    pub total: u32,
    /// Most runs in one task.
    pub max_per_task: u32,
    /// Tasks in which it ran more than once.
    pub rerun_in: u32,
}

/// One task of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskReport {
    /// Its position among the inputs.
    pub index: usize,
    /// Its id (fixed by the index: the same on every replay).
    pub id: TaskId,
    /// Where it ended.
    pub status: TaskStatus,
    /// The faults it saw, in order.
    pub faults: Vec<Fault>,
    /// Runs per body name.
    pub runs: BTreeMap<String, u32>,
    /// Steps whose body succeeded at least once yet that the task ended
    /// neither completed nor compensated: the success was lost with a
    /// crash, then the task was cancelled or the step's retries ran out,
    /// and the step's compensation takes the step's output, so the engine
    /// had nothing to call it with and left the side effect in place (or
    /// the task ended `Failed`, which compensates nothing). Empty for a
    /// saga whose compensations take [`Outcome`](crate::Outcome): the
    /// engine undoes those steps as `Outcome::Unknown`, and the kit fails
    /// a run where it did not. For your books.
    pub uncompensated: Vec<String>,
}

/// What a run of [`FaultKit`](super::FaultKit) found; the same seed gives
/// the same report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultReport {
    /// The seed the faults were drawn from.
    pub seed: u64,
    /// Runs per body (step or compensation method name).
    pub bodies: BTreeMap<String, BodyRuns>,
    /// The tasks, in input order.
    pub tasks: Vec<TaskReport>,
}

impl FaultReport {
    /// How many times `body` (a step or compensation method) ran in all.
    pub fn runs(&self, body: &str) -> u32 {
        self.bodies.get(body).map_or(0, |b| b.total)
    }

    /// The most times `body` ran for one task: 1 means it never ran twice.
    pub fn max_runs(&self, body: &str) -> u32 {
        self.bodies.get(body).map_or(0, |b| b.max_per_task)
    }

    /// How many faults were injected in all.
    pub fn faults(&self) -> usize {
        self.tasks.iter().map(|t| t.faults.len()).sum()
    }

    /// Every step left [uncompensated](TaskReport::uncompensated), as
    /// `(task index, step)`.
    pub fn uncompensated(&self) -> Vec<(usize, &str)> {
        self.tasks
            .iter()
            .flat_map(|t| t.uncompensated.iter().map(move |s| (t.index, s.as_str())))
            .collect()
    }

    /// The tasks that ended in `status`.
    pub fn ended(&self, status: TaskStatus) -> usize {
        self.tasks.iter().filter(|t| t.status == status).count()
    }
}

impl fmt::Display for FaultReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fault kit, seed {} (replay: FaultKit::seed({}) or SAGA_FAULT_SEED={}): {} tasks, {} faults",
            self.seed,
            self.seed,
            self.seed,
            self.tasks.len(),
            self.faults()
        )?;
        for (name, runs) in &self.bodies {
            writeln!(
                f,
                "  {name}: {} runs, at most {} in one task, more than once in {} tasks",
                runs.total, runs.max_per_task, runs.rerun_in
            )?;
        }
        for task in self.tasks.iter().filter(|t| !t.faults.is_empty()) {
            writeln!(
                f,
                "  task {} {:?}: {:?}",
                task.index, task.status, task.faults
            )?;
            if !task.uncompensated.is_empty() {
                writeln!(
                    f,
                    "    succeeded, then neither recorded nor compensated: {:?}",
                    task.uncompensated
                )?;
            }
        }
        Ok(())
    }
}

/// A run that broke an invariant: prints the seed that replays it.
#[derive(Debug, Clone)]
pub struct FaultFailure {
    /// The seed.
    pub seed: u64,
    /// What went wrong, one line each.
    pub violations: Vec<String>,
    /// What the run saw.
    pub report: FaultReport,
}

impl fmt::Display for FaultFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fault kit: seed {} broke {} invariant(s):",
            self.seed,
            self.violations.len()
        )?;
        for v in &self.violations {
            writeln!(f, "  - {v}")?;
        }
        write!(f, "{}", self.report)?;
        write!(
            f,
            "replay it with FaultKit::seed({}) or SAGA_FAULT_SEED={}",
            self.seed, self.seed
        )
    }
}

impl std::error::Error for FaultFailure {}

/// Builds the report and checks every task against the engine's
/// invariants; returns the report and the violations.
pub(super) fn check(
    seed: u64,
    def: &SagaDefinition,
    state: &State,
    records: &[Option<TaskInstance>],
) -> (FaultReport, Vec<String>) {
    let mut violations = state.violations.clone();
    let mut bodies = BTreeMap::<String, BodyRuns>::new();
    let mut tasks = Vec::new();
    for (index, (log, record)) in state.tasks.iter().zip(records).enumerate() {
        for (name, &n) in &log.runs {
            let b = bodies.entry(name.clone()).or_default();
            b.total += n;
            b.max_per_task = b.max_per_task.max(n);
            b.rerun_in += u32::from(n > 1);
        }
        let Some(record) = record else {
            violations.push(format!("task {index}: its record is missing"));
            continue;
        };
        violations.extend(check_task(index, def, log, record));
        tasks.push(TaskReport {
            index,
            id: record.id,
            status: record.status,
            faults: log.faults.clone(),
            runs: log.runs.clone(),
            uncompensated: uncompensated(def, log, record),
        });
    }
    let report = FaultReport {
        seed,
        bodies,
        tasks,
    };
    (report, violations)
}

/// See [`TaskReport::uncompensated`].
fn uncompensated(def: &SagaDefinition, log: &TaskLog, task: &TaskInstance) -> Vec<String> {
    if task.status == TaskStatus::Completed {
        return Vec::new();
    }
    let ran_ok = |phase: Phase, order: u32| {
        log.events
            .iter()
            .any(|e| e.phase == phase && e.order == order && e.ok == Some(true))
    };
    def.steps
        .iter()
        .filter(|s| s.compensation.is_some())
        .filter(|s| ran_ok(Phase::Step, s.order) && !ran_ok(Phase::Compensation, s.order))
        .map(|s| s.name.to_owned())
        .collect()
}

fn check_task(
    index: usize,
    def: &SagaDefinition,
    log: &TaskLog,
    task: &TaskInstance,
) -> Vec<String> {
    let mut v = Vec::new();
    let who = format!("task {index} ({})", task.id);
    let step_name = |order: u32| def.step(order).map_or("?", |s| s.name);
    match task.status {
        s if !s.is_terminal() => v.push(format!("{who} never ended: it is {s:?}")),
        TaskStatus::DeadLettered | TaskStatus::CompensationFailed => v.push(format!(
            "{who} ended {:?}: {} (a compensation must survive one crash or transient failure: give it a `compensation_retry_policy`)",
            task.status,
            task.error.as_deref().unwrap_or("no error recorded")
        )),
        _ => {}
    }
    // Steps run in order: a step runs only once the one before it
    // succeeded, and no step runs once compensation began.
    let mut done = 0;
    let mut compensating = false;
    let mut last_undone = u32::MAX;
    for e in &log.events {
        match e.phase {
            Phase::Step if compensating => {
                v.push(format!(
                    "{who}: step `{}` ran during compensation",
                    step_name(e.order)
                ));
            }
            Phase::Step if e.order > done + 1 => v.push(format!(
                "{who}: step `{}` ran before step {} had succeeded",
                step_name(e.order),
                done + 1
            )),
            Phase::Step if e.ok == Some(true) => done = done.max(e.order),
            Phase::Step => {}
            Phase::Compensation => {
                compensating = true;
                if e.ok == Some(true) {
                    if e.order > last_undone {
                        v.push(format!(
                            "{who}: compensation of step `{}` ran after that of a later step",
                            step_name(e.order)
                        ));
                    }
                    last_undone = last_undone.min(e.order);
                }
            }
        }
    }
    let undone = |order: u32| {
        log.events
            .iter()
            .any(|e| e.phase == Phase::Compensation && e.order == order && e.ok == Some(true))
    };
    let succeeded = |order: u32| {
        log.events
            .iter()
            .any(|e| e.phase == Phase::Step && e.order == order && e.ok == Some(true))
    };
    match task.status {
        TaskStatus::Completed => {
            if done as usize != def.steps.len() {
                v.push(format!(
                    "{who} completed, but only {done} of {} steps succeeded",
                    def.steps.len()
                ));
            }
            if compensating {
                v.push(format!("{who} completed, but a compensation ran"));
            }
        }
        TaskStatus::Compensated | TaskStatus::Cancelled | TaskStatus::Failed => {
            for (rec, step) in task.steps.iter().zip(def.steps) {
                let compensable = step.compensation.is_some();
                if compensable && rec.status == StepStatus::Completed {
                    v.push(format!(
                        "{who} ended {:?} with step `{}` succeeded and not compensated",
                        task.status, step.name
                    ));
                }
                if compensable && rec.status == StepStatus::Compensated && !undone(step.order) {
                    v.push(format!("{who}: step `{}` is marked compensated, but its compensation never succeeded", step.name));
                }
                let handles_unknown = step
                    .compensation
                    .as_ref()
                    .is_some_and(|c| c.handles_unknown);
                if handles_unknown
                    && task.status != TaskStatus::Failed
                    && succeeded(step.order)
                    && !undone(step.order)
                {
                    v.push(format!(
                        "{who} ended {:?} with step `{}` succeeded (its success lost with a crash) and never compensated, though its compensation takes `Outcome`",
                        task.status, step.name
                    ));
                }
            }
        }
        _ => {}
    }
    v
}
