//! Key layout.
//!
//! Every key a script touches for one task carries the same hash tag, the
//! task's *partition* `{<prefix>:<k>}`, and so does the partition's work
//! queue and dead-letter stream. A task's lock, fence, record, cancellation
//! flag, idempotency keys and queue therefore live in one Redis Cluster slot,
//! which is what lets "record the step, enqueue the next message, acknowledge
//! this one" be one script. Partitions spread tasks over slots; one partition
//! (the default) keeps everything in one slot.

use crate::process::{Envelope, TallyRef};
use crate::task::{TaskId, TaskStatus};

#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
    partitions: u16,
}

impl Keys {
    pub fn new(prefix: &str, partitions: u16) -> Self {
        Keys {
            prefix: prefix.to_owned(),
            partitions: partitions.max(1),
        }
    }

    pub fn partitions(&self) -> u16 {
        self.partitions
    }

    /// Work streams: one per saga partition, then the process-manager
    /// stream every reader reads (index `partitions`), then the
    /// [`PROCESS_PARTITIONS`] process-manager partitions.
    pub fn streams(&self) -> u16 {
        self.partitions + 1 + PROCESS_PARTITIONS
    }

    /// The index of the process-manager stream every reader reads: where
    /// messages wait that no partition owner can handle (for a process
    /// manager it does not run), and those enqueued before partitions
    /// existed (it keeps its old name).
    pub fn process_stream(&self) -> u16 {
        self.partitions
    }

    /// The index of process-manager partition `k`.
    pub fn process_partition(&self, k: u16) -> u16 {
        self.partitions + 1 + k
    }

    /// Whether stream `stream` carries process-manager messages.
    pub fn is_process(&self, stream: u16) -> bool {
        stream >= self.partitions && stream < self.streams()
    }

    /// The partition stream of a process-manager message: by its instance
    /// id where it names one, else by its correlation value (see
    /// [`route_hash`]).
    pub fn envelope_stream(&self, envelope: &Envelope) -> u16 {
        let target = envelope.instance_id.as_deref();
        self.process_route(
            &envelope.process,
            target.or(envelope.key.as_deref()).unwrap_or_default(),
        )
    }

    /// The partition stream of messages of `process` for `target` (an
    /// instance id or correlation value).
    pub fn process_route(&self, process: &str, target: &str) -> u16 {
        let k = route_hash(&format!("{process}:{target}")) % u32::from(PROCESS_PARTITIONS);
        self.process_partition(k as u16)
    }

    pub fn partition_of(&self, id: TaskId) -> u16 {
        let bytes = id.0.as_u128();
        (bytes % u128::from(self.partitions)) as u16
    }

    fn tag(&self, partition: u16) -> String {
        format!("{}:{{{}:{}}}", self.prefix, self.prefix, partition)
    }

    /// What every key of a task of `partition` starts with:
    /// `<prefix>:task:<id>`, `<prefix>:lock:<id>`, ... A script that finds a
    /// task id in a message of the partition's stream builds the task's
    /// keys from it (they share the stream's slot).
    pub fn task_prefix(&self, partition: u16) -> String {
        self.tag(partition)
    }

    /// What every process-manager key starts with: `<prefix>:inst:..`,
    /// `<prefix>:idx:..` (for scripts that build them from a message).
    pub fn process_prefix(&self) -> String {
        self.pm_tag()
    }

    fn task_key(&self, kind: &str, id: TaskId) -> String {
        format!("{}:{kind}:{id}", self.tag(self.partition_of(id)))
    }

