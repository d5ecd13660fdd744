//! The calls of the work queue and the endpoints: take, claim, hand back,
//! acknowledge, dead-letter, requeue, move delayed messages, share,
//! enqueue process-manager messages; take and settle an endpoint's message.

use redis::{Script, Value};

use super::{flag, or_empty, typed, Call, Invocation};
use super::{
    ACK, CLAIM, DEAD_LETTER, ENDPOINT_SETTLE, ENDPOINT_TAKE, ENQUEUE_PM, PARK, RELEASE,
    RELEASE_DELAYED, REQUEUE, SHARE, TAKE,
};
use crate::backend::redis::entry::{items, text, text_at};
use crate::backend::redis::record::RawRecord;
use crate::backend::BackendError;
use crate::model::task::TaskId;

/// `ack.lua`: a delivered message acknowledged and deleted.
pub(crate) struct Ack<'a> {
    pub queue: String,
    pub group: &'a str,
    pub entry: String,
}

impl Call for Ack<'_> {
    /// Whether it was pending.
    type Reply = bool;

    fn script() -> &'static Script {
        &ACK
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.queue).arg(self.group).arg(&self.entry);
    }

    fn decode(reply: Value) -> Result<bool, BackendError> {
        typed::<i64>(reply).map(|n| n == 1)
    }
}

/// `release.lua`: a message handed back, now or after a delay.
pub(crate) struct Release<'a> {
    pub queue: String,
    pub delayed: String,
    pub group: &'a str,
    pub consumer: &'a str,
    pub entry: String,
    pub delay_ms: u64,
    /// Whether this delivery counts as answered.
    pub answered: bool,
}

/// What `release.lua` did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// Settled, and a copy enqueued (or delayed).
    HandedBack,
    /// No longer this consumer's (settled meanwhile, taken over): left alone.
    NotOurs,
    /// An entry with no `payload` field: nothing a copy could carry, so it
    /// is left pending for the caller to dead-letter.
    NoPayload,
}

impl Call for Release<'_> {
    type Reply = Released;

    fn script() -> &'static Script {
        &RELEASE
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.queue)
            .key(&self.delayed)
            .arg(self.group)
            .arg(self.consumer)
            .arg(&self.entry)
            .arg(self.delay_ms)
            .arg(flag(self.answered));
    }

    fn decode(reply: Value) -> Result<Released, BackendError> {
        match typed::<i64>(reply)? {
            0 => Ok(Released::NotOurs),
            1 => Ok(Released::HandedBack),
            2 => Ok(Released::NoPayload),
            n => Err(BackendError::Corrupt(format!("RELEASE answered {n}"))),
        }
    }
}

/// One stream `take.lua` reads.
pub(crate) struct TakeFrom {
    pub queue: String,
    /// The key prefix of its partition's tasks, `pm|<prefix>` for a
    /// process-manager stream, `pm|<prefix>|<partition>|<partitions>` in the
    /// spread layout.
    pub prefix: String,
}

/// `take.lua`: messages read without blocking, each saga message with its
/// task's lease, each process-manager message with its instance.
pub(crate) struct Take<'a> {
    pub streams: Vec<TakeFrom>,
    pub group: &'a str,
    pub consumer: &'a str,
    /// The first stream to look at (an index into `streams`).
    pub first: usize,
    /// Read this consumer's own pending messages rather than new ones.
    pub own: bool,
    pub token: &'a str,
    pub ttl_ms: u64,
    pub max: usize,
}

/// One message `take.lua` took.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Taken {
    /// The index of its stream in [`Take::streams`].
    pub stream: usize,
    pub id: String,
    /// Its fields, raw (decoded one by one: see `entry`).
    pub fields: Value,
    /// Its delivery count (this one included).
    pub deliveries: u64,
    pub loaded: Loaded,
}

/// What `take.lua` loaded with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Loaded {
    Nothing,
    /// The task's lease is held by another worker.
    Busy {
        task: TaskId,
    },
    /// The task's lease, taken under `token`, with the task as stored.
    Lease {
        fence: u64,
        task: TaskId,
        record: RawRecord,
        cancel: Option<String>,
    },
    /// A process-manager instance as stored (none: no record), found by
    /// its id or by correlation value `key` of field `key_field`.
    Instance {
        key: String,
        key_field: Option<String>,
        doc: Option<String>,
        version: Option<String>,
    },
}

impl Loaded {
    fn decode(reply: &Value) -> Loaded {
        let items = items(reply);
        let text = |i: usize| text_at(&items, i);
        if text(0).as_deref() == Some("pm") {
            return match text(1) {
                Some(key) => Loaded::Instance {
                    key,
                    key_field: text(2).filter(|f| !f.is_empty()),
                    doc: text(3),
                    version: text(4),
                },
                None => Loaded::Nothing,
            };
        }
        let fence = text(0).and_then(|f| f.parse::<u64>().ok());
        let task = text(1).and_then(|t| t.parse::<TaskId>().ok());
        match (fence, task) {
            (Some(0), Some(task)) => Loaded::Busy { task },
            (Some(fence), Some(task)) => Loaded::Lease {
                fence,
                task,
                record: RawRecord::from_reply(&items, 2, 5),
                cancel: text(4),
            },
            _ => Loaded::Nothing,
        }
    }
}

