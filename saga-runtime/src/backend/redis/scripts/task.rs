//! The calls of the task protocol: create, lock, record an attempt, record
//! the next one, commit, heartbeat, unlock, request cancellation. Field
//! order follows each script's header.

use redis::{Script, Value};

use super::{flag, or_empty, typed, Call, Invocation, RefusalCode, Refused};
use super::{CANCEL, COMMIT, CREATE, HEARTBEAT, LOCK, RECORD_ATTEMPT, RECORD_NEXT, UNLOCK};
use crate::backend::redis::corrupt;
use crate::backend::redis::entry::{items, text_at};
use crate::backend::redis::record::RawRecord;
use crate::backend::BackendError;
use crate::model::task::TaskStatus;

/// `create.lua`: a new task's record, index entries, first message and
/// audit log, unless the task exists.
pub(crate) struct Create {
    pub task: String,
    pub index_all: String,
    pub index_pending: String,
    pub queue: String,
    pub audit: String,
    pub doc: String,
    pub id: String,
    pub payload: String,
    pub created_ms: u64,
    pub audit_cap: usize,
    /// The record's fields after `doc` (see `record::write_fields`).
    pub fields: Vec<String>,
    pub audit_entries: Vec<String>,
}

impl Call for Create {
    /// The stored record when the task exists already (nothing written).
    type Reply = Option<RawRecord>;

    fn script() -> &'static Script {
        &CREATE
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.task)
            .key(&self.index_all)
            .key(&self.index_pending)
            .key(&self.queue)
            .key(&self.audit)
            .arg(&self.doc)
            .arg(&self.id)
            .arg(&self.payload)
            .arg(self.created_ms)
            .arg(self.audit_cap)
            .arg(self.fields.len() / 2)
            .arg(&self.fields)
            .arg(&self.audit_entries);
    }

    fn decode(reply: Value) -> Result<Self::Reply, BackendError> {
        Ok(match reply {
            Value::Nil => None,
            reply => Some(RawRecord::from_reply(&items(&reply), 0, 2)),
        })
    }
}

/// `lock.lua`: a task's lease, with its record.
pub(crate) struct Lock<'a> {
    pub lock: String,
    pub fence: String,
    pub task: String,
    pub cancel: String,
    pub token: &'a str,
    pub ttl_ms: u64,
}

/// What `lock.lua` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Locking {
    /// Another holds the lease.
    Busy,
    /// No such task (nothing written).
    Missing,
    /// The lease, taken under a new fence, with the record as stored.
    Taken {
        fence: u64,
        record: RawRecord,
        cancel: Option<String>,
    },
}

impl Call for Lock<'_> {
    type Reply = Locking;

    fn script() -> &'static Script {
        &LOCK
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.lock)
            .key(&self.fence)
            .key(&self.task)
            .key(&self.cancel)
            .arg(self.token)
            .arg(self.ttl_ms);
    }

    fn decode(reply: Value) -> Result<Locking, BackendError> {
        let reply: Option<Vec<Value>> = typed(reply)?;
        let Some(reply) = reply else {
            return Ok(Locking::Busy);
        };
        let text = |i: usize| text_at(&reply, i);
        Ok(match text(0).and_then(|f| f.parse().ok()).unwrap_or(0) {
            0 => Locking::Missing,
            fence => Locking::Taken {
                fence,
                record: RawRecord::from_reply(&reply.iter().collect::<Vec<_>>(), 1, 4),
                cancel: text(3),
            },
        })
    }
}

/// What a task write (`record_attempt.lua`, `record_next.lua`,
/// `commit.lua`) stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Written {
    /// The task's new version.
    pub version: u64,
    /// Whether the attempt's claim is new (`commit.lua` claims none).
    pub claimed: bool,
}

/// Reads a task write's reply: `{version, claimed}` or a refusal of
/// [`RefusalCode::TASK_WRITE`] with the stored value.
fn written(reply: Value) -> Result<Result<Written, Refused>, BackendError> {
    let reply: Vec<Value> = typed(reply)?;
    let unexpected = || corrupt("unexpected reply from a write script");
    let code = match reply.first() {
        Some(Value::Int(code)) => *code,
        _ => return Err(unexpected()),
    };
    if code > 0 {
        return Ok(Ok(Written {
            version: code as u64,
            claimed: matches!(reply.get(1), Some(Value::Int(1))),
        }));
    }
    let refusal = RefusalCode::from_code(code, RefusalCode::TASK_WRITE).ok_or_else(unexpected)?;
    Ok(Err(Refused {
        refusal,
        detail: text_at(&reply, 1),
    }))
}

/// `record_attempt.lua`: the record of an attempt that starts, and its
/// claim.
pub(crate) struct RecordAttempt<'a> {
    pub fence: String,
    pub task: String,
    pub claims: String,
    pub index_from: String,
    pub index_to: String,
    pub audit: String,
    pub lease_fence: u64,
    pub version: u64,
    pub doc: String,
    pub claim: &'a str,
    pub status: TaskStatus,
    pub id: String,
    pub created_ms: u64,
    pub audit_cap: usize,
    /// The record's fields after `doc` (see `record::write_fields`).
    pub fields: Vec<String>,
    /// The record is in layout 2 (see `record`).
    pub apart: bool,
    pub audit_entries: Vec<String>,
}

