//! How a task's record is laid out in its hash, and which layout a
//! deployment writes.
//!
//! *Record layout 1* (every version before layout 2): field `doc` holds the
//! whole record, every step's record and output and the task's input
//! included, so every step rewrote all of it. *Record layout 2*: field `h`
//! holds what is fixed when the task is created ([`Fixed`]: its id, saga,
//! version, input, trace), written once; `doc` what a write may change
//! ([`Changing`]: status, output, times, error); `n` the number of steps
//! and `s:<i>` step `i`'s record. A write sends `doc`, the steps that
//! changed (see [`StoredSteps`](crate::model::task::StoredSteps)) and the
//! audit entries it adds, so what a step costs does not grow with the
//! task's history nor with its input. Both layouts are read, as one JSON
//! object (`lua/lib/record.lua` puts a layout-2 record together); the
//! field `n` tells them apart.
//!
//! An engine that predates layout 2 cannot read it (the `doc` it reads
//! lacks the fields it needs, and it reports the record unreadable rather
//! than misread it), so a deployment writes layout 1 until every engine
//! reads layout 2: a deployment's first engine (an empty prefix) records
//! layout 2 at once; a deployment that was running before records it when
//! its operator says all its engines are upgraded
//! ([`RedisBackend::write_steps_apart`]). Engines see the switch within
//! [`REFRESH`]. A record keeps the layout it was created in: tasks
//! started before the switch finish in layout 1.
//!
//! Layout 2 also keeps the task's control state in the same hash, where
//! the one `HMGET` that checks a write reaches all of it: field `fence`
//! (the lease's fencing counter), `cancel` (the cancellation flag) and
//! `c:<claim>` (each attempt claimed). Layout 1 keeps them in keys of
//! their own (`fence:<id>`, `cancel:<id>`, `claims:<id>`). The lease
//! itself stays a key of its own (`lock:<id>`): it expires alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::Value;
use serde::Serialize;

use super::entry::{items, text};
use super::{corrupt, unavailable, RedisBackend};
use crate::backend::BackendError;
use crate::model::task::{StoredRecord, TaskId, TaskInstance, TaskStatus, Timestamp};
use crate::util::Unpoisoned;

/// How often an engine looks again at which layout its deployment writes.
pub(super) const REFRESH: Duration = Duration::from_secs(10);

/// What the deployment's record-layout key holds once layout 2 is on.
const LAYOUT_2: &str = "2";

/// A task's record as a script returns it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct RawRecord {
    /// The whole record as one JSON object, in either layout; `None`: no
    /// such task.
    pub doc: Option<String>,
    pub version: Option<String>,
    /// Whether it is stored in layout 2.
    pub apart: bool,
}

impl RawRecord {
    /// The record at `reply[at..at + 2]` (doc, version), with whether it
    /// is kept apart at `reply[apart_at]`, as the scripts reply it.
    pub fn from_reply(reply: &[&Value], at: usize, apart_at: usize) -> RawRecord {
        let field = |i: usize| match reply.get(i) {
            Some(Value::Nil) | None => None,
            Some(v) => Some(text(v)),
        };
        RawRecord {
            doc: field(at),
            version: field(at + 1),
            apart: matches!(reply.get(apart_at), Some(Value::Int(1))),
        }
    }

    /// A record from its hash's fields (`HGETALL`), put together as
    /// `lua/lib/record.lua` does.
    pub fn from_fields(value: &Value) -> Result<RawRecord, BackendError> {
        let mut fields: HashMap<String, String> = HashMap::new();
        for pair in items(value).chunks(2) {
            let [name, value] = pair else { break };
            fields.insert(text(name), text(value));
        }
        let version = fields.remove("version");
        let Some(n) = fields.remove("n") else {
            return Ok(RawRecord {
                doc: fields.remove("doc"),
                version,
                apart: false,
            });
        };
        let Some(changing) = fields.remove("doc") else {
            return Ok(RawRecord::default());
        };
        let n: usize = n.parse().map_err(corrupt)?;
        // Beyond the hash's fields: damaged, not a count to build for.
        if n > fields.len() {
            return Err(corrupt(format!(
                "step count {n} beyond the record's fields"
            )));
        }
        let steps = (0..n)
            .map(|i| {
                fields
                    .remove(&format!("s:{i}"))
                    .unwrap_or_else(|| "null".to_owned())
            })
            .collect::<Vec<_>>()
            .join(",");
        let fixed = fields.remove("h").unwrap_or_else(|| "{}".to_owned());
        Ok(RawRecord {
            doc: Some(format!(
                "{{{},{},\"steps\":[{steps}]}}",
                inner(&fixed),
                inner(&changing)
            )),
            version,
            apart: true,
        })
    }

