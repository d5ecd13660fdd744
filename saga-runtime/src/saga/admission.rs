//! Whether a worker may advance the task a saga message names: the nine
//! ways a delivery can be turned away, decided from what the registry and
//! the store hold, with no I/O.
//!
//! The worker reads (the task's lease and record), asks [`of_message`]
//! before it takes the lease and [`of_task`] after, and carries out the
//! answer: advance the task, or settle the message one of a few named
//! ways. Keeping the branches here, not inline in the driver, is what
//! lets each be tested on its own below and keeps the driver a loop of
//! reads and writes.

use std::sync::Arc;

use super::{ErasedSaga, SagaDefinition, SagaRegistry};
use crate::backend::{saga_steps_run, saga_version_run};
use crate::model::task::{TaskInstance, TaskStatus, Timestamp};
use crate::model::wire::QueueMessage;

/// What the worker's read of the task found.
#[derive(Debug)]
pub(crate) enum Read {
    /// Another worker holds the task's lease.
    Busy,
    /// The lease is ours; the task, if it exists, and its cancellation flag.
    Loaded {
        task: Option<Box<TaskInstance>>,
        cancel_requested: Option<Timestamp>,
    },
    /// The record exists but cannot be parsed by this build (written by a
    /// newer version during a rolling deploy, or damaged).
    Unreadable(String),
}

/// What to do with the delivery.
pub(crate) enum Admission {
    /// Advance the task on this definition of its saga version.
    Advance {
        saga: Arc<dyn ErasedSaga>,
        task: Box<TaskInstance>,
        cancel_requested: Option<Timestamp>,
    },
    /// The task is busy elsewhere: hand the message back for a little
    /// later (it is not counted against the message).
    HandBack,
    /// A stale duplicate, or a task that has ended: acknowledge it.
    Acknowledge,
    /// A message no version can handle (its task does not exist, or is of
    /// another saga): park it alone with this reason.
    DeadLetter(String),
    /// Another version of the engine may handle it: a saga this worker
    /// does not run, a version or steps it lacks, a record it cannot read.
    /// `runner` is the announcement (`Runners`) that names an engine able
    /// to; `None` when no announcement would.
    AnotherVersion { why: String, runner: Option<String> },
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Admission::Advance { task, .. } => write!(f, "Advance({})", task.id),
            Admission::HandBack => f.write_str("HandBack"),
            Admission::Acknowledge => f.write_str("Acknowledge"),
            Admission::DeadLetter(why) => write!(f, "DeadLetter({why})"),
            Admission::AnotherVersion { why, runner } => {
                write!(f, "AnotherVersion({why}, runner {runner:?})")
            }
        }
    }
}

/// Before any read: a saga this worker does not run at all (a rolling
/// deploy that adds one) goes to another version, and no lease is taken.
pub(crate) fn of_message(sagas: &SagaRegistry, message: &QueueMessage) -> Option<Admission> {
    (!sagas.contains(&message.saga)).then(|| Admission::AnotherVersion {
        why: format!(
            "unknown saga `{}` (this worker runs [{}])",
            message.saga,
            sagas.describe()
        ),
        runner: Some(message.saga.clone()),
    })
}

/// After the read, under the lease when it was taken.
pub(crate) fn of_task(sagas: &SagaRegistry, message: &QueueMessage, read: Read) -> Admission {
    let (task, cancel_requested) = match read {
        Read::Busy => return Admission::HandBack,
        Read::Unreadable(error) => {
            return Admission::AnotherVersion {
                why: format!(
                    "this worker cannot read the record of task {} ({error}); a newer version may have written it",
                    message.task_id
                ),
                runner: None,
            }
        }
        Read::Loaded {
            task,
            cancel_requested,
        } => (task, cancel_requested),
    };
    let Some(task) = task else {
        return Admission::DeadLetter(format!("task {} does not exist", message.task_id));
    };
    if task.saga != message.saga {
        return Admission::DeadLetter(format!(
            "message names saga `{}` but task {} belongs to `{}`",
            message.saga, task.id, task.saga
        ));
    }
    // A cancellation not applied yet makes any message of the task current:
    // the wake-up `cancel` enqueues carries the sequence number it read
    // before its request landed, and a failed attempt may have committed
    // its delayed retry in between. Under the lease, nobody else is
    // advancing the task.
    let cancel_pending = cancel_requested.is_some()
        && task.cancelled_at.is_none()
        && matches!(task.status, TaskStatus::Pending | TaskStatus::Running);
    if (task.seq != message.seq && !cancel_pending) || task.status.is_terminal() {
        return Admission::Acknowledge;
    }
    let Some(saga) = sagas.get(&task.saga, task.saga_version) else {
        return Admission::AnotherVersion {
            why: format!(
                "task {} runs on version {} of saga `{}`, which this worker does not have (it runs [{}])",
                task.id,
                task.saga_version,
                task.saga,
                sagas.describe()
            ),
            runner: Some(saga_version_run(&task.saga, task.saga_version)),
        };
    };
    if let Some(why) = incompatible(&task, saga.definition()) {
        let runner = task
            .fingerprint
            .as_deref()
            .map(|steps| saga_steps_run(&task.saga, task.saga_version, steps));
        return Admission::AnotherVersion { why, runner };
    }
    Admission::Advance {
        saga: saga.clone(),
        task,
        cancel_requested,
    }
}

/// Why a task cannot be advanced by this worker's definition of its saga
/// version: it was started on a definition with other steps (a deploy
/// changed the saga without bumping its version while the task was in
/// flight). Advancing it would run the wrong steps, or index past the ones
/// this definition has.
fn incompatible(task: &TaskInstance, def: &SagaDefinition) -> Option<String> {
    // Records from before fingerprints can only be compared by step names.
    let same = match &task.fingerprint {
        Some(recorded) => is_hex_of(recorded, def.fingerprint),
        None => task
            .steps
            .iter()
            .map(|s| s.name.as_str())
            .eq(def.steps.iter().map(|s| s.name)),
    };
    (!same).then(|| {
        let recorded: Vec<&str> = task.steps.iter().map(|s| s.name.as_str()).collect();
        let defined: Vec<&str> = def.steps.iter().map(|s| s.name).collect();
        let fingerprint = def.fingerprint_hex();
        format!(
            "task {} was started with steps [{}] (version {} of saga `{}`, fingerprint {}); this \
             worker's version {} has [{}] (fingerprint {fingerprint}): the steps changed without \
             a version bump (give the new definition `#[saga(version = {})]` and keep the old \
             one registered until its tasks have finished)",
            task.id,
            recorded.join(", "),
            task.saga_version,
            def.name,
            task.fingerprint.as_deref().unwrap_or("not recorded"),
            def.version,
            defined.join(", "),
            def.version + 1
        )
    })
}

/// Whether `text` is `fingerprint` as [`SagaDefinition::fingerprint_hex`]
/// spells it (16 lowercase hex digits), compared without formatting it:
/// every delivery of a saga message asks.
fn is_hex_of(text: &str, fingerprint: u64) -> bool {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    text.len() == 16
        && text.bytes().enumerate().all(|(i, c)| {
            let nibble = (fingerprint >> (60 - 4 * i)) & 0xf;
            c == DIGITS[nibble as usize]
        })
}

#[cfg(test)]
#[path = "admission/tests.rs"]
mod tests;
