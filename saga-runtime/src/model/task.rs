//! The persisted record of one saga execution: [`TaskInstance`], its
//! [`StepRecord`]s and its audit log.
//!
//! Everything here is plain serde data: the backends store it as JSON and every
//! load hands out a fresh copy, so mutating a loaded value never changes the
//! stored one.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

mod id;
mod stored;
mod waiting;

pub use id::{TaskId, TaskIdError};
#[doc(hidden)]
pub use stored::{StoredAudit, StoredSteps};
pub use waiting::WaitingForLimit;

/// Wall-clock time in milliseconds since the Unix epoch.
///
/// Milliseconds rather than `SystemTime` so that records read the same in
/// JSON, in Redis and in every language an operator might inspect them with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The current wall-clock time.
    pub fn now() -> Self {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Timestamp(ms)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = UNIX_EPOCH + std::time::Duration::from_millis(self.0);
        fmt::Display::fmt(&humantime::format_rfc3339_millis(t), f)
    }
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskStatus {
    /// Started, no step has run yet.
    Pending,
    /// Steps are running.
    Running,
    /// Every step completed. Terminal.
    Completed,
    /// Completed steps are being compensated after a failure or a cancellation.
    Compensating,
    /// A step failed and every completed step was compensated. Terminal.
    Compensated,
    /// A step failed with `on_exhausted = fail`; nothing was compensated. Terminal.
    Failed,
    /// Cancelled and every completed step compensated. Terminal.
    Cancelled,
    /// A compensation failed after its retries. Terminal: an operator must
    /// resolve it (see the audit log).
    CompensationFailed,
    /// Parked on the dead-letter queue until an operator requeues it.
    DeadLettered,
    /// Ended `CompensationFailed` or `DeadLettered`, then an operator
    /// fixed what was left by hand and said so
    /// ([`Engine::resolve`](crate::Engine::resolve)); the audit log's
    /// `Resolved` entry says who, why, and what it was before. Terminal.
    Resolved,
}

impl TaskStatus {
    /// Every status, in the order of a task's life: what an overview
    /// counts.
    pub const ALL: [TaskStatus; 10] = [
        TaskStatus::Pending,
        TaskStatus::Running,
        TaskStatus::Compensating,
        TaskStatus::Completed,
        TaskStatus::Compensated,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
        TaskStatus::CompensationFailed,
        TaskStatus::DeadLettered,
        TaskStatus::Resolved,
    ];

    /// The status's name as stored: in index keys, expiring members and the
    /// `status` field of task records. Spelled out rather than taken from
    /// `Debug`, so that renaming a variant cannot silently move a running
    /// deployment's keys (a test pins every name).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "Pending",
            TaskStatus::Running => "Running",
            TaskStatus::Completed => "Completed",
            TaskStatus::Compensating => "Compensating",
            TaskStatus::Compensated => "Compensated",
            TaskStatus::Failed => "Failed",
            TaskStatus::Cancelled => "Cancelled",
            TaskStatus::CompensationFailed => "CompensationFailed",
            TaskStatus::DeadLettered => "DeadLettered",
            TaskStatus::Resolved => "Resolved",
        }
    }

    /// Whether the engine will never change this status on its own.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed
                | TaskStatus::Compensated
                | TaskStatus::Failed
                | TaskStatus::Cancelled
                | TaskStatus::CompensationFailed
                | TaskStatus::DeadLettered
                | TaskStatus::Resolved
        )
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Parses the name [`Display`](fmt::Display) prints (`"DeadLettered"`),
/// for query strings and command lines.
impl std::str::FromStr for TaskStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskStatus::ALL
            .into_iter()
            .find(|status| status.to_string() == s)
            .ok_or_else(|| {
                let names: Vec<String> = TaskStatus::ALL.iter().map(|s| s.to_string()).collect();
                format!("`{s}` is not a task status (one of {})", names.join(", "))
            })
    }
}

