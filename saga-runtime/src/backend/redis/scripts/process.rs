//! The calls of the process-manager protocol: the commit, due timeouts,
//! correlation entries claimed from another slot, tombstones, and the
//! tallies' completion and progress.

use redis::{Script, Value};

use super::{flag, or_empty, typed, Call, Invocation, RefusalCode, Refused, SettleArgv};
use super::{
    CLAIM_ENTRY, ENDPOINT_APPEND, PROCESS_COMMIT, PROCESS_HOLD, RELEASE_DUE, RELEASE_HELD,
    REMEMBER, SWAP_ENTRY, TALLY_FINISH, TALLY_PROGRESS,
};
use crate::backend::redis::corrupt;
use crate::backend::redis::entry::{items, text, text_at};
use crate::backend::BackendError;
use crate::model::tally::TallyProgress as Progress;

/// A JSON array of strings, as the scripts decode it (`cjson`).
fn json_strings<S: AsRef<str>>(strings: &[S]) -> String {
    serde_json::Value::from(
        strings
            .iter()
            .map(|s| s.as_ref().to_owned())
            .collect::<Vec<String>>(),
    )
    .to_string()
}

/// A correlation entry a commit claims or releases, with its tombstone.
pub(crate) struct Correlation {
    pub entry: String,
    pub tombstone: String,
}

/// A message for an endpoint: the stream written (the endpoint's, or the
/// partition's relay stream when the endpoint is in another slot), and
/// the endpoint's stream it is relayed to from there.
pub(crate) struct EndpointMessage {
    pub stream: String,
    pub relay_to: Option<String>,
    pub payload: String,
}

/// A message a commit handles besides the one it settles (a batch).
pub(crate) struct BatchedMessage {
    pub message_id: String,
    pub queue: String,
    pub entry: String,
}

/// A tally a commit opens.
pub(crate) struct OpenTally {
    pub hash: String,
    pub pending: String,
    pub checked: String,
    pub keep_ms: u64,
    pub completion: String,
    pub completion_late: String,
    /// The queue the completion goes to.
    pub completion_queue: String,
    pub items: Vec<String>,
    /// Its member of the open tallies.
    pub member: String,
}

/// `process_commit.lua`: one atomic write of the process-manager protocol.
pub(crate) struct ProcessCommit<'a> {
    pub instance: String,
    pub instances: String,
    /// The queue of the delivery settled, and its dead letters.
    pub queue: String,
    pub dead: String,
    pub schedule: String,
    pub claim: Vec<Correlation>,
    pub release: Vec<Correlation>,
    pub endpoints: Vec<EndpointMessage>,
    /// The instance's tombstone.
    pub tombstone: String,
    pub tallies: Vec<OpenTally>,
    pub open_tallies: String,
    pub join_shared: Vec<String>,
    pub leave_shared: Vec<String>,
    /// The partition members (compact layout only).
    pub members: Option<String>,
    /// Whether the commit writes an instance (`version`, `doc`, `id`,
    /// `generation` are its).
    pub has_instance: bool,
    pub version: u64,
    pub doc: String,
    pub id: String,
    pub delete: bool,
    pub generation: &'a str,
    pub settle: SettleArgv<'a>,
    pub group: &'a str,
    pub dead_cap: u64,
    pub endpoint_cap: u64,
    /// The id of the message handled.
    pub handling: Option<&'a str>,
    pub tombstone_ttl_ms: u64,
    /// The message ids a deleted instance handled.
    pub deleted_handled: Vec<String>,
    pub batched: Vec<BatchedMessage>,
    /// Messages to enqueue: (queue, payload).
    pub enqueue: Vec<(String, String)>,
    /// Timeouts: (due ms, payload).
    pub timeouts: Vec<(u64, String)>,
    /// The values whose held messages the commit releases.
    pub release_held: Vec<HeldKeys>,
}