    pub fn task(&self, id: TaskId) -> String {
        self.task_key("task", id)
    }
    pub fn lock(&self, id: TaskId) -> String {
        self.task_key("lock", id)
    }
    pub fn fence(&self, id: TaskId) -> String {
        self.task_key("fence", id)
    }
    pub fn cancel(&self, id: TaskId) -> String {
        self.task_key("cancel", id)
    }
    /// The audit log: a list of JSON entries, appended by each write and
    /// capped ([`AUDIT_LOG_CAP`](crate::task::AUDIT_LOG_CAP)).
    pub fn audit(&self, id: TaskId) -> String {
        self.task_key("audit", id)
    }
    /// The attempts claimed so far: a hash, one field per attempt.
    pub fn claims(&self, id: TaskId) -> String {
        self.task_key("claims", id)
    }

    /// A partition's index of one saga's tasks (sorted by creation time),
    /// all of them or those in one status.
    pub fn index(&self, partition: u16, saga: &str, status: Option<TaskStatus>) -> String {
        match status {
            Some(status) => format!("{}:idx:{saga}:{status:?}", self.tag(partition)),
            None => format!("{}:idx:{saga}", self.tag(partition)),
        }
    }

    /// A partition's finished tasks, by when their retention runs out.
    pub fn expiring(&self, partition: u16) -> String {
        format!("{}:expiring", self.tag(partition))
    }

    /// A task's entry in [`expiring`](Self::expiring): enough to find its
    /// index entries once its record is gone.
    pub fn expiring_member(id: TaskId, status: TaskStatus, saga: &str) -> String {
        format!("{id}|{status:?}|{saga}")
    }

    /// A stream's delayed messages (retry backoffs, hand-backs with a
    /// delay), by due time.
    pub fn delayed(&self, stream: u16) -> String {
        self.stream_key(stream, "delayed")
    }

    pub fn queue(&self, stream: u16) -> String {
        self.stream_key(stream, "queue")
    }

    pub fn dead(&self, stream: u16) -> String {
        self.stream_key(stream, "dead")
    }

    /// `<tag>:<kind>` of a saga partition or of the shared process-manager
    /// stream, `<pm tag>:<kind>:<k>` of process-manager partition `k`.
    fn stream_key(&self, stream: u16, kind: &str) -> String {
        match stream.checked_sub(self.partitions + 1) {
            Some(k) => format!("{}:{kind}:{k}", self.pm_tag()),
            None if stream == self.partitions => format!("{}:{kind}", self.pm_tag()),
            None => format!("{}:{kind}", self.tag(stream)),
        }
    }

    /// The engines reading process-manager partitions, by when their
    /// membership runs out (a sorted set).
    pub fn partition_members(&self) -> String {
        format!("{}:members", self.pm_tag())
    }

    /// The engines that run process manager `name`, by the time their
    /// announcement runs out.
    pub fn process_runners(&self, name: &str) -> String {
        format!("{}:runs:{name}", self.pm_tag())
    }

    /// What the owner lease of process-manager partition `k` is named
    /// (`<this>:<k>`), for the script that balances them.
    pub fn partition_owner_prefix(&self) -> String {
        format!("{}:owner", self.pm_tag())
    }

    /// Every process-manager key carries this one hash tag: instances,
    /// correlation entries, the queue, the schedule and the endpoint streams
    /// of all process managers live in one slot, so each commit (state,
    /// correlation entries, outbox, acknowledgement) is one script.
    fn pm_tag(&self) -> String {
        format!("{}:{{{}:pm}}", self.prefix, self.prefix)
    }

    pub fn instance(&self, process: &str, id: &str) -> String {
        format!("{}:inst:{process}:{id}", self.pm_tag())
    }

    pub fn instances(&self, process: &str) -> String {
        format!("{}:insts:{process}", self.pm_tag())
    }

    pub fn correlation(&self, process: &str, field: &str, value: &str) -> String {
        format!("{}:idx:{process}:{field}:{value}", self.pm_tag())
    }

    /// The instances sharing a value of a field `#[handles(many)]`
    /// correlates by (a set of ids).
    pub fn shared_correlation(&self, process: &str, field: &str, value: &str) -> String {
        format!("{}:idxs:{process}:{field}:{value}", self.pm_tag())
    }