    /// The task (without its audit log), or `None` for no record.
    pub fn parse(self) -> Result<Option<TaskInstance>, BackendError> {
        let Some(doc) = self.doc else { return Ok(None) };
        let mut task: TaskInstance = serde_json::from_str(&doc).map_err(corrupt)?;
        let version = self.version.and_then(|v| v.parse().ok());
        task.version = version.unwrap_or(task.version);
        task.set_steps_apart(self.apart);
        if let Some(version) = version {
            task.steps_saved(version);
        }
        Ok(Some(task))
    }
}

/// A JSON object's text without its braces.
fn inner(object: &str) -> &str {
    object
        .get(1..object.len().saturating_sub(1))
        .unwrap_or_default()
}

/// What layout 2 keeps in `h`: the task's fields that are fixed when it is
/// created (nothing changes them afterwards), written once.
#[derive(Serialize)]
struct Fixed<'a> {
    id: &'a TaskId,
    saga: &'a str,
    saga_version: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    fingerprint: &'a Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cancellable: Option<bool>,
    input: &'a serde_json::Value,
    trace_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: &'a Option<String>,
    created_at: Timestamp,
}

/// What layout 2 keeps in `doc`: the task's fields a write may change
/// (its steps apart, its audit log in its own list).
#[derive(Serialize)]
struct Changing<'a> {
    status: TaskStatus,
    output: &'a Option<serde_json::Value>,
    audit_log: [(); 0],
    updated_at: Timestamp,
    finished_at: Option<Timestamp>,
    cancelled_at: Option<Timestamp>,
    error: &'a Option<String>,
    version: u64,
    seq: u64,
}