impl Call for RecordAttempt<'_> {
    type Reply = Result<Written, Refused>;

    fn script() -> &'static Script {
        &RECORD_ATTEMPT
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.fence)
            .key(&self.task)
            .key(&self.claims)
            .key(&self.index_from)
            .key(&self.index_to)
            .key(&self.audit)
            .arg(self.lease_fence)
            .arg(self.version)
            .arg(&self.doc)
            .arg(self.claim)
            .arg(self.status.as_str())
            .arg(&self.id)
            .arg(self.created_ms)
            .arg(self.audit_cap)
            .arg(flag(self.apart))
            .arg(self.fields.len() / 2)
            .arg(&self.fields)
            .arg(&self.audit_entries);
    }

    fn decode(reply: Value) -> Result<Self::Reply, BackendError> {
        written(reply)
    }
}

/// `record_next.lua`: the last attempt's outcome and the next attempt,
/// under the lease and the message held.
pub(crate) struct RecordNext<'a> {
    pub fence: String,
    pub task: String,
    pub claims: String,
    pub index_from: String,
    pub index_to: String,
    pub lock: String,
    pub queue: String,
    pub cancel: String,
    pub audit: String,
    pub lease_fence: u64,
    pub version: u64,
    pub doc: String,
    pub claim: &'a str,
    pub status: TaskStatus,
    pub id: String,
    pub created_ms: u64,
    pub token: &'a str,
    /// Renew the lease for this long (ms) and keep message `entry` alive.
    pub renew: Option<(u64, String)>,
    pub group: &'a str,
    pub consumer: &'a str,
    pub unless_cancelled: bool,
    pub audit_cap: usize,
    /// The record's fields after `doc` (see `record::write_fields`).
    pub fields: Vec<String>,
    /// The record is in layout 2 (see `record`).
    pub apart: bool,
    pub audit_entries: Vec<String>,
}

impl Call for RecordNext<'_> {
    type Reply = Result<Written, Refused>;

    fn script() -> &'static Script {
        &RECORD_NEXT
    }

    fn fill(&self, call: &mut Invocation) {
        let (ttl, entry) = match &self.renew {
            Some((ttl, entry)) => (ttl.to_string(), entry.as_str()),
            None => (String::new(), ""),
        };
        call.key(&self.fence)
            .key(&self.task)
            .key(&self.claims)
            .key(&self.index_from)
            .key(&self.index_to)
            .key(&self.lock)
            .key(&self.queue)
            .key(&self.cancel)
            .key(&self.audit)
            .arg(self.lease_fence)
            .arg(self.version)
            .arg(&self.doc)
            .arg(self.claim)
            .arg(self.status.as_str())
            .arg(&self.id)
            .arg(self.created_ms)
            .arg(self.token)
            .arg(ttl)
            .arg(self.group)
            .arg(self.consumer)
            .arg(entry)
            .arg(flag(self.unless_cancelled))
            .arg(self.audit_cap)
            .arg(flag(self.apart))
            .arg(self.fields.len() / 2)
            .arg(&self.fields)
            .arg(&self.audit_entries);
    }

    fn decode(reply: Value) -> Result<Self::Reply, BackendError> {
        written(reply)
    }
}

/// What a commit (a task's or a process manager's) does with the message
/// it handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SettleArgv<'a> {
    /// Nothing.
    Keep,
    /// Acknowledge entry `entry`.
    Ack { entry: String },
    /// Park it as a dead letter (`payload` cut to `size` bytes, if cut),
    /// and acknowledge it.
    Dead {
        entry: String,
        payload: &'a str,
        reason: &'a str,
        size: Option<usize>,
    },
    /// Delete dead letter `entry` (the task was requeued from it).
    Resolve { entry: String },
}

/// `commit.lua`: a task's step committed.
pub(crate) struct Commit<'a> {
    pub fence: String,
    pub task: String,
    pub lock: String,
    pub queue: String,
    pub dead: String,
    pub cancel: String,
    pub delayed: String,
    pub index_from: String,
    pub index_to: String,
    pub expiring: String,
    pub claims: String,
    pub audit: String,
    pub lease_fence: u64,
    pub version: u64,
    pub doc: String,
    /// The next message's payload and delay (ms).
    pub next: Option<(String, u64)>,
    pub settle: SettleArgv<'a>,
    pub group: &'a str,
    pub id: String,
    pub unless_cancelled: bool,
    pub status: TaskStatus,
    /// Expire the task's keys this long (ms) after the write.
    pub expire_after_ms: Option<u64>,
    pub created_ms: u64,
    /// The task's member of the expiring tasks under its stored status,
    /// when that status is terminal.
    pub stored_member: Option<String>,
    pub new_member: String,
    pub dead_cap: u64,
    /// The channel to publish the task id on (when it ends).
    pub publish: Option<String>,
    pub audit_cap: usize,
    /// The record's fields after `doc` (see `record::write_fields`).
    pub fields: Vec<String>,
    /// The record is in layout 2 (see `record`).
    pub apart: bool,
    pub audit_entries: Vec<String>,
}