/// Where a step is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StepStatus {
    /// Not started.
    Pending,
    /// An attempt is running (or was, when its worker died).
    Running,
    /// Succeeded; its output is recorded.
    Completed,
    /// Failed after its retries (or was cancelled).
    Failed,
    /// Its compensation is running.
    Compensating,
    /// Its compensation succeeded.
    Compensated,
    /// Its compensation failed after its retries.
    CompensationFailed,
}

impl fmt::Display for StepStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The record of one step of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The step method's name.
    pub name: String,
    /// Its number in `#[saga_step(n)]`.
    pub order: u32,
    /// Where it is.
    pub status: StepStatus,
    /// Calls so far, persisted *before* each call so that a crash does not
    /// reset the count.
    pub attempt_count: u32,
    /// When the first attempt started.
    pub started_at: Option<Timestamp>,
    /// When it completed.
    pub completed_at: Option<Timestamp>,
    /// Its output, as JSON, once completed.
    pub output: Option<Value>,
    /// The last error of the step.
    pub error: Option<String>,
    /// The last error of its compensation.
    pub compensation_error: Option<String>,
    /// Compensation calls so far.
    #[serde(default)]
    pub compensation_attempts: u32,
    /// The trace id of the task, recorded when the step failed or its
    /// compensation failed, to find the matching spans.
    pub trace_id: Option<String>,
    /// `attempt_count` when the current retry budget started (a requeue from
    /// the dead-letter queue starts a new budget without reusing attempt
    /// numbers, so idempotency keys stay unique).
    #[serde(default)]
    pub(crate) retry_base: u32,
    /// `compensation_attempts` when the compensation's current retry budget
    /// started (a requeue starts a new one).
    #[serde(default)]
    pub(crate) compensation_retry_base: u32,
    /// When the next attempt (of the step, or of its compensation) is due,
    /// while a retry waits out its backoff. The wait is a scheduled message:
    /// no worker is busy meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<Timestamp>,
    /// The last step attempt made alone: by a message recovered from a
    /// worker that stopped answering it, which runs with no other message
    /// beside it. Cut short by a crash, such an attempt is the step's own
    /// failure; one made beside other messages may have been cut short by
    /// another's crash, and is made again without counting against the
    /// retry budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) alone_attempt: Option<u32>,
    /// The same for the compensation's attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) alone_compensation: Option<u32>,
    /// Attempts of the step that began and whose outcome is not known:
    /// their worker died or lost its lease before recording it (a crash
    /// forgiven as another message's counts too: forgiving spares the
    /// retry budget, not the side effect), or they were dropped for
    /// ignoring their timeout, a cancellation or a shutdown. Whatever
    /// such an attempt did is still out there: a step that ends without
    /// completing is then compensated all the same, as
    /// [`Outcome::Unknown`](crate::Outcome::Unknown), by a compensation that
    /// takes [`Outcome`](crate::Outcome). Written only once one is lost
    /// (absent, it reads 0), so a step costs nothing more to record.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lost_outcomes: u32,
    /// While the step waits for a flow-control limit: which, since when
    /// (kept here, not in the audit log a worker may load without).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) limit_wait: Option<WaitingForLimit>,
}

impl StepRecord {
    /// A fresh, pending record.
    pub fn new(name: impl Into<String>, order: u32) -> Self {
        StepRecord {
            name: name.into(),
            order,
            status: StepStatus::Pending,
            attempt_count: 0,
            started_at: None,
            completed_at: None,
            output: None,
            error: None,
            compensation_error: None,
            compensation_attempts: 0,
            trace_id: None,
            retry_base: 0,
            compensation_retry_base: 0,
            next_attempt_at: None,
            alone_attempt: None,
            alone_compensation: None,
            lost_outcomes: 0,
            limit_wait: None,
        }
    }

    /// Attempts counted against the current retry budget (a requeue starts one).
    pub fn attempts_in_budget(&self) -> u32 {
        self.attempt_count.saturating_sub(self.retry_base)
    }

