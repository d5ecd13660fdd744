//! The calls of housekeeping: expired tasks found and purged, dead letters
//! trimmed by age, consumers that left removed.

use redis::{Script, Value};

use super::{or_empty, typed, Call, Invocation};
use super::{EXPIRED, LEAVE_GROUP, PURGE, REAP_CONSUMERS, TRIM_DEAD};
use crate::backend::BackendError;
use crate::model::task::TaskStatus;

/// `expired.lua`: the members of tasks whose retention ran out.
pub(crate) struct Expired {
    pub expiring: String,
    pub limit: usize,
}

impl Call for Expired {
    /// Their members (`<id>|<status>|<saga>`).
    type Reply = Vec<String>;

    fn script() -> &'static Script {
        &EXPIRED
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.expiring).arg(self.limit);
    }

    fn decode(reply: Value) -> Result<Vec<String>, BackendError> {
        typed(reply)
    }
}

/// One task `purge.lua` removes: its keys, and what its member of the
/// expiring tasks says.
pub(crate) struct PurgedTask {
    pub task: String,
    pub fence: String,
    pub cancel: String,
    pub claims: String,
    pub lock: String,
    pub index_all: String,
    /// The saga's index of the status it expired in.
    pub index_status: String,
    pub audit: String,
    pub member: String,
    pub id: String,
    pub status: TaskStatus,
}

/// `purge.lua`: every key and index entry of expired tasks removed.
pub(crate) struct Purge {
    pub expiring: String,
    pub tasks: Vec<PurgedTask>,
}

impl Call for Purge {
    /// How many tasks were removed.
    type Reply = usize;

    fn script() -> &'static Script {
        &PURGE
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.expiring);
        for t in &self.tasks {
            call.key(&t.task)
                .key(&t.fence)
                .key(&t.cancel)
                .key(&t.claims)
                .key(&t.lock)
                .key(&t.index_all)
                .key(&t.index_status)
                .key(&t.audit)
                .arg(&t.member)
                .arg(&t.id)
                .arg(t.status.as_str());
        }
    }

    fn decode(reply: Value) -> Result<usize, BackendError> {
        typed(reply)
    }
}

/// `trim_dead.lua`: a dead-letter stream trimmed by age.
pub(crate) struct TrimDead {
    pub dead: String,
    /// How long a dead letter is kept (`None`: no age limit).
    pub keep_ms: Option<u64>,
}

impl Call for TrimDead {
    /// How many entries went.
    type Reply = usize;

    fn script() -> &'static Script {
        &TRIM_DEAD
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.dead).arg(or_empty(self.keep_ms));
    }

    fn decode(reply: Value) -> Result<usize, BackendError> {
        typed(reply)
    }
}

/// `reap_consumers.lua`: the idle consumers that hold no message removed.
pub(crate) struct ReapConsumers<'a> {
    pub stream: String,
    pub group: &'a str,
    pub idle_ms: u64,
}

impl Call for ReapConsumers<'_> {
    /// How many were removed.
    type Reply = usize;

    fn script() -> &'static Script {
        &REAP_CONSUMERS
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.stream).arg(self.group).arg(self.idle_ms);
    }

    fn decode(reply: Value) -> Result<usize, BackendError> {
        typed(reply)
    }
}

/// `leave_group.lua`: a consumer removed from its group if it holds no
/// message.
pub(crate) struct LeaveGroup<'a> {
    pub stream: String,
    pub group: &'a str,
    pub consumer: &'a str,
}

impl Call for LeaveGroup<'_> {
    /// Whether it was removed.
    type Reply = bool;

    fn script() -> &'static Script {
        &LEAVE_GROUP
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.stream).arg(self.group).arg(self.consumer);
    }

    fn decode(reply: Value) -> Result<bool, BackendError> {
        typed::<i64>(reply).map(|n| n == 1)
    }
}