    /// The message ids a deleted instance handled (a set that expires).
    pub fn tombstone(&self, process: &str, id: &str) -> String {
        format!("{}:tomb:{process}:{id}", self.pm_tag())
    }

    /// The same, under a correlation entry the deleted instance released.
    pub fn correlation_tombstone(&self, process: &str, field: &str, value: &str) -> String {
        format!("{}:idxtomb:{process}:{field}:{value}", self.pm_tag())
    }

    /// A tally's keys: `part` is `` (a hash: total, done, late, the
    /// completion envelopes), `:pending` or `:checked` (sets of items).
    /// The instance id goes last: it is the one part that may hold `:`.
    pub fn tally(&self, tally: &TallyRef, part: &str) -> String {
        format!(
            "{}:tally{part}:{}:{}:{}:{}",
            self.pm_tag(),
            tally.process,
            tally.name,
            tally.generation,
            tally.instance
        )
    }

    /// The tallies not yet complete, by when they expire: what
    /// housekeeping looks at to send a completion whose checker died
    /// between checking the last item and sending it.
    pub fn open_tallies(&self) -> String {
        format!("{}:tallies", self.pm_tag())
    }

    pub fn scheduled(&self) -> String {
        format!("{}:scheduled", self.pm_tag())
    }

    pub fn endpoint(&self, name: &str) -> String {
        format!("{}:endpoint:{name}", self.pm_tag())
    }

    /// An endpoint's dead letters.
    pub fn endpoint_dead(&self, name: &str) -> String {
        format!("{}:endpoint:{name}:dead", self.pm_tag())
    }

    pub fn lease(&self, name: &str) -> String {
        format!("{}:lease:{name}", self.pm_tag())
    }

    /// A `scope = shared` circuit breaker's state: a hash with its own hash
    /// tag (it is touched by one script at a time, alone).
    pub fn breaker(&self, name: &str) -> String {
        format!(
            "{}:{{{}:breakers}}:breaker:{name}",
            self.prefix, self.prefix
        )
    }

    /// The deployment's layout (its partition count), recorded by the first
    /// backend to connect.
    pub fn layout(&self) -> String {
        format!("{}:layout", self.prefix)
    }

    /// Where the commit that ends a task publishes its id.
    pub fn finished_channel(&self) -> String {
        format!("{}:finished", self.prefix)
    }

    pub fn cancel_channel(&self) -> String {
        format!("{}:cancellations", self.prefix)
    }

    /// Message and dead-letter ids carry their partition: `<k>/<stream id>`
    /// for messages, `<k>:<stream id>` for dead letters (safe in a URL
    /// path, where operators paste them); either is accepted.
    pub fn split_id<'a>(&self, id: &'a str) -> Option<(u16, &'a str)> {
        let (p, entry) = id.split_once(['/', ':'])?;
        let p: u16 = p.parse().ok()?;
        // `<ms>-<seq>`, both numbers: anything else is no entry of ours
        // (and `<ms>` alone would be a range).
        let (ms, seq) = entry.split_once('-')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(ms) || !digits(seq) {
            return None;
        }
        (p < self.streams()).then_some((p, entry))
    }
}

/// How many partitions process-manager messages are spread over. Each is
/// read by one engine at a time (the one holding its owner lease), so that
/// the messages of one instance are handled by one writer; sixteen lets up
/// to sixteen engines share the work. Fixed, so that every engine of a
/// deployment routes alike.
pub const PROCESS_PARTITIONS: u16 = 16;

/// The routing hash of process-manager messages, computed alike here and
/// in scripts ([`ROUTE_HASH_LUA`]): a polynomial hash modulo a prime below
/// 2^31, which Lua's doubles compute exactly.
pub fn route_hash(text: &str) -> u32 {
    text.bytes()
        .fold(0u64, |h, b| (h * 31 + u64::from(b)) % 2_147_483_647) as u32
}