/// The keys of the messages held for one value (`lua/lib/held.lua`), and
/// the queue they are released onto.
#[derive(Debug, Clone)]
pub(crate) struct HeldKeys {
    pub list: String,
    pub payloads: String,
    pub schedule: String,
    pub queue: String,
}

impl ProcessCommit<'_> {
    fn fill_keys(&self, call: &mut Invocation) {
        call.key(&self.instance)
            .key(&self.instances)
            .key(&self.queue)
            .key(&self.schedule)
            .key(&self.dead);
        for c in self.claim.iter().chain(&self.release) {
            call.key(&c.entry);
        }
        for endpoint in &self.endpoints {
            call.key(&endpoint.stream);
        }
        call.key(&self.tombstone);
        for c in self.claim.iter().chain(&self.release) {
            call.key(&c.tombstone);
        }
        for tally in &self.tallies {
            call.key(&tally.hash)
                .key(&tally.pending)
                .key(&tally.checked);
        }
        call.key(&self.open_tallies);
        for key in self.join_shared.iter().chain(&self.leave_shared) {
            call.key(key);
        }
        for held in &self.release_held {
            call.key(&held.list).key(&held.payloads).key(&held.schedule);
        }
        if let Some(members) = &self.members {
            call.key(members);
        }
    }

    fn fill_payloads(&self, call: &mut Invocation) {
        for (queue, payload) in &self.enqueue {
            call.arg(queue).arg(payload);
        }
        for endpoint in &self.endpoints {
            call.arg(&endpoint.payload);
        }
        for (due, payload) in &self.timeouts {
            call.arg(*due).arg(payload);
        }
        for tally in &self.tallies {
            call.arg(tally.items.len())
                .arg(tally.keep_ms)
                .arg(&tally.completion)
                .arg(&tally.completion_late)
                .arg(&tally.completion_queue);
            for item in &tally.items {
                call.arg(item);
            }
            call.arg(&tally.member);
        }
    }
}

/// What a process-manager commit stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProcessCommitted {
    /// The instance's new version (0 when no instance was written).
    pub version: u64,
    /// The entry ids of the messages left on the relay stream, one per
    /// endpoint message relayed, in order.
    pub relayed: Vec<String>,
}

impl Call for ProcessCommit<'_> {
    type Reply = Result<ProcessCommitted, Refused>;

    fn script() -> &'static Script {
        &PROCESS_COMMIT
    }

    fn fill(&self, call: &mut Invocation) {
        self.fill_keys(call);
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
        // The endpoint streams relayed to, of the messages that are: the
        // script reads this list by endpoint index, so the two agree when
        // every endpoint message is relayed or none is (as before).
        let relays: Vec<&str> = self
            .endpoints
            .iter()
            .filter_map(|e| e.relay_to.as_deref())
            .collect();
        let batched_ids: Vec<&str> = self.batched.iter().map(|b| b.message_id.as_str()).collect();
        let batched_acks = serde_json::Value::from(
            self.batched
                .iter()
                .map(|b| serde_json::Value::from(vec![b.queue.clone(), b.entry.clone()]))
                .collect::<Vec<_>>(),
        );
        call.arg(flag(self.has_instance))
            .arg(self.version)
            .arg(&self.doc)
            .arg(&self.id)
            .arg(flag(self.delete))
            .arg(self.claim.len())
            .arg(self.release.len())
            .arg(self.endpoints.len())
            .arg(self.enqueue.len())
            .arg(self.timeouts.len())
            .arg(kind)
            .arg(entry)
            .arg(self.group)
            .arg(payload)
            .arg(reason)
            .arg(or_empty(size))
            .arg(self.dead_cap)
            .arg(self.endpoint_cap)
            .arg(self.handling.unwrap_or_default())
            .arg(self.tombstone_ttl_ms)
            .arg(json_strings(&self.deleted_handled))
            .arg(self.tallies.len())
            .arg(self.join_shared.len())
            .arg(self.leave_shared.len())
            .arg(json_strings(&batched_ids))
            .arg(batched_acks.to_string())
            .arg(self.generation)
            .arg(json_strings(&relays))
            .arg(self.release_held.len());
        for held in &self.release_held {
            call.arg(&held.queue);
        }
        self.fill_payloads(call);
    }

    fn decode(reply: Value) -> Result<Self::Reply, BackendError> {
        let reply: Vec<Value> = typed(reply)?;
        match reply.first() {
            Some(Value::Int(v)) if *v >= 0 => Ok(Ok(ProcessCommitted {
                version: *v as u64,
                relayed: reply[1..].iter().map(text).collect(),
            })),
            Some(Value::Int(code)) => Ok(Err(Refused {
                // Any other code reads as a conflict, as it always has.
                refusal: RefusalCode::from_code(*code, RefusalCode::PROCESS_COMMIT)
                    .unwrap_or(RefusalCode::Conflict),
                detail: text_at(&reply, 1),
            })),
            _ => Err(corrupt("unexpected reply from the process commit script")),
        }
    }
}

