//! What the fault kit saw and decided, shared by the saga wrapper (which
//! sees bodies run) and the backend wrapper (which sees writes and
//! deliveries).
//!
//! Every decision is a pure function of the seed and of where the task is
//! in its own history (which body, which run of it, which version of the
//! record, which message), never of a global counter: tasks interleave in
//! an order the kit does not fix (which of two messages due at the same
//! instant goes first), and a decision keyed on a global count would then
//! fall on another task and change the report on replay.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::report::{CancelPoint, Fault};
use super::Faults;
use crate::model::task::{TaskId, TaskStatus};
use crate::saga::SagaDefinition;
use crate::util::Unpoisoned;

/// Which kind of body ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Step,
    Compensation,
}

/// One run of a body, in the order the task's runs happened.
#[derive(Debug, Clone)]
pub(super) struct Event {
    pub(super) phase: Phase,
    pub(super) order: u32,
    /// `None` while it runs (or when it panicked).
    pub(super) ok: Option<bool>,
}

/// One task's history.
#[derive(Debug, Default)]
pub(super) struct TaskLog {
    pub(super) id: Option<TaskId>,
    pub(super) events: Vec<Event>,
    pub(super) faults: Vec<Fault>,
    pub(super) runs: BTreeMap<String, u32>,
    /// A body that finished and whose outcome no write has carried yet:
    /// a crash now loses it. (name, run number)
    pending: Option<(String, u32)>,
    crashes: HashMap<String, u32>,
    pub(super) ended: Option<TaskStatus>,
    seen: HashSet<u64>,
    comp_failed: HashSet<String>,
    pub(super) cancel_at: Option<CancelPoint>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) ids: HashMap<TaskId, usize>,
    pub(super) tasks: Vec<TaskLog>,
    pub(super) violations: Vec<String>,
}

pub(super) struct Journal {
    pub(super) seed: u64,
    pub(super) faults: Faults,
    pub(super) def: &'static SagaDefinition,
    state: Mutex<State>,
}

/// At most this many crashes per body and task: enough to make every body
/// run again, few enough that a message never reaches the poison cap.
const MAX_CRASHES: u32 = 2;