/// `task`'s record in layout 2's two parts, stamped `updated`. Every field
/// of [`TaskInstance`] is named here (as in [`StoredRecord::of`]): a field
/// added to it fails to compile until it is given to one part or left out
/// on purpose, rather than be lost from layout 2 unseen.
fn parts(task: &TaskInstance, updated: Timestamp) -> (Fixed<'_>, Changing<'_>) {
    let TaskInstance {
        id,
        saga,
        saga_version,
        fingerprint,
        cancellable,
        status,
        input,
        output,
        steps: _,
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
    let fixed = Fixed {
        id,
        saga,
        saga_version: *saga_version,
        fingerprint,
        cancellable: *cancellable,
        input,
        trace_id,
        traceparent,
        created_at: *created_at,
    };
    let changing = Changing {
        status: *status,
        output,
        audit_log: [],
        updated_at: updated,
        finished_at: *finished_at,
        cancelled_at: *cancelled_at,
        error,
        version: *version,
        seq: *seq,
    };
    (fixed, changing)
}

/// What a write of `task` stores: the `doc` field and the other fields
/// to set (pairs of name and value). A record keeps the layout it was
/// created in: in layout 1 the whole record in `doc`; in layout 2 the
/// changing fields in `doc`, `n` and the steps the store does not hold as
/// they are. `create`: the first write of a task, in layout 2 if `apart`
/// (the deployment writes layout 2), with `h` and every step.
pub(crate) fn write_fields(
    task: &TaskInstance,
    stamp: Timestamp,
    create: Option<bool>,
) -> Result<(String, Vec<String>), BackendError> {
    let apart = create.unwrap_or_else(|| task.steps_apart());
    if !apart {
        let whole = StoredRecord::of(task, stamp, true);
        return Ok((whole.json().map_err(corrupt)?, Vec::new()));
    }
    let (fixed, changing) = parts(task, stamp);
    let doc = serde_json::to_string(&changing).map_err(corrupt)?;
    let changed: Vec<usize> = match create {
        None => task.unstored_steps(),
        Some(_) => (0..task.steps.len()).collect(),
    };
    let mut fields = Vec::with_capacity(4 + 2 * changed.len());
    fields.push("n".to_owned());
    fields.push(task.steps.len().to_string());
    if create.is_some() {
        fields.push("h".to_owned());
        fields.push(serde_json::to_string(&fixed).map_err(corrupt)?);
    }
    for idx in changed {
        fields.push(format!("s:{idx}"));
        fields.push(serde_json::to_string(&task.steps[idx]).map_err(corrupt)?);
    }
    Ok((doc, fields))
}

/// Which layout this engine writes new records in, as last read.
#[derive(Debug, Default)]
pub(super) struct Mode {
    apart: AtomicBool,
    /// When it was last read (`None`: never), or is being read again.
    read_at: Mutex<Option<Instant>>,
}

impl Mode {
    pub fn set(&self, apart: bool) {
        self.apart.store(apart, Ordering::Relaxed);
        *self.read_at.locked() = Some(Instant::now());
    }

    /// Whether it is time to read it again (and, if so, marks it read: one
    /// caller refreshes it).
    fn due(&self) -> bool {
        let mut at = self.read_at.locked();
        match *at {
            Some(t) if t.elapsed() < REFRESH => false,
            _ => {
                *at = Some(Instant::now());
                true
            }
        }
    }
}

impl RedisBackend {
    /// Whether a task created now is written in layout 2: as last read,
    /// read again (one `GET`) when that is older than [`REFRESH`]. Once
    /// layout 2, always layout 2.
    pub(super) async fn creates_apart(&self) -> bool {
        let mode = &self.shared.records;
        if !mode.apart.load(Ordering::Relaxed) && mode.due() {
            if let Ok(apart) = self.read_record_layout().await {
                mode.set(apart);
            }
        }
        mode.apart.load(Ordering::Relaxed)
    }

    /// Reads the deployment's record layout: layout 2 once recorded.
    pub(super) async fn read_record_layout(&self) -> Result<bool, BackendError> {
        let stored: Option<String> = redis::cmd("GET")
            .arg(self.keys().record_layout())
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(stored.as_deref() == Some(LAYOUT_2))
    }

    /// On connecting, before the key layout is recorded: an empty
    /// deployment (no key layout recorded yet) is recorded as writing
    /// layout 2. In this order, a connect cut short between the two
    /// writes leaves layout 2 recorded for the next one to find; the other
    /// order would leave a new deployment on layout 1 for good.
    pub(super) async fn prepare_record_layout(&self) -> Result<(), BackendError> {
        let recorded: bool = redis::cmd("EXISTS")
            .arg(self.keys().layout())
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if !recorded {
            redis::cmd("SET")
                .arg(self.keys().record_layout())
                .arg(LAYOUT_2)
                .arg("NX")
                .query_async::<()>(&mut self.conn())
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    /// On connecting, once the key layout is checked: reads the record
    /// layout.
    pub(super) async fn load_record_layout(&self) -> Result<(), BackendError> {
        let apart = self.read_record_layout().await?;
        self.shared.records.set(apart);
        Ok(())
    }

    async fn record_layout_2(&self) -> Result<(), BackendError> {
        redis::cmd("SET")
            .arg(self.keys().record_layout())
            .arg(LAYOUT_2)
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(unavailable)
    }

    /// Has the deployment write every task's steps apart from its head
    /// (record layout 2: a step writes what changed, not the task's whole
    /// history). Call it once every engine of the deployment runs a
    /// version that reads layout 2 (this one or later): an older engine
    /// cannot read a record written so, and reports it unreadable. Every
    /// engine follows within 10 seconds; tasks started before it finish
    /// in layout 1, tasks started after are created in layout 2. There is
    /// no way back to layout 1. A
    /// deployment whose first engine was of this version or later writes
    /// layout 2 from the start.
    pub async fn write_steps_apart(&self) -> Result<(), BackendError> {
        self.record_layout_2().await?;
        self.shared.records.set(true);
        Ok(())
    }

    /// Whether the deployment writes its tasks' steps apart (record layout
    /// 2; see [`write_steps_apart`](Self::write_steps_apart)).
    pub async fn writes_steps_apart(&self) -> Result<bool, BackendError> {
        self.read_record_layout().await
    }
}