impl Call for Take<'_> {
    type Reply = Vec<Taken>;

    fn script() -> &'static Script {
        &TAKE
    }

    fn fill(&self, call: &mut Invocation) {
        for stream in &self.streams {
            call.key(&stream.queue);
        }
        call.arg(self.group)
            .arg(self.consumer)
            .arg(self.first)
            .arg(if self.own { "0" } else { ">" })
            .arg(self.token)
            .arg(self.ttl_ms)
            .arg(self.max);
        for stream in &self.streams {
            call.arg(&stream.prefix);
        }
    }

    fn decode(reply: Value) -> Result<Vec<Taken>, BackendError> {
        items(&reply)
            .into_iter()
            .map(|taken| {
                let [stream, id, fields, count, loaded] = items(taken)[..] else {
                    return Err(BackendError::Corrupt("TAKE answered a short entry".into()));
                };
                Ok(Taken {
                    stream: text(stream).parse().unwrap_or(0),
                    id: text(id),
                    fields: fields.clone(),
                    deliveries: text(count).parse().unwrap_or(1),
                    loaded: Loaded::decode(loaded),
                })
            })
            .collect()
    }
}

/// `claim.lua`: messages whose consumer stopped settling them, taken over
/// from the first queue that has any.
pub(crate) struct Claim<'a> {
    pub queues: Vec<String>,
    pub group: &'a str,
    pub consumer: &'a str,
    pub min_idle_ms: u64,
    pub count: usize,
}

/// A message `claim.lua` took over.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Claimed {
    /// The index of its queue in [`Claim::queues`].
    pub queue: usize,
    pub id: String,
    /// Its delivery count (this one included).
    pub deliveries: u64,
    pub fields: Value,
}

impl Call for Claim<'_> {
    /// The first message taken over (the callers take one at a time).
    type Reply = Option<Claimed>;

    fn script() -> &'static Script {
        &CLAIM
    }

    fn fill(&self, call: &mut Invocation) {
        for queue in &self.queues {
            call.key(queue);
        }
        call.arg(self.group)
            .arg(self.consumer)
            .arg(self.min_idle_ms)
            .arg(self.count);
    }

    fn decode(reply: Value) -> Result<Option<Claimed>, BackendError> {
        let Some(first) = items(&reply).first().copied() else {
            return Ok(None);
        };
        let [queue, id, count, fields] = items(first)[..] else {
            return Ok(None);
        };
        let queue = text(queue)
            .parse()
            .map_err(|_| BackendError::Corrupt("CLAIM answered a bad stream".into()))?;
        Ok(Some(Claimed {
            queue,
            id: text(id),
            deliveries: text(count).parse().unwrap_or(1),
            fields: fields.clone(),
        }))
    }
}

/// `dead_letter.lua`: a delivered message parked and settled.
pub(crate) struct DeadLetter<'a> {
    pub queue: String,
    pub dead: String,
    pub group: &'a str,
    pub entry: String,
    pub payload: &'a str,
    pub reason: &'a str,
    pub task: Option<TaskId>,
    /// The payload's size before it was cut, if it was.
    pub size: Option<usize>,
    pub dead_cap: u64,
}

impl Call for DeadLetter<'_> {
    /// The dead letter's entry id.
    type Reply = String;

    fn script() -> &'static Script {
        &DEAD_LETTER
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.queue)
            .key(&self.dead)
            .arg(self.group)
            .arg(&self.entry)
            .arg(self.payload)
            .arg(self.reason)
            .arg(or_empty(self.task))
            .arg(or_empty(self.size))
            .arg(self.dead_cap);
    }

    fn decode(reply: Value) -> Result<String, BackendError> {
        typed(reply)
    }
}

/// `park.lua`: a message that never was on the queue, parked.
pub(crate) struct Park<'a> {
    pub dead: String,
    pub payload: &'a str,
    pub reason: &'a str,
    /// The payload's size before it was cut, if it was.
    pub size: Option<usize>,
    pub dead_cap: u64,
}

impl Call for Park<'_> {
    /// The dead letter's entry id.
    type Reply = String;

    fn script() -> &'static Script {
        &PARK
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.dead)
            .arg(self.payload)
            .arg(self.reason)
            .arg(or_empty(self.size))
            .arg(self.dead_cap);
    }

    fn decode(reply: Value) -> Result<String, BackendError> {
        typed(reply)
    }
}

/// `requeue.lua`: a dead letter moved back onto its queue.
pub(crate) struct Requeue {
    pub dead: String,
    pub queue: String,
    pub entry: String,
}