/// `process_hold.lua`: a continuing message held for its instance.
pub(crate) struct ProcessHold<'a> {
    /// The instance (or correlation entry) it looks for.
    pub owner: String,
    /// Its tombstone.
    pub tombstone: String,
    pub held: HeldKeys,
    /// The delivery's queue, entry and group (`None`: nothing to settle).
    pub settle: Option<(String, &'a str, &'a str)>,
    pub message_id: &'a str,
    pub payload: String,
    pub until_ms: u64,
    pub cap: usize,
}

/// What `process_hold.lua` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holding {
    /// Held now.
    Held,
    /// Held before (the same message id).
    Already,
}

impl Call for ProcessHold<'_> {
    /// Or refused: [`RefusalCode::Conflict`], [`RefusalCode::Taken`] (with the
    /// entry's owner), [`RefusalCode::Tombstoned`], [`RefusalCode::HoldFull`].
    type Reply = Result<Holding, Refused>;

    fn script() -> &'static Script {
        &PROCESS_HOLD
    }

    fn fill(&self, call: &mut Invocation) {
        let (queue, entry, group) = match &self.settle {
            Some((queue, entry, group)) => (queue.as_str(), *entry, *group),
            None => (self.held.queue.as_str(), "", ""),
        };
        call.key(&self.owner)
            .key(&self.tombstone)
            .key(&self.held.list)
            .key(&self.held.payloads)
            .key(&self.held.schedule)
            .key(queue)
            .arg(self.message_id)
            .arg(&self.payload)
            .arg(self.until_ms)
            .arg(self.cap)
            .arg(if self.settle.is_some() { "ack" } else { "none" })
            .arg(entry)
            .arg(group);
    }

    fn decode(reply: Value) -> Result<Self::Reply, BackendError> {
        let reply: Vec<Value> = typed(reply)?;
        Ok(match reply.first() {
            Some(Value::Int(0)) => Ok(Holding::Held),
            Some(Value::Int(1)) => Ok(Holding::Already),
            Some(Value::Int(code)) => {
                match RefusalCode::from_code(*code, RefusalCode::PROCESS_HOLD) {
                    Some(refusal) => Err(Refused {
                        refusal,
                        detail: text_at(&reply, 1),
                    }),
                    None => return Err(corrupt("unexpected refusal from the hold script")),
                }
            }
            _ => return Err(corrupt("unexpected reply from the hold script")),
        })
    }
}

/// `endpoint_append.lua`: a relayed message appended to its endpoint,
/// unless the endpoint is full.
pub(crate) struct EndpointAppend<'a> {
    pub stream: &'a str,
    pub envelope: &'a str,
    pub cap: u64,
}