impl Call for Commit<'_> {
    type Reply = Result<Written, Refused>;

    fn script() -> &'static Script {
        &COMMIT
    }

    fn fill(&self, call: &mut Invocation) {
        let (next, delay) = match &self.next {
            Some((payload, delay)) => (payload.as_str(), *delay),
            None => ("", 0),
        };
        let (kind, entry, payload, reason, size) = match &self.settle {
            SettleArgv::Keep => ("none", "", "", "", None),
            SettleArgv::Ack { entry } => ("ack", entry.as_str(), "", "", None),
            SettleArgv::Dead {
                entry,
                payload,
                reason,
                size,
            } => ("dead", entry.as_str(), *payload, *reason, *size),
            SettleArgv::Resolve { entry } => ("resolve", entry.as_str(), "", "", None),
        };
        call.key(&self.fence)
            .key(&self.task)
            .key(&self.lock)
            .key(&self.queue)
            .key(&self.dead)
            .key(&self.cancel)
            .key(&self.delayed)
            .key(&self.index_from)
            .key(&self.index_to)
            .key(&self.expiring)
            .key(&self.claims)
            .key(&self.audit)
            .arg(self.lease_fence)
            .arg(self.version)
            .arg(&self.doc)
            .arg(next)
            .arg(delay)
            .arg(kind)
            .arg(entry)
            .arg(self.group)
            .arg(payload)
            .arg(reason)
            .arg(&self.id)
            .arg(flag(self.unless_cancelled))
            .arg(self.status.as_str())
            .arg(or_empty(self.expire_after_ms))
            .arg(self.created_ms)
            .arg(self.stored_member.as_deref().unwrap_or_default())
            .arg(&self.new_member)
            .arg(or_empty(size))
            .arg(self.dead_cap)
            .arg(self.publish.as_deref().unwrap_or_default())
            .arg(self.audit_cap)
            .arg(flag(self.apart))
            .arg(self.fields.len() / 2)
            .arg(&self.fields)
            .arg(&self.audit_entries);
    }

    fn decode(reply: Value) -> Result<Self::Reply, BackendError> {
        written(reply)
    }
}

/// `heartbeat.lua`: a lease extended and its message kept alive, while
/// held.
pub(crate) struct Heartbeat<'a> {
    pub lock: String,
    pub queue: String,
    pub cancel: String,
    pub task: String,
    pub token: &'a str,
    pub ttl_ms: u64,
    pub group: &'a str,
    pub consumer: &'a str,
    pub entry: String,
}

/// What `heartbeat.lua` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Beat {
    /// Whether the lease is (still) the caller's.
    pub held: bool,
    /// The cancellation flag, if set.
    pub cancel: Option<String>,
}

impl Call for Heartbeat<'_> {
    type Reply = Beat;

    fn script() -> &'static Script {
        &HEARTBEAT
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.lock)
            .key(&self.queue)
            .key(&self.cancel)
            .key(&self.task)
            .arg(self.token)
            .arg(self.ttl_ms)
            .arg(self.group)
            .arg(self.consumer)
            .arg(&self.entry);
    }

    fn decode(reply: Value) -> Result<Beat, BackendError> {
        let (held, cancel): (i64, Option<String>) = typed(reply)?;
        Ok(Beat {
            held: held == 1,
            cancel,
        })
    }
}

/// `unlock.lua`: a lease (a task's or a named one) released if the token
/// holds it.
pub(crate) struct Unlock<'a> {
    pub lock: String,
    pub token: &'a str,
}

impl Call for Unlock<'_> {
    /// Whether it was released.
    type Reply = bool;

    fn script() -> &'static Script {
        &UNLOCK
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.lock).arg(self.token);
    }

    fn decode(reply: Value) -> Result<bool, BackendError> {
        typed::<i64>(reply).map(|n| n == 1)
    }
}

/// `cancel.lua`: a cancellation request recorded and announced.
pub(crate) struct Cancel<'a> {
    pub cancel: String,
    pub task: String,
    pub queue: String,
    pub at_ms: u64,
    pub token: &'a str,
    pub channel: String,
    pub id: String,
    pub wake: String,
    pub audit: String,
    pub audit_cap: usize,
    /// Who asked and why, as JSON (none: only the request is recorded).
    pub audit_entries: Vec<String>,
}

impl Call for Cancel<'_> {
    /// The earlier request's time, as stored (`None` for a new request).
    type Reply = Option<String>;

    fn script() -> &'static Script {
        &CANCEL
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.cancel)
            .key(&self.task)
            .key(&self.queue)
            .key(&self.audit)
            .arg(self.at_ms)
            .arg(self.token)
            .arg(&self.channel)
            .arg(&self.id)
            .arg(&self.wake)
            .arg(self.audit_cap);
        for entry in &self.audit_entries {
            call.arg(entry);
        }
    }

    fn decode(reply: Value) -> Result<Self::Reply, BackendError> {
        typed(reply)
    }
}