    /// Whether the step is to be compensated although it did not
    /// complete: an attempt's outcome was lost, and the step has not
    /// completed or been compensated since.
    pub(crate) fn undone_unknown(&self) -> bool {
        self.lost_outcomes > 0 && matches!(self.status, StepStatus::Pending | StepStatus::Failed)
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl StepRecord {
    /// Whether the task stopped here: the step failed, or its compensation
    /// is running or failed.
    fn stopped(&self) -> bool {
        matches!(
            self.status,
            StepStatus::Failed | StepStatus::Compensating | StepStatus::CompensationFailed
        )
    }
}

/// What an [`AuditEntry`] records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum AuditAction {
    /// The task's status changed.
    StatusChanged {
        /// Before.
        from: TaskStatus,
        /// After.
        to: TaskStatus,
    },
    /// A step attempt failed; `retry_in_ms` is set when a retry follows.
    AttemptFailed {
        /// The delay before the next attempt, if any.
        retry_in_ms: Option<u64>,
        /// Whether the error was permanent.
        permanent: bool,
    },
    /// The circuit breaker rejected the step without calling it.
    CircuitOpen,
    /// A step completed.
    StepCompleted,
    /// A compensation attempt failed; `retry_in_ms` is set when a retry follows.
    CompensationAttemptFailed {
        /// The delay before the next attempt, if any.
        retry_in_ms: Option<u64>,
    },
    /// A step was compensated.
    StepCompensated,
    /// A compensation failed for good. `details` holds step, error, trace id
    /// and attempt count as JSON.
    CompensationFailed,
    /// Someone asked to cancel the task. An operator's request
    /// ([`Engine::cancel_by_operator`](crate::Engine::cancel_by_operator))
    /// is recorded when it is made, with `details` holding who and why as
    /// JSON; the entry with the trace id is the worker acting on it.
    CancellationRequested,
    /// The task's message went to the dead-letter queue.
    DeadLettered,
    /// An operator requeued the task from the dead-letter queue.
    Requeued,
    /// An operator resolved the task by hand; `details` holds who, why and
    /// the status it had, as JSON.
    Resolved,
    /// An operator had a failed compensation run again; `details` holds who
    /// and why, as JSON.
    CompensationRetried,
    /// An operator discarded the dead letter that parked the task; `details`
    /// holds who, why and the letter's id, as JSON.
    DeadLetterDiscarded,
    /// An attempt began but never reported back: its worker stopped (a
    /// crash, a kill) or lost its lease. It counts as a failed attempt.
    AttemptAbandoned,
    /// An attempt's idempotency key was already claimed (a duplicate
    /// delivery, or a worker whose lease expired): that attempt number was
    /// skipped rather than run twice.
    DuplicateAttempt,
    /// The step waits for a flow-control limit (`#[limit]`): no attempt
    /// was made, none counted. Recorded once per wait (not at every
    /// return while it lasts); `details` says how many were ahead and when
    /// it is tried again.
    LimitWait {
        /// The limit's name.
        limit: String,
        /// The key's value, for a keyed limit.
        key: Option<String>,
    },
    /// An entry of a kind this version does not know, written by a newer
    /// one (during a rolling deploy): read rather than refused, so that
    /// the task stays readable and runnable here.
    #[serde(other)]
    Unrecognised,
}

/// One line of a task's audit log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When.
    pub at: Timestamp,
    /// What.
    #[serde(flatten)]
    pub action: AuditAction,
    /// The step concerned, if any.
    pub step: Option<String>,
    /// The attempt concerned, if any.
    pub attempt: Option<u32>,
    /// The error, if any.
    pub error: Option<String>,
    /// The task's trace id, where it helps correlate with logs.
    pub trace_id: Option<String>,
    /// Free-form details (JSON for `CompensationFailed`).
    pub details: Option<String>,
    /// The worker (process id and worker number) that made the attempt.
    #[serde(default)]
    pub worker: Option<String>,
}

impl AuditEntry {
    /// An entry stamped now with only its action set.
    pub fn new(action: AuditAction) -> Self {
        AuditEntry {
            at: Timestamp::now(),
            action,
            step: None,
            attempt: None,
            error: None,
            trace_id: None,
            details: None,
            worker: None,
        }
    }