impl Call for EndpointAppend<'_> {
    /// The entry's id, or `None` when the endpoint is full.
    type Reply = Option<String>;

    fn script() -> &'static Script {
        &ENDPOINT_APPEND
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(self.stream).arg(self.envelope).arg(self.cap);
    }

    fn decode(reply: Value) -> Result<Option<String>, BackendError> {
        match reply {
            Value::Array(items) => match items.first() {
                Some(Value::Int(code))
                    if RefusalCode::from_code(*code, RefusalCode::ENDPOINT_APPEND).is_some() =>
                {
                    Ok(None)
                }
                _ => Err(corrupt("unexpected reply from the endpoint append")),
            },
            other => typed(other).map(Some),
        }
    }
}

/// `release_held.lua`: the messages held for a value released, after
/// the commit that claimed it from another slot.
pub(crate) struct ReleaseHeld<'a> {
    pub held: &'a HeldKeys,
}

impl Call for ReleaseHeld<'_> {
    /// How many moved.
    type Reply = usize;

    fn script() -> &'static Script {
        &RELEASE_HELD
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.held.list)
            .key(&self.held.payloads)
            .key(&self.held.schedule)
            .arg(&self.held.queue);
    }

    fn decode(reply: Value) -> Result<usize, BackendError> {
        typed(reply)
    }
}

/// `release_due.lua`: due process-manager timeouts moved onto their
/// queues.
pub(crate) struct ReleaseDue {
    pub schedule: String,
    pub queue: String,
    /// The partition members (compact layout only).
    pub members: Option<String>,
    pub due_by_ms: u64,
    pub limit: usize,
    /// The process-manager key prefix (`''` in the spread layout).
    pub pm_prefix: String,
    pub partitions: u16,
}

impl Call for ReleaseDue {
    /// How many moved.
    type Reply = usize;

    fn script() -> &'static Script {
        &RELEASE_DUE
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.schedule).key(&self.queue);
        if let Some(members) = &self.members {
            call.key(members);
        }
        call.arg(self.due_by_ms)
            .arg(self.limit)
            .arg(&self.pm_prefix)
            .arg(self.partitions);
    }

    fn decode(reply: Value) -> Result<usize, BackendError> {
        typed(reply)
    }
}

/// `claim_entry.lua`: a correlation entry in another slot than its
/// instance claimed before the instance's commit.
pub(crate) struct ClaimEntry<'a> {
    pub entry: String,
    pub tombstone: String,
    pub marker: String,
    pub id: &'a str,
    /// The ids of the messages being handled.
    pub handled: &'a [&'a str],
    pub in_flight_ms: u64,
}

/// What `claim_entry.lua` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryClaim {
    /// Claimed now.
    Claimed,
    /// The instance held it already.
    Held,
}

impl Call for ClaimEntry<'_> {
    /// Or refused: [`RefusalCode::Taken`] (with the owner), or
    /// [`RefusalCode::Tombstoned`].
    type Reply = Result<EntryClaim, Refused>;

    fn script() -> &'static Script {
        &CLAIM_ENTRY
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.entry)
            .key(&self.tombstone)
            .key(&self.marker)
            .arg(self.id)
            .arg(json_strings(self.handled))
            .arg(self.in_flight_ms);
    }

    fn decode(reply: Value) -> Result<Self::Reply, BackendError> {
        let reply: Vec<Value> = typed(reply)?;
        let refusal = |code: &i64| RefusalCode::from_code(*code, RefusalCode::CLAIM_ENTRY);
        Ok(match reply.as_slice() {
            [Value::Int(1)] => Ok(EntryClaim::Claimed),
            [Value::Int(2)] => Ok(EntryClaim::Held),
            [Value::Int(code)] if refusal(code) == Some(RefusalCode::Tombstoned) => Err(Refused {
                refusal: RefusalCode::Tombstoned,
                detail: None,
            }),
            [Value::Int(code), owner, ..] if refusal(code) == Some(RefusalCode::Taken) => {
                Err(Refused {
                    refusal: RefusalCode::Taken,
                    detail: Some(text(owner)),
                })
            }
            _ => return Err(corrupt("unexpected reply from the entry claim")),
        })
    }
}