impl Call for Requeue {
    /// The dead letter's fields, raw; `None` when there was none.
    type Reply = Option<Value>;

    fn script() -> &'static Script {
        &REQUEUE
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.dead).key(&self.queue).arg(&self.entry);
    }

    fn decode(reply: Value) -> Result<Option<Value>, BackendError> {
        Ok(match reply {
            Value::Nil => None,
            fields => Some(fields),
        })
    }
}

/// `release_delayed.lua`: due delayed messages moved onto their queues.
pub(crate) struct ReleaseDelayed {
    /// (delayed messages, queue) pairs, of one slot.
    pub pairs: Vec<(String, String)>,
    pub limit: usize,
}

impl Call for ReleaseDelayed {
    /// How many moved from the pair that moved most.
    type Reply = usize;

    fn script() -> &'static Script {
        &RELEASE_DELAYED
    }

    fn fill(&self, call: &mut Invocation) {
        for (delayed, queue) in &self.pairs {
            call.key(delayed).key(queue);
        }
        call.arg(self.limit);
    }

    fn decode(reply: Value) -> Result<usize, BackendError> {
        typed(reply)
    }
}

/// `share.lua`: a delivered entry moved to another stream and settled.
pub(crate) struct Share<'a> {
    pub from: String,
    pub to: String,
    pub group: &'a str,
    pub entry: String,
    pub consumer: &'a str,
}

impl Call for Share<'_> {
    /// Whether it was moved.
    type Reply = bool;

    fn script() -> &'static Script {
        &SHARE
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.from)
            .key(&self.to)
            .arg(self.group)
            .arg(&self.entry)
            .arg(self.consumer);
    }

    fn decode(reply: Value) -> Result<bool, BackendError> {
        typed::<i64>(reply).map(|n| n == 1)
    }
}

/// `enqueue_pm.lua`: process-manager messages enqueued on their
/// partitions (or on the shared stream while no engine reads partitions).
pub(crate) struct EnqueuePm {
    /// Each message's partition queue, and the message.
    pub messages: Vec<(String, String)>,
    /// The partition members (compact layout only).
    pub members: Option<String>,
}

impl Call for EnqueuePm {
    /// How many were enqueued.
    type Reply = usize;

    fn script() -> &'static Script {
        &ENQUEUE_PM
    }

    fn fill(&self, call: &mut Invocation) {
        for (queue, _) in &self.messages {
            call.key(queue);
        }
        if let Some(members) = &self.members {
            call.key(members);
        }
        for (_, message) in &self.messages {
            call.arg(message);
        }
    }

    fn decode(reply: Value) -> Result<usize, BackendError> {
        typed(reply)
    }
}

/// `endpoint_take.lua`: an endpoint's message taken without blocking.
pub(crate) struct EndpointTake<'a> {
    pub stream: String,
    pub group: &'a str,
    pub consumer: &'a str,
    pub claim_idle_ms: u64,
}

/// A message `endpoint_take.lua` took.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EndpointTaken {
    pub id: String,
    pub fields: Value,
    /// Deliveries to the group so far, this one included.
    pub deliveries: u32,
}

impl Call for EndpointTake<'_> {
    /// The message, if one was waiting.
    type Reply = Option<EndpointTaken>;

    fn script() -> &'static Script {
        &ENDPOINT_TAKE
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.stream)
            .arg(self.group)
            .arg(self.consumer)
            .arg(self.claim_idle_ms);
    }

    fn decode(reply: Value) -> Result<Option<EndpointTaken>, BackendError> {
        let reply: Vec<Value> = typed(reply)?;
        let [id, fields, count] = reply.as_slice() else {
            return Ok(None);
        };
        Ok(Some(EndpointTaken {
            id: text(id),
            fields: fields.clone(),
            deliveries: text(count).parse().unwrap_or(1),
        }))
    }
}

/// `endpoint_settle.lua`: an endpoint's message acknowledged, parked
/// first when dead.
pub(crate) struct EndpointSettle<'a> {
    pub stream: String,
    pub dead: String,
    pub group: &'a str,
    pub entry: &'a str,
    /// Park it as a dead letter.
    pub park: bool,
    pub payload: &'a str,
    pub reason: &'a str,
    /// The payload's size before it was cut, if it was.
    pub size: Option<usize>,
    pub dead_cap: u64,
}

impl Call for EndpointSettle<'_> {
    /// Whether it was pending.
    type Reply = bool;

    fn script() -> &'static Script {
        &ENDPOINT_SETTLE
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.stream)
            .key(&self.dead)
            .arg(self.group)
            .arg(self.entry)
            .arg(flag(self.park))
            .arg(self.payload)
            .arg(self.reason)
            .arg(or_empty(self.size))
            .arg(self.dead_cap);
    }

    fn decode(reply: Value) -> Result<bool, BackendError> {
        typed::<i64>(reply).map(|n| n == 1)
    }
}
