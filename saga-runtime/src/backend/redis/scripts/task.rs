//! The calls of the task protocol: create, lock, apply a task write (an
//! attempt's record, the next attempt's, a commit), heartbeat, unlock,
//! request cancellation. Field
//! order follows each script's header.

use redis::{Script, Value};

use super::{flag, or_empty, typed, Call, Invocation, RefusalCode, Refused};
use super::{APPLY, CANCEL, CREATE, HEARTBEAT, LOCK, UNLOCK};
use crate::backend::redis::corrupt;
use crate::backend::redis::entry::{items, text_at};
use crate::backend::redis::keys::TaskKeys;
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

/// What a task write (`apply.lua`) stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Written {
    /// The task's new version.
    pub version: u64,
    /// Whether the write's claim is new (`false` when it claimed none).
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

/// `apply.lua`: one task write (`backend/write.rs`), its guards and its
/// effects in their order.
pub(crate) struct Apply<'a> {
    /// The task's keys (the guards' and those its effects take).
    pub tk: TaskKeys,
    pub lease_fence: u64,
    pub version: u64,
    /// The record is in layout 2 (see `record`).
    pub apart: bool,
    /// Refuse the write when cancellation was requested.
    pub unless_cancelled: bool,
    pub effects: Vec<Op<'a>>,
}

/// One effect of an [`Apply`], with the keys and arguments its library
/// (`lua/lib/effect_*.lua`) takes; the task's own keys come from the
/// call's [`TaskKeys`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op<'a> {
    /// The record, its new audit entries, its status index moved.
    Put {
        index_from: String,
        index_to: String,
        doc: String,
        status: TaskStatus,
        created_ms: u64,
        audit_cap: usize,
        /// The record's fields after `doc` (see `record::write_fields`).
        fields: Vec<String>,
        audit_entries: Vec<String>,
    },
    /// An attempt's claim.
    Claim(&'a str),
    /// The lease renewed for `ttl_ms` and message `entry` kept.
    Renew {
        queue: String,
        token: &'a str,
        ttl_ms: u64,
        group: &'a str,
        consumer: &'a str,
        entry: String,
    },
    /// The next message's payload, after `delay_ms`.
    Enqueue {
        queue: String,
        delayed: String,
        payload: String,
        delay_ms: u64,
    },
    /// The message handled settled (never [`SettleArgv::Keep`]: nothing
    /// to settle is no effect).
    Settle {
        queue: String,
        dead: String,
        settle: SettleArgv<'a>,
        group: &'a str,
        dead_cap: u64,
    },
    /// The task's keys expire after `expire_after_ms`, or are kept.
    Retain {
        expiring: String,
        expire_after_ms: Option<u64>,
        /// The task's member of the expiring tasks under its stored
        /// status, when that status is terminal.
        stored_member: Option<String>,
        new_member: String,
    },
    /// The lease released.
    Unlock,
    /// The task's id published on `channel`.
    Announce { channel: String },
}

impl Op<'_> {
    /// The effect's keys, in its library's order.
    fn keys(&self, tk: &TaskKeys, call: &mut Invocation) {
        match self {
            Op::Put {
                index_from,
                index_to,
                ..
            } => call.key(index_from).key(index_to).key(&tk.audit),
            Op::Claim(_) => call.key(&tk.claims),
            Op::Renew { queue, .. } => call.key(&tk.lock).key(queue),
            Op::Enqueue { queue, delayed, .. } => call.key(queue).key(delayed),
            Op::Settle {
                queue,
                dead,
                settle,
                ..
            } => match settle {
                SettleArgv::Keep => call,
                SettleArgv::Ack { .. } => call.key(queue),
                SettleArgv::Dead { .. } => call.key(queue).key(dead),
                SettleArgv::Resolve { .. } => call.key(dead),
            },
            Op::Retain { expiring, .. } => call.key(expiring).key(&tk.claims).key(&tk.audit),
            Op::Unlock => call.key(&tk.lock),
            Op::Announce { .. } => call,
        };
    }

    /// The effect's name and arguments, in its library's order.
    fn args(&self, call: &mut Invocation) {
        match self {
            Op::Put {
                doc,
                status,
                created_ms,
                audit_cap,
                fields,
                audit_entries,
                ..
            } => call
                .arg("put")
                .arg(doc)
                .arg(status.as_str())
                .arg(*created_ms)
                .arg(*audit_cap)
                .arg(fields.len() / 2)
                .arg(fields)
                .arg(audit_entries.len())
                .arg(audit_entries),
            Op::Claim(claim) => call.arg("claim").arg(*claim),
            Op::Renew {
                token,
                ttl_ms,
                group,
                consumer,
                entry,
                ..
            } => call
                .arg("renew")
                .arg(*token)
                .arg(*ttl_ms)
                .arg(*group)
                .arg(*consumer)
                .arg(entry),
            Op::Enqueue {
                payload, delay_ms, ..
            } => call.arg("enqueue").arg(payload).arg(*delay_ms),
            Op::Settle {
                settle,
                group,
                dead_cap,
                ..
            } => match settle {
                SettleArgv::Keep => call,
                SettleArgv::Ack { entry } => call.arg("ack").arg(entry).arg(*group),
                SettleArgv::Dead {
                    entry,
                    payload,
                    reason,
                    size,
                } => call
                    .arg("dead")
                    .arg(entry)
                    .arg(*group)
                    .arg(*payload)
                    .arg(*reason)
                    .arg(or_empty(*size))
                    .arg(*dead_cap),
                SettleArgv::Resolve { entry } => call.arg("resolve").arg(entry),
            },
            Op::Retain {
                expire_after_ms,
                stored_member,
                new_member,
                ..
            } => call
                .arg("retain")
                .arg(or_empty(*expire_after_ms))
                .arg(stored_member.as_deref().unwrap_or_default())
                .arg(new_member),
            Op::Unlock => call.arg("unlock"),
            Op::Announce { channel } => call.arg("announce").arg(channel),
        };
    }
}

impl Call for Apply<'_> {
    type Reply = Result<Written, Refused>;

    fn script() -> &'static Script {
        &APPLY
    }

    fn fill(&self, call: &mut Invocation) {
        let tk = &self.tk;
        call.key(&tk.fence).key(&tk.task).key(&tk.cancel);
        for op in &self.effects {
            op.keys(tk, call);
        }
        call.arg(self.lease_fence)
            .arg(self.version)
            .arg(&tk.id)
            .arg(flag(self.apart))
            .arg(match self.unless_cancelled {
                true => "FVC",
                false => "FV",
            });
        for op in &self.effects {
            op.args(call);
        }
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