/// [`route_hash`] in Lua, and `route(prefix, m)`: the queue key of decoded
/// envelope `m` (`ARGV`-independent, for scripts that move envelopes).
pub const ROUTE_HASH_LUA: &str = r"
local function route_hash(s)
  local h = 0
  for i = 1, #s do h = (h * 31 + string.byte(s, i)) % 2147483647 end
  return h
end
local function route(pm_prefix, partitions, m)
  local target = m.instance_id
  if type(target) ~= 'string' then target = m.key end
  if type(target) ~= 'string' then target = '' end
  local process = m.process
  if type(process) ~= 'string' then return pm_prefix .. ':queue' end
  return pm_prefix .. ':queue:' .. (route_hash(process .. ':' .. target) % partitions)
end
";

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(key: &str) -> &str {
        let start = key.find('{').unwrap() + 1;
        let end = key[start..].find('}').unwrap() + start;
        &key[start..end]
    }

    #[test]
    fn every_key_of_a_task_and_its_queue_share_one_hash_tag() {
        let keys = Keys::new("saga", 8);
        for _ in 0..50 {
            let id = TaskId::new();
            let p = keys.partition_of(id);
            let expected = tag(&keys.queue(p)).to_owned();
            for key in [
                keys.task(id),
                keys.lock(id),
                keys.fence(id),
                keys.cancel(id),
                keys.claims(id),
                keys.audit(id),
                keys.dead(p),
                keys.delayed(p),
                keys.expiring(p),
                keys.index(p, "create-zip", None),
                keys.index(p, "create-zip", Some(TaskStatus::Running)),
            ] {
                assert_eq!(tag(&key), expected, "{key}");
            }
        }
        let id = TaskId::new();
        let prefix = keys.task_prefix(keys.partition_of(id));
        for (kind, key) in [
            ("task", keys.task(id)),
            ("lock", keys.lock(id)),
            ("fence", keys.fence(id)),
            ("cancel", keys.cancel(id)),
        ] {
            assert_eq!(format!("{prefix}:{kind}:{id}"), key, "TAKE builds it so");
        }
        let pm = keys.process_prefix();
        assert_eq!(format!("{pm}:inst:p:i-1"), keys.instance("p", "i-1"));
        assert_eq!(format!("{pm}:idx:p:f:v"), keys.correlation("p", "f", "v"));
        assert_eq!(keys.split_id("3/1-0"), Some((3, "1-0")));
        assert_eq!(keys.split_id("3:1-0"), Some((3, "1-0")));
        for bad in ["3:abc", "3:1-2-3", "3:17", "3:-1", "3:1-"] {
            assert_eq!(keys.split_id(bad), None, "{bad}");
        }
        assert_eq!(
            keys.split_id("8/1-0"),
            Some((8, "1-0")),
            "the process-manager stream"
        );
        assert_eq!(
            keys.split_id("24/1-0"),
            Some((24, "1-0")),
            "the last partition"
        );
        assert_eq!(keys.split_id("25/1-0"), None);
        assert_eq!(keys.queue(keys.process_stream()), format!("{pm}:queue"));
        assert_eq!(
            keys.queue(keys.process_partition(3)),
            format!("{pm}:queue:3")
        );
        assert_eq!(
            keys.dead(keys.process_partition(15)),
            format!("{pm}:dead:15")
        );
        assert!(keys.is_process(8) && keys.is_process(24) && !keys.is_process(7));
        let pm = tag(&keys.queue(keys.process_stream())).to_owned();
        for key in [
            keys.instance("fulfillment", "o-1"),
            keys.correlation("fulfillment", "order_number", "42"),
            keys.scheduled(),
            keys.endpoint("billing"),
            keys.dead(keys.process_stream()),
            keys.tally(
                &TallyRef {
                    process: "batch".into(),
                    instance: "b:1".into(),
                    generation: "g".into(),
                    name: "items".into(),
                },
                ":pending",
            ),
        ] {
            assert_eq!(tag(&key), pm, "{key}");
        }
    }
}