    pub(crate) fn worker(mut self, worker: &str) -> Self {
        self.worker = Some(worker.to_owned());
        self
    }

    pub(crate) fn step(mut self, step: &str) -> Self {
        self.step = Some(step.to_owned());
        self
    }

    pub(crate) fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = Some(attempt);
        self
    }

    pub(crate) fn error(mut self, error: impl Into<String>) -> Self {
        self.error = Some(error.into());
        self
    }

    pub(crate) fn trace(mut self, trace_id: &str) -> Self {
        self.trace_id = Some(trace_id.to_owned());
        self
    }

    pub(crate) fn details(mut self, details: impl Into<String>) -> Self {
        self.details = Some(details.into());
        self
    }
}

/// One execution of a saga, as persisted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskInstance {
    /// Its id.
    pub id: TaskId,
    /// The saga's name.
    pub saga: String,
    /// The version of the saga's definition the task started on, and runs
    /// on to its end (records written before versions existed read as 1).
    #[serde(default = "first_version")]
    pub saga_version: u32,
    /// [`SagaDefinition::fingerprint_hex`](crate::saga::SagaDefinition::fingerprint_hex)
    /// of that definition; `None` in records written before fingerprints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// Whether that version is `#[cancellable]`, recorded at the start so
    /// that an engine that does not run the saga (`sagactl`, a console's
    /// own deployment) can still tell whether it may cancel the task;
    /// `None` in records written before it was kept (about 19 bytes a
    /// write: the record is rewritten by every step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancellable: Option<bool>,
    /// Where it is.
    pub status: TaskStatus,
    /// The saga's input, as JSON.
    pub input: Value,
    /// The saga's output (the last step's output), once completed.
    pub output: Option<Value>,
    /// One record per step, in step order.
    pub steps: Vec<StepRecord>,
    /// Every status change, attempt failure, compensation and operator action.
    pub audit_log: Vec<AuditEntry>,
    /// Correlates this task's log lines and spans: with the `otel`
    /// feature, the OpenTelemetry trace id of the task's trace.
    pub trace_id: String,
    /// The W3C `traceparent` of the span that started the task (feature
    /// `otel`): every attempt's span is its child, on any engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// When it was started.
    pub created_at: Timestamp,
    /// When it was last written.
    pub updated_at: Timestamp,
    /// When it reached a terminal status.
    pub finished_at: Option<Timestamp>,
    /// When cancellation was requested.
    pub cancelled_at: Option<Timestamp>,
    /// Why it failed, when it did.
    pub error: Option<String>,
    /// Incremented by every write; the store rejects a write whose version is
    /// not the stored one.
    pub version: u64,
    /// Sequence number of the task's current message. A delivered message
    /// whose sequence differs is a stale duplicate and is dropped.
    pub seq: u64,
    /// How many of `audit_log`'s entries the store already holds: a write
    /// appends only the entries after them, so that what a step writes
    /// does not grow with the task's history. Set by loads and by the
    /// engine after each write; not part of the record.
    #[serde(skip)]
    #[doc(hidden)]
    pub(crate) audit_stored: StoredAudit,
    /// Which step records the store holds as they are in this copy (see
    /// [`StoredSteps`]). Not part of the record.
    #[serde(skip)]
    #[doc(hidden)]
    pub(crate) steps_stored: StoredSteps,
}

fn first_version() -> u32 {
    1
}

/// A task's audit log keeps its most recent entries, at most this many: a
/// task retried or requeued for a year must not grow without bound.
pub const AUDIT_LOG_CAP: usize = 1000;