/// splitmix64: a fixed, well-mixed function of its input.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a: a stable hash of a tag (std's hasher is seeded per process).
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A number in [0, 1) fixed by `seed`, `task` and the point (`tag`, `a`).
pub(super) fn roll(seed: u64, task: usize, tag: &str, a: u64) -> f64 {
    let h = mix(seed ^ mix(task as u64 ^ mix(fnv(tag) ^ mix(a))));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

impl Journal {
    pub(super) fn new(seed: u64, faults: Faults, def: &'static SagaDefinition, n: usize) -> Self {
        let mut state = State::default();
        state.tasks.resize_with(n, TaskLog::default);
        let journal = Journal {
            seed,
            faults,
            def,
            state: Mutex::new(state),
        };
        journal.plan_cancellations(n);
        journal
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// A number in [0, 1) fixed by the seed, the task and the point.
    pub(super) fn roll(&self, task: usize, tag: &str, a: u64) -> f64 {
        roll(self.seed, task, tag, a)
    }

    /// Chooses, per task, whether and where it is cancelled.
    fn plan_cancellations(&self, n: usize) {
        if !self.def.cancellable || self.def.steps.is_empty() {
            return;
        }
        let mut state = self.state();
        for (i, task) in state.tasks.iter_mut().enumerate() {
            if self.roll(i, "cancel", 0) >= self.faults.cancel {
                continue;
            }
            let points = 1 + 2 * self.def.steps.len() as u64;
            let pick = (self.roll(i, "cancel-point", 0) * points as f64) as u64;
            let step = |k: u64| self.def.steps[k as usize].name.to_owned();
            task.cancel_at = Some(match pick {
                0 => CancelPoint::Start,
                p if p % 2 == 1 => CancelPoint::BeforeStep(step((p - 1) / 2)),
                p => CancelPoint::AfterStep(step((p - 2) / 2)),
            });
        }
        let _ = n;
    }

    pub(super) fn register(&self, id: TaskId, index: usize) {
        let mut state = self.state();
        state.ids.insert(id, index);
        state.tasks[index].id = Some(id);
    }

    pub(super) fn index(&self, id: TaskId) -> Option<usize> {
        self.state().ids.get(&id).copied()
    }

    pub(super) fn fault(&self, task: usize, fault: Fault) {
        self.state().tasks[task].faults.push(fault);
    }

    /// A body starts: counts the run, checks the task has not ended, and
    /// says whether to cancel the task before or after it.
    pub(super) fn begin(&self, id: TaskId, phase: Phase, order: u32, name: &str) -> Begun {
        let mut state = self.state();
        let Some(&index) = state.ids.get(&id) else {
            return Begun::default();
        };
        let task = &mut state.tasks[index];
        let run = {
            let runs = task.runs.entry(name.to_owned()).or_insert(0);
            *runs += 1;
            *runs
        };
        task.events.push(Event {
            phase,
            order,
            ok: None,
        });
        let first = run == 1 && phase == Phase::Step;
        let before = first && task.cancel_at == Some(CancelPoint::BeforeStep(name.to_owned()));
        let after = first && task.cancel_at == Some(CancelPoint::AfterStep(name.to_owned()));
        if let Some(status) = task.ended {
            let what = match phase {
                Phase::Step => "step",
                Phase::Compensation => "compensation",
            };
            let why = format!(
                "task {index} ({id}): {what} `{name}` ran after the task had ended {status:?}"
            );
            state.violations.push(why);
        }
        Begun {
            index: Some(index),
            run,
            cancel_before: before,
            cancel_after: after,
        }
    }

    /// A body returned.
    pub(super) fn end(&self, index: usize, name: &str, run: u32, ok: bool) {
        let mut state = self.state();
        let task = &mut state.tasks[index];
        if let Some(last) = task.events.iter_mut().rev().find(|e| e.ok.is_none()) {
            last.ok = Some(ok);
        }
        task.pending = Some((name.to_owned(), run));
    }

    /// A write is about to carry the outcome of the last body: whether the
    /// worker "crashes" instead (the write never happens).
    pub(super) fn crash(&self, id: TaskId) -> bool {
        let mut state = self.state();
        let Some(&index) = state.ids.get(&id) else {
            return false;
        };
        let Some((name, run)) = state.tasks[index].pending.take() else {
            return false;
        };
        let crashes = state.tasks[index].crashes.get(&name).copied().unwrap_or(0);
        if crashes >= MAX_CRASHES
            || self.roll(index, &format!("crash/{name}"), u64::from(run)) >= self.faults.crash
        {
            return false;
        }
        let task = &mut state.tasks[index];
        *task.crashes.entry(name.clone()).or_insert(0) += 1;
        task.faults.push(Fault::Crash { after: name, run });
        true
    }

    /// A write that carries no body's outcome (the start of an attempt).
    pub(super) fn written(&self, id: TaskId) {
        let mut state = self.state();
        if let Some(&index) = state.ids.get(&id) {
            state.tasks[index].pending = None;
        }
    }

    /// Whether the commit based on `version` loses its acknowledgement.
    pub(super) fn lose_ack(&self, id: TaskId, version: u64) -> bool {
        let Some(index) = self.index(id) else {
            return false;
        };
        let lose = self.roll(index, "lost-ack", version) < self.faults.lost_ack;
        if lose {
            self.fault(index, Fault::LostAck);
        }
        lose
    }

    /// How much later than its own message a duplicate of the message the
    /// commit based on `version` enqueues arrives, if one does.
    pub(super) fn duplicate(&self, id: TaskId, version: u64) -> Option<Duration> {
        let index = self.index(id)?;
        if self.roll(index, "duplicate", version) >= self.faults.duplicate {
            return None;
        }
        let after =
            Duration::from_millis((self.roll(index, "duplicate-by", version) * 20_000.0) as u64);
        self.fault(index, Fault::Duplicate { after });
        Some(after)
    }

    /// How long to hold back message `seq` of task `id`, the first time it
    /// is delivered, if at all.
    pub(super) fn delay(&self, id: TaskId, seq: u64) -> Option<Duration> {
        let index = self.index(id)?;
        if !self.state().tasks[index].seen.insert(seq) {
            return None;
        }
        if self.roll(index, "delay", seq) >= self.faults.delay {
            return None;
        }
        let by = Duration::from_millis(1 + (self.roll(index, "delay-by", seq) * 30_000.0) as u64);
        self.fault(index, Fault::Delayed { by });
        Some(by)
    }

    /// Whether run `run` of compensation `name` fails, and whether its
    /// body runs first (`Some(true)`: it ran, then reported a failure).
    pub(super) fn fail_compensation(&self, index: usize, name: &str, run: u32) -> Option<bool> {
        // Once per compensation and task: a failure before the body leaves
        // the run count as it was, so `run` alone would fail it again.
        if run > 1
            || self.roll(index, &format!("comp/{name}"), 0) >= self.faults.compensation_failure
            || !self.state().tasks[index]
                .comp_failed
                .insert(name.to_owned())
        {
            return None;
        }
        let body_ran = self.roll(index, &format!("comp-after/{name}"), 0) < 0.5;
        self.fault(
            index,
            Fault::CompensationFailed {
                compensation: name.to_owned(),
                body_ran,
            },
        );
        Some(body_ran)
    }

    /// The task's record reached a terminal status.
    pub(super) fn ended(&self, id: TaskId, status: TaskStatus) {
        let mut state = self.state();
        if let Some(&index) = state.ids.get(&id) {
            state.tasks[index].ended.get_or_insert(status);
        }
    }
}

/// What [`Journal::begin`] decided.
#[derive(Debug, Default)]
pub(super) struct Begun {
    /// The task's index; `None` for a task the kit did not start.
    pub(super) index: Option<usize>,
    pub(super) run: u32,
    pub(super) cancel_before: bool,
    pub(super) cancel_after: bool,
}
