//! Key layout.
//!
//! Every key a script touches for one task carries the same hash tag, the
//! task's *partition*, and so does the partition's work queue and
//! dead-letter stream. A task's lock, fence, record, cancellation flag,
//! idempotency keys and queue therefore live in one Redis Cluster slot,
//! which is what lets "record the step, enqueue the next message, acknowledge
//! this one" be one script. Partitions spread tasks over slots; one partition
//! (the default on a single server) keeps everything in one slot.
//!
//! Two layouts (see [`KeyLayout`](super::KeyLayout)): *compact*, where
//! partition `p`'s tag is `{<prefix>:<p>}`, and *spread*, where each
//! partition's tag carries a suffix chosen so that the partitions' slots
//! sit at even intervals over the slot range (the tags of a handful of
//! consecutive numbers would land wherever CRC16 puts them: with 16
//! partitions on 3 shards, one shard could hold half of them).

use crate::process::{Envelope, TallyRef};
use crate::task::{TaskId, TaskStatus};

use super::KeyLayout;

#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
    partitions: u16,
    /// The hash tag of each saga partition, braces included.
    tags: Vec<String>,
    spread: bool,
}

/// The number of hash slots of Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The hash slot of `key` as Redis Cluster computes it: CRC16 (XMODEM) of
/// its hash tag (the part between the first `{` and the next `}`, if not
/// empty), else of the whole key, modulo 16384.
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = match bytes.iter().position(|&b| b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    crc16(hashed) % SLOTS
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash tag of partition `p` of `n` under `base` (`saga`, or
/// `saga:pm` for process-manager partitions). Compact: `{base:p}`.
/// Spread: `{base:p.s}` with the smallest `s` whose slot falls within an
/// eighth of a band of the middle of the `p`-th of `n` equal bands of the
/// slot range. Deterministic: every engine of a deployment computes the
/// same tags (changing this function changes every key of the layout).
fn partition_tag(base: &str, p: u16, n: u16, spread: bool) -> String {
    // Past 1024 partitions the bands are narrower than the spread of a
    // plain CRC16, and the search would only cost time.
    if !spread || n > 1024 {
        return format!("{{{base}:{p}}}");
    }
    let band = u32::from(SLOTS) / u32::from(n);
    let middle = (u32::from(p) * u32::from(SLOTS) + u32::from(SLOTS) / 2) / u32::from(n);
    let reach = band / 8;
    (0u32..)
        .map(|s| format!("{{{base}:{p}.{s}}}"))
        .find(|tag| u32::from(slot(tag)).abs_diff(middle) <= reach)
        .expect("some suffix lands in every band")
}

/// Reads a recorded layout: `<n>` (compact, as every version wrote it
/// before there were layouts) or `spread/<n>`.
pub fn parse_layout(record: &str) -> Option<(u16, KeyLayout)> {
    match record.split_once('/') {
        None => Some((record.parse().ok()?, KeyLayout::Compact)),
        Some(("spread", n)) => Some((n.parse().ok()?, KeyLayout::Spread)),
        Some(_) => None,
    }
}

/// A recorded layout in words, for error messages.
pub fn describe_layout(record: &str) -> String {
    match parse_layout(record) {
        Some((n, layout)) => format!("{n} partitions in the {layout:?} layout"),
        None => format!("the layout `{record}`"),
    }
}

impl Keys {
    pub fn new(prefix: &str, partitions: u16, spread: bool) -> Self {
        let partitions = partitions.max(1);
        let base = prefix.to_owned();
        Keys {
            prefix: prefix.to_owned(),
            partitions,
            tags: (0..partitions)
                .map(|p| partition_tag(&base, p, partitions, spread))
                .collect(),
            spread,
        }
    }

    /// What [`parse_layout`] reads back.
    pub fn layout_record(&self) -> String {
        match self.spread {
            true => format!("spread/{}", self.partitions),
            false => self.partitions.to_string(),
        }
    }

    /// The hash slot of a stream's keys.
    pub fn stream_slot(&self, stream: u16) -> u16 {
        slot(&self.queue(stream))
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
        format!("{}:{}", self.prefix, self.tags[usize::from(partition)])
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

    /// The backends whose workers read sagas on a cluster, by when their
    /// membership runs out: they split the saga partitions to watch.
    pub fn saga_readers(&self) -> String {
        format!("{}:readers", self.pm_tag())
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
        let keys = Keys::new("saga", 8, false);
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