impl TaskInstance {
    /// A pending task with one pending record per step.
    pub fn new(saga: &str, input: Value, steps: impl IntoIterator<Item = (String, u32)>) -> Self {
        let id = TaskId::new();
        let now = Timestamp::now();
        TaskInstance {
            id,
            saga: saga.to_owned(),
            saga_version: 1,
            fingerprint: None,
            cancellable: None,
            status: TaskStatus::Pending,
            input,
            output: None,
            steps: steps
                .into_iter()
                .map(|(name, order)| StepRecord::new(name, order))
                .collect(),
            audit_log: Vec::new(),
            trace_id: Uuid::new_v4().simple().to_string(),
            traceparent: None,
            created_at: now,
            updated_at: now,
            finished_at: None,
            cancelled_at: None,
            error: None,
            version: 0,
            seq: 0,
            audit_stored: StoredAudit(0),
            steps_stored: StoredSteps::default(),
        }
    }

    /// The step the task is at or stopped at: the first one that failed
    /// or is being compensated, else the first not completed (`None` once
    /// every step completed).
    pub fn current_step(&self) -> Option<&StepRecord> {
        self.steps.iter().find(|s| s.stopped()).or_else(|| {
            self.steps
                .iter()
                .find(|s| s.status != StepStatus::Completed)
        })
    }

    /// Whether the task is at step `name` ([`current_step`](Self::current_step))
    /// or stopped there: the step failed, or its compensation is running
    /// or failed. What an operator means by "the tasks of step X".
    pub fn at_step(&self, name: &str) -> bool {
        self.current_step().is_some_and(|s| s.name == name)
            || self.steps.iter().any(|s| s.name == name && s.stopped())
    }

    /// Whether `text` occurs in the task's error or in any error of its
    /// audit log (case-sensitive).
    pub fn mentions_error(&self, text: &str) -> bool {
        self.error.as_deref().is_some_and(|e| e.contains(text))
            || self
                .audit_log
                .iter()
                .filter_map(|entry| entry.error.as_deref())
                .any(|e| e.contains(text))
    }

    /// The step record named `name`.
    pub fn step(&self, name: &str) -> Option<&StepRecord> {
        self.steps.iter().find(|s| s.name == name)
    }

    /// Deserializes the saga's output.
    pub fn output_as<T: serde::de::DeserializeOwned>(
        &self,
    ) -> Option<Result<T, serde_json::Error>> {
        self.output.clone().map(serde_json::from_value)
    }

    /// Changes the status and records the change in the audit log.
    pub fn set_status(&mut self, to: TaskStatus) {
        if self.status == to {
            return;
        }
        let from = self.status;
        self.status = to;
        if to.is_terminal() {
            self.finished_at = Some(Timestamp::now());
        } else {
            self.finished_at = None;
        }
        self.audit(AuditEntry::new(AuditAction::StatusChanged { from, to }));
    }

    /// Appends an audit entry.
    pub fn audit(&mut self, entry: AuditEntry) {
        self.audit_log.push(entry);
    }

    /// The names of the steps whose status is `status`, in step order.
    pub fn steps_with(&self, status: StepStatus) -> Vec<&str> {
        self.steps
            .iter()
            .filter(|s| s.status == status)
            .map(|s| s.name.as_str())
            .collect()
    }
}

/// A task's record as a backend stores it: everything but the audit log
/// (which backends keep apart, so that a write carries only the entries it
/// adds) and, for a backend that keeps steps apart too, the steps.
/// Borrowed, field for field, from [`TaskInstance`]: writing a step costs
/// no copy of the task's history.
#[derive(Serialize)]
pub struct StoredRecord<'a> {
    id: &'a TaskId,
    saga: &'a str,
    saga_version: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    fingerprint: &'a Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cancellable: Option<bool>,
    status: TaskStatus,
    input: &'a Value,
    output: &'a Option<Value>,
    steps: &'a [StepRecord],
    audit_log: [(); 0],
    trace_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: &'a Option<String>,
    created_at: Timestamp,
    updated_at: Timestamp,
    finished_at: Option<Timestamp>,
    cancelled_at: Option<Timestamp>,
    error: &'a Option<String>,
    version: u64,
    seq: u64,
}