/// `swap_entry.lua`: compare-and-set of a correlation entry's owner.
pub(crate) struct SwapEntry<'a> {
    pub entry: String,
    pub expected: &'a str,
    /// The new owner; `None` deletes the entry.
    pub owner: Option<&'a str>,
}

impl Call for SwapEntry<'_> {
    /// Whether it was swapped.
    type Reply = bool;

    fn script() -> &'static Script {
        &SWAP_ENTRY
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.entry)
            .arg(self.expected)
            .arg(self.owner.unwrap_or_default());
    }

    fn decode(reply: Value) -> Result<bool, BackendError> {
        typed::<i64>(reply).map(|n| n == 1)
    }
}

/// `remember.lua`: members added to a set that expires (a tombstone).
pub(crate) struct Remember<'a> {
    pub set: String,
    pub ttl_ms: u64,
    pub members: &'a [String],
}

impl Call for Remember<'_> {
    /// Whether anything was added.
    type Reply = bool;

    fn script() -> &'static Script {
        &REMEMBER
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.set).arg(self.ttl_ms).arg(self.members);
    }

    fn decode(reply: Value) -> Result<bool, BackendError> {
        typed::<i64>(reply).map(|n| n == 1)
    }
}

/// `tally_finish.lua`: a tally's completion sent if due and unsent.
pub(crate) struct TallyFinish {
    pub tally: String,
    pub pending: String,
    pub checked: String,
    pub queue: String,
    pub open_tallies: String,
    /// The partition members (compact layout only).
    pub members: Option<String>,
    pub keep_ms: u64,
    pub member: String,
    /// Called by the check that moved the last item (else a repair).
    pub mover: bool,
}

/// What `tally_finish.lua` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TallyFinished {
    /// Sent now (or, to the first mover after a repair sent it, for it).
    Sent,
    /// Not (yet): items unchecked, or sent already.
    NotSent,
    /// No such tally.
    Gone,
}

impl Call for TallyFinish {
    type Reply = TallyFinished;

    fn script() -> &'static Script {
        &TALLY_FINISH
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.tally)
            .key(&self.pending)
            .key(&self.checked)
            .key(&self.queue)
            .key(&self.open_tallies);
        if let Some(members) = &self.members {
            call.key(members);
        }
        call.arg(self.keep_ms)
            .arg(&self.member)
            .arg(if self.mover { "mover" } else { "repair" });
    }

    fn decode(reply: Value) -> Result<TallyFinished, BackendError> {
        Ok(match typed::<i64>(reply)? {
            1 => TallyFinished::Sent,
            -1 => TallyFinished::Gone,
            _ => TallyFinished::NotSent,
        })
    }
}

/// `tally_progress.lua`: a tally's progress (marking its deadline passed
/// if asked).
pub(crate) struct TallyProgress {
    pub tally: String,
    pub pending: String,
    /// How many unchecked items to list.
    pub missing: usize,
    pub mark_deadline: bool,
}

impl Call for TallyProgress {
    /// `None`: no such tally.
    type Reply = Option<Progress>;

    fn script() -> &'static Script {
        &TALLY_PROGRESS
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.tally)
            .key(&self.pending)
            .arg(self.missing)
            .arg(flag(self.mark_deadline));
    }

    fn decode(reply: Value) -> Result<Option<Progress>, BackendError> {
        let reply: Vec<Value> = typed(reply)?;
        let int = |i: usize| match reply.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            other => Err(corrupt(format!("a tally script answered {other:?}"))),
        };
        let total = int(0)?;
        if total < 0 {
            return Ok(None);
        }
        Ok(Some(Progress {
            total: total as u64,
            checked: int(1)?.max(0) as u64,
            complete: int(2)? == 1,
            deadline_passed: int(3)? == 1,
            missing: reply
                .get(4)
                .map(|m| items(m).into_iter().map(text).collect())
                .unwrap_or_default(),
        }))
    }
}