impl<'a> StoredRecord<'a> {
    /// `task`'s record stamped `updated`, with its steps or without.
    pub fn of(task: &'a TaskInstance, updated: Timestamp, with_steps: bool) -> Self {
        let TaskInstance {
            id,
            saga,
            saga_version,
            fingerprint,
            cancellable,
            status,
            input,
            output,
            steps,
            audit_log: _,
            trace_id,
            traceparent,
            created_at,
            updated_at: _,
            finished_at,
            cancelled_at,
            error,
            version,
            seq,
            audit_stored: _,
            steps_stored: _,
        } = task;
        StoredRecord {
            id,
            saga,
            saga_version: *saga_version,
            fingerprint,
            cancellable: *cancellable,
            status: *status,
            input,
            output,
            steps: if with_steps { steps } else { &[] },
            audit_log: [],
            trace_id,
            traceparent,
            created_at: *created_at,
            updated_at: updated,
            finished_at: *finished_at,
            cancelled_at: *cancelled_at,
            error,
            version: *version,
            seq: *seq,
        }
    }

    /// As JSON, written into a buffer sized for a typical record at once
    /// (growing it step by step cost more than the serialisation itself).
    pub fn json(&self) -> serde_json::Result<String> {
        let mut out = Vec::with_capacity(512 + 320 * self.steps.len());
        serde_json::to_writer(&mut out, self)?;
        String::from_utf8(out).map_err(<serde_json::Error as serde::ser::Error>::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_changes_are_audited_and_terminal_ones_stamp_finished_at() {
        let mut t = TaskInstance::new("s", Value::Null, [("a".to_owned(), 1)]);
        t.set_status(TaskStatus::Running);
        t.set_status(TaskStatus::Running);
        assert!(t.finished_at.is_none());
        t.set_status(TaskStatus::Completed);
        assert!(t.finished_at.is_some());
        let changes: Vec<_> = t.audit_log.iter().map(|e| e.action.clone()).collect();
        assert_eq!(
            changes,
            [
                AuditAction::StatusChanged {
                    from: TaskStatus::Pending,
                    to: TaskStatus::Running
                },
                AuditAction::StatusChanged {
                    from: TaskStatus::Running,
                    to: TaskStatus::Completed
                },
            ]
        );
    }

    /// The stored names of every status: data written by a running
    /// deployment is read by the next version, so none may change.
    #[test]
    fn stored_status_names_never_change() {
        let names: Vec<&str> = TaskStatus::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "Pending",
                "Running",
                "Compensating",
                "Completed",
                "Compensated",
                "Failed",
                "Cancelled",
                "CompensationFailed",
                "DeadLettered",
                "Resolved",
            ]
        );
        for status in TaskStatus::ALL {
            // The record's JSON stores the same name.
            assert_eq!(
                serde_json::to_string(&status).unwrap(),
                format!("\"{}\"", status.as_str())
            );
        }
    }

    #[test]
    fn records_round_trip_through_json() {
        let mut t = TaskInstance::new("s", serde_json::json!({"k": 1}), [("a".to_owned(), 1)]);
        t.audit(
            AuditEntry::new(AuditAction::AttemptFailed {
                retry_in_ms: Some(200),
                permanent: false,
            })
            .step("a"),
        );
        let back: TaskInstance = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
        assert_eq!(t.id.to_string().parse::<TaskId>().unwrap(), t.id);
    }

    /// Whether a task may be cancelled is stored with it; a record written
    /// before that was kept still loads, and says it does not know.
    #[test]
    fn the_stored_record_says_whether_the_task_is_cancellable() {
        let mut t = TaskInstance::new("s", Value::Null, [("a".to_owned(), 1)]);
        t.cancellable = Some(false);
        let stored = StoredRecord::of(&t, t.updated_at, true).json().unwrap();
        let back: TaskInstance = serde_json::from_str(&stored).unwrap();
        assert_eq!(back.cancellable, Some(false));
        let mut old: Value = serde_json::from_str(&stored).unwrap();
        old.as_object_mut().unwrap().remove("cancellable");
        let old: TaskInstance = serde_json::from_value(old).unwrap();
        assert_eq!(old.cancellable, None);
    }
}
