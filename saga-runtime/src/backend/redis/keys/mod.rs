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

use crate::model::envelope::Envelope;
use crate::model::tally::TallyRef;
use crate::model::task::{TaskId, TaskStatus};

use super::KeyLayout;

#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
    partitions: u16,
    /// The hash tag of each saga partition, braces included.
    tags: Vec<String>,
    /// `<prefix>:<tag>` of each saga partition: what every key of the
    /// partition starts with. Kept built, since keys are built on every
    /// step (formatting them afresh was a fifth of a worker's
    /// instructions per step).
    heads: Vec<String>,
    /// The hash tag of each process-manager partition (spread layout), or
    /// the one tag they all share (compact).
    pm_tags: Vec<String>,
    /// How many process-manager partitions.
    pm_count: u16,
    /// The hash tag of the control keys (see [`pm_tag`](Self::pm_tag)).
    control: String,
    spread: bool,
    /// The slot of each stream.
    slots: Vec<u16>,
}

/// The keys of one task (see [`Keys::task`] and the others), and its id
/// as text.
#[derive(Debug, Clone)]
pub(crate) struct TaskKeys {
    pub task: String,
    pub lock: String,
    pub fence: String,
    pub cancel: String,
    pub audit: String,
    pub claims: String,
    pub id: String,
}

/// `parts` joined by `sep`, allocated once at its final size: keys are
/// built on every step, and `format!` costs several times as much.
fn joined(parts: &[&str], sep: char) -> String {
    let len = parts.iter().map(|p| p.len() + 1).sum::<usize>();
    let mut out = String::with_capacity(len);
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push(sep);
        }
        out.push_str(part);
    }
    out
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
    // Past 256 partitions plain tags spread evenly enough by themselves
    // (and the search, in bands a few slots wide, would cost time at
    // every start).
    // A prefix with braces of its own would make Redis hash another tag
    // than this one, and no suffix would move it: such a prefix is
    // refused on connecting to a cluster.
    if !spread || n > 256 || base.contains(['{', '}']) {
        return format!("{{{base}:{p}}}");
    }
    let band = u32::from(SLOTS) / u32::from(n);
    let middle = (u32::from(p) * u32::from(SLOTS) + u32::from(SLOTS) / 2) / u32::from(n);
    let reach = band / 8;
    (0u32..100_000)
        .map(|s| format!("{{{base}:{p}.{s}}}"))
        .find(|tag| u32::from(slot(tag)).abs_diff(middle) <= reach)
        .unwrap_or_else(|| format!("{{{base}:{p}}}"))
}

/// A deployment's recorded layout: saga partitions, process-manager
/// partitions, and the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub partitions: u16,
    pub process_partitions: u16,
    pub layout: KeyLayout,
}

/// Reads a recorded layout: `<n>` (compact, as every version wrote it
/// before there were layouts) or `spread/<n>/<process partitions>`.
pub fn parse_layout(record: &str) -> Option<Layout> {
    let mut parts = record.split('/');
    match (parts.next()?, parts.next(), parts.next(), parts.next()) {
        (n, None, None, None) => Some(Layout {
            partitions: n.parse().ok()?,
            process_partitions: PROCESS_PARTITIONS,
            layout: KeyLayout::Compact,
        }),
        ("spread", Some(n), Some(k), None) => Some(Layout {
            partitions: n.parse().ok()?,
            process_partitions: k
                .parse()
                .ok()
                .filter(|k| (1..=MAX_PROCESS_PARTITIONS).contains(k))?,
            layout: KeyLayout::Spread,
        }),
        _ => None,
    }
}

impl Keys {
    /// `pm_count` process-manager partitions: [`PROCESS_PARTITIONS`] in
    /// the compact layout (its routing is that of every deployment before
    /// layouts), up to 64 in the spread one.
    pub fn new(prefix: &str, partitions: u16, pm_count: u16, spread: bool) -> Self {
        let partitions = partitions.max(1);
        let pm_count = match spread {
            true => pm_count.clamp(1, MAX_PROCESS_PARTITIONS),
            false => PROCESS_PARTITIONS,
        };
        let base = prefix.to_owned();
        let pm_base = format!("{prefix}:pm");
        let mut keys = Keys {
            prefix: prefix.to_owned(),
            partitions,
            tags: (0..partitions)
                .map(|p| partition_tag(&base, p, partitions, spread))
                .collect(),
            pm_tags: match spread {
                true => (0..pm_count)
                    .map(|k| partition_tag(&pm_base, k, pm_count, true))
                    .collect(),
                false => vec![format!("{{{pm_base}}}")],
            },
            pm_count,
            // Spread: in the first band of the slot range, with the first
            // partitions (whose primary holds no more of them than any
            // other), so that the control keys' traffic does not fall on
            // a primary that holds one partition more than the others.
            control: match spread {
                true => partition_tag(&format!("{prefix}:ctl"), 0, pm_count.max(partitions), true),
                false => format!("{{{pm_base}}}"),
            },
            spread,
            slots: Vec::new(),
            heads: Vec::new(),
        };
        keys.heads = keys
            .tags
            .iter()
            .map(|tag| format!("{prefix}:{tag}"))
            .collect();
        keys.slots = (0..keys.streams()).map(|s| slot(&keys.queue(s))).collect();
        keys
    }

    /// What [`parse_layout`] reads back.
    pub fn layout_record(&self) -> String {
        match self.spread {
            true => format!("spread/{}/{}", self.partitions, self.pm_count),
            false => self.partitions.to_string(),
        }
    }

    /// How many process-manager partitions.
    pub fn pm_count(&self) -> u16 {
        self.pm_count
    }

    /// The hash slot of a stream's keys (computed once: reads on a
    /// cluster group their streams by slot on every receive).
    pub fn stream_slot(&self, stream: u16) -> u16 {
        self.slots[usize::from(stream)]
    }

    pub fn partitions(&self) -> u16 {
        self.partitions
    }

    /// Whether this is the spread layout: each process-manager partition
    /// in a slot of its own (else they share one).
    pub fn spread(&self) -> bool {
        self.spread
    }

    /// Work streams: one per saga partition, then the process-manager
    /// stream every reader reads (index `partitions`), then the
    /// [`PROCESS_PARTITIONS`] process-manager partitions, then (spread
    /// layout) each partition's shared stream.
    pub fn streams(&self) -> u16 {
        let shared = if self.spread { self.pm_count } else { 0 };
        self.partitions + 1 + self.pm_count + shared
    }

    /// The index of the process-manager stream every reader reads in the
    /// compact layout: where messages wait that no partition owner can
    /// handle (for a process manager it does not run), and those enqueued
    /// before partitions existed (it keeps its old name). The spread layout
    /// has one such stream per partition, in the partition's slot
    /// ([`shared_stream`](Self::shared_stream)), and reads this one only
    /// for what an older layout left there.
    pub fn process_stream(&self) -> u16 {
        self.partitions
    }

    /// The index of process-manager partition `k`.
    pub fn process_partition(&self, k: u16) -> u16 {
        self.partitions + 1 + k
    }

    /// The shared stream for messages of process-manager stream `stream`
    /// that its partition's owner cannot handle: the one stream every
    /// reader reads (compact), or its partition's own (spread), so that
    /// the commit that handles the message there stays in the slot of the
    /// instance.
    pub fn shared_stream(&self, stream: u16) -> u16 {
        match self.pm_partition_of(stream) {
            Some(k) if self.spread => self.partitions + 1 + self.pm_count + k,
            _ => self.process_stream(),
        }
    }

    /// The process-manager streams every reader reads (besides the
    /// partitions its engine owns).
    pub fn shared_streams(&self) -> Vec<u16> {
        match self.spread {
            true => (0..self.pm_count)
                .map(|k| self.partitions + 1 + self.pm_count + k)
                .collect(),
            false => vec![self.process_stream()],
        }
    }

    /// The partition `k` a process-manager stream belongs to (`None` for
    /// the compact layout's one shared stream).
    pub fn pm_partition_of(&self, stream: u16) -> Option<u16> {
        let k = stream.checked_sub(self.partitions + 1)?;
        match k < self.pm_count {
            true => Some(k),
            false if self.spread && k < 2 * self.pm_count => Some(k - self.pm_count),
            false => None,
        }
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
        self.process_partition(self.pm_k(process, target))
    }

    pub fn partition_of(&self, id: TaskId) -> u16 {
        let bytes = id.0.as_u128();
        (bytes % u128::from(self.partitions)) as u16
    }

    fn tag(&self, partition: u16) -> String {
        self.head(partition).to_owned()
    }

    fn head(&self, partition: u16) -> &str {
        &self.heads[usize::from(partition)]
    }

    /// What every key of a task of `partition` starts with:
    /// `<prefix>:task:<id>`, `<prefix>:lock:<id>`, ... A script that finds a
    /// task id in a message of the partition's stream builds the task's
    /// keys from it (they share the stream's slot).
    pub fn task_prefix(&self, partition: u16) -> String {
        self.tag(partition)
    }

    /// What the keys of process-manager stream `stream`'s partition start
    /// with (for scripts that build them from a message).
    pub fn process_prefix(&self, stream: u16) -> String {
        match self.pm_partition_of(stream) {
            Some(k) => self.pm_part(k),
            None => self.pm_tag(),
        }
    }

    /// Every key of task `id`, its id written out once (a write names
    /// six of them).
    pub fn of_task(&self, id: TaskId) -> TaskKeys {
        let mut buf = uuid::Uuid::encode_buffer();
        let id_text = id.0.hyphenated().encode_lower(&mut buf);
        let head = self.head(self.partition_of(id));
        let key = |kind: &str| joined(&[head, kind, id_text], ':');
        TaskKeys {
            task: key("task"),
            lock: key("lock"),
            fence: key("fence"),
            cancel: key("cancel"),
            audit: key("audit"),
            claims: key("claims"),
            id: id_text.to_owned(),
        }
    }

    fn task_key(&self, kind: &str, id: TaskId) -> String {
        let mut buf = uuid::Uuid::encode_buffer();
        let id_text = id.0.hyphenated().encode_lower(&mut buf);
        joined(&[self.head(self.partition_of(id)), kind, id_text], ':')
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
    /// capped ([`AUDIT_LOG_CAP`](crate::model::task::AUDIT_LOG_CAP)).
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
        let head = self.head(partition);
        match status {
            Some(status) => joined(&[head, "idx", saga, status.as_str()], ':'),
            None => joined(&[head, "idx", saga], ':'),
        }
    }

    /// A partition's finished tasks, by when their retention runs out.
    pub fn expiring(&self, partition: u16) -> String {
        joined(&[self.head(partition), "expiring"], ':')
    }

    /// A task's entry in [`expiring`](Self::expiring): enough to find its
    /// index entries once its record is gone.
    pub fn expiring_member(id: TaskId, status: TaskStatus, saga: &str) -> String {
        let mut buf = uuid::Uuid::encode_buffer();
        let id_text = id.0.hyphenated().encode_lower(&mut buf);
        joined(&[id_text, status.as_str(), saga], '|')
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
    /// stream; of process-manager partition `k`, `<pm tag>:<kind>:<k>`
    /// (compact) or `<tag of k>:<kind>` (spread), and of its shared stream
    /// `<tag of k>:shared:<kind>`.
    fn stream_key(&self, stream: u16, kind: &str) -> String {
        if stream < self.partitions {
            return joined(&[self.head(stream), kind], ':');
        }
        match self.pm_partition_of(stream) {
            None => format!("{}:{kind}", self.pm_tag()),
            Some(k) if !self.spread => format!("{}:{kind}:{k}", self.pm_tag()),
            Some(k) if stream == self.process_partition(k) => {
                format!("{}:{kind}", self.pm_part(k))
            }
            Some(k) => format!("{}:shared:{kind}", self.pm_part(k)),
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

    /// The control keys of process managers (partition members and owners,
    /// runners, named leases, the compact layout's shared stream) carry
    /// this one hash tag: `{<prefix>:pm}`, or in the spread layout
    /// `{<prefix>:ctl.<s>}`, placed in the first band of the slot range. In the compact layout every process-manager key
    /// does: instances, correlation entries, the queues, the schedule and
    /// the endpoint streams of all process managers live in one slot, so
    /// each commit (state, correlation entries, outbox, acknowledgement) is
    /// one script.
    fn pm_tag(&self) -> String {
        format!("{}:{}", self.prefix, self.control)
    }

    /// What the keys of process-manager partition `k` start with: its
    /// tag (spread), or the one tag of all of them (compact). An
    /// instance's keys are in the partition of its id, a correlation
    /// entry's in the partition of its value: a message routed by either
    /// finds them in its own slot.
    pub fn pm_part(&self, k: u16) -> String {
        match self.spread {
            true => format!("{}:{}", self.prefix, self.pm_tags[usize::from(k)]),
            false => self.pm_tag(),
        }
    }

    /// A key of partition `k` that is never written: what a script that
    /// touches no key of some kind names in its place (a cluster wants every
    /// key a script is given in one slot).
    pub fn pm_unused(&self, k: u16, kind: &str) -> String {
        format!("{}:unused:{kind}", self.pm_part(k))
    }

    /// The process-manager partition of `process`'s instance `id` (or of
    /// its correlation value `id`).
    pub fn pm_k(&self, process: &str, id: &str) -> u16 {
        (route_hash(&format!("{process}:{id}")) % u32::from(self.pm_count)) as u16
    }

    pub fn instance(&self, process: &str, id: &str) -> String {
        format!(
            "{}:inst:{process}:{id}",
            self.pm_part(self.pm_k(process, id))
        )
    }

    /// The ids of `process`'s instances in partition `k` (one set in the
    /// compact layout, whatever `k`).
    pub fn instances(&self, process: &str, k: u16) -> String {
        format!("{}:insts:{process}", self.pm_part(k))
    }

    pub fn correlation(&self, process: &str, field: &str, value: &str) -> String {
        let k = self.pm_k(process, value);
        format!("{}:idx:{process}:{field}:{value}", self.pm_part(k))
    }

    /// While a claim of a correlation entry from another slot than its
    /// instance's is in flight (spread layout), the claimant's id, for a
    /// moment: the entry is not stale, whatever its owner's record says.
    pub fn correlation_claim(&self, process: &str, field: &str, value: &str) -> String {
        let k = self.pm_k(process, value);
        format!("{}:idxclaim:{process}:{field}:{value}", self.pm_part(k))
    }

    /// The instances sharing a value of a field `#[handles(many)]`
    /// correlates by (a set of ids).
    pub fn shared_correlation(&self, process: &str, field: &str, value: &str) -> String {
        let k = self.pm_k(process, value);
        format!("{}:idxs:{process}:{field}:{value}", self.pm_part(k))
    }

    /// The ids, in the order held, of the messages held for `value` (of
    /// the state field `field`; `""`: an instance id), and `suffix` `:p`
    /// their payloads: in the partition of the value, with its entry.
    pub fn held(&self, process: &str, field: &str, value: &str, suffix: &str) -> String {
        let k = self.pm_k(process, value);
        format!("{}:held{suffix}:{process}:{field}:{value}", self.pm_part(k))
    }

    /// The message ids a deleted instance handled (a set that expires).
    pub fn tombstone(&self, process: &str, id: &str) -> String {
        format!(
            "{}:tomb:{process}:{id}",
            self.pm_part(self.pm_k(process, id))
        )
    }

    /// The same, under a correlation entry the deleted instance released.
    pub fn correlation_tombstone(&self, process: &str, field: &str, value: &str) -> String {
        let k = self.pm_k(process, value);
        format!("{}:idxtomb:{process}:{field}:{value}", self.pm_part(k))
    }

    /// A tally's keys: `part` is `` (a hash: total, done, late, the
    /// completion envelopes), `:pending` or `:checked` (sets of items).
    /// The instance id goes last: it is the one part that may hold `:`.
    /// In the partition of the instance that opened it.
    pub fn tally(&self, tally: &TallyRef, part: &str) -> String {
        format!(
            "{}:tally{part}:{}:{}:{}:{}",
            self.pm_part(self.pm_k(&tally.process, &tally.instance)),
            tally.process,
            tally.name,
            tally.generation,
            tally.instance
        )
    }

    /// Partition `k`'s tallies not yet complete, by when they expire: what
    /// housekeeping looks at to send a completion whose checker died
    /// between checking the last item and sending it.
    pub fn open_tallies(&self, k: u16) -> String {
        format!("{}:tallies", self.pm_part(k))
    }

    /// The process-manager partitions whose keys are apart (spread: each
    /// its own slot), or the one that stands for all (compact).
    pub fn pm_parts(&self) -> Vec<u16> {
        match self.spread {
            true => (0..self.pm_count).collect(),
            false => vec![0],
        }
    }

    /// Partition `k`'s timeouts, by due time.
    pub fn scheduled(&self, k: u16) -> String {
        format!("{}:scheduled", self.pm_part(k))
    }

    /// Partition `k`'s messages for endpoints in other slots (spread
    /// layout), as its commits leave them: relayed at once after each
    /// commit, and by housekeeping if the committing process died first.
    pub fn relays(&self, k: u16) -> String {
        format!("{}:relay", self.pm_part(k))
    }

    /// An endpoint's stream: in the one process-manager slot (compact), or
    /// in a slot of its own (spread), where commits relay to it.
    pub fn endpoint(&self, name: &str) -> String {
        match self.spread {
            true => format!("{}:{{{}:endpoint:{name}}}", self.prefix, self.prefix),
            false => format!("{}:endpoint:{name}", self.pm_tag()),
        }
    }

    /// An endpoint's dead letters.
    pub fn endpoint_dead(&self, name: &str) -> String {
        format!("{}:dead", self.endpoint(name))
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

    /// One part (`holders`, `line`, ...) of the state of flow-control
    /// limit `name` for `key`: every part under one hash tag of its own
    /// (`<prefix>:{<prefix>:limit:<id>}:<part>`, see [`limit_id`]), so that
    /// each call is one script in one slot, and the limits and their keys
    /// spread over the slots of a cluster.
    pub fn limit(&self, name: &str, key: Option<&str>, part: &str) -> String {
        format!(
            "{}:{{{}:limit:{}}}:{part}",
            self.prefix,
            self.prefix,
            limit_id(name, key)
        )
    }

    /// The deployment's layout (its partition count), recorded by the first
    /// backend to connect.
    pub fn layout(&self) -> String {
        format!("{}:layout", self.prefix)
    }

    /// Which record layout the deployment writes (see `record.rs`):
    /// absent for layout 1, `2` once its steps are kept apart.
    pub fn record_layout(&self) -> String {
        format!("{}:records", self.prefix)
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

/// The most process-manager partitions a deployment may have (an engine's
/// share of them is a 64-bit mask).
pub const MAX_PROCESS_PARTITIONS: u16 = 64;

/// How a limit's `(name, key)` is written in its keys: as it is when both
/// are short and plain (`psp`, `psp=42`), else `#` and the SHA-256 of an
/// unambiguous encoding. A key's value is user data: its keys stay short
/// whatever it holds, never hold a brace (which would move the hash tag),
/// and stay apart: `=` and `#` are not plain, so `("a=b", None)`,
/// `("a", Some("b"))` and a hashed id never meet.
pub fn limit_id(name: &str, key: Option<&str>) -> String {
    const PLAIN_MAX: usize = 64;
    let plain = |s: &str| {
        s.len() <= PLAIN_MAX
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    };
    match key {
        None if plain(name) => return name.to_owned(),
        Some(key) if plain(name) && plain(key) => return format!("{name}={key}"),
        _ => {}
    }
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(format!("{}:{name}", name.len()));
    if let Some(key) = key {
        hash.update(format!("={key}"));
    }
    let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("#{hex}")
}

/// The routing hash of process-manager messages, computed alike here and
/// in scripts (`lua/lib/route.lua`): a polynomial hash modulo a prime below
/// 2^31, which Lua's doubles compute exactly.
pub fn route_hash(text: &str) -> u32 {
    text.bytes()
        .fold(0u64, |h, b| (h * 31 + u64::from(b)) % 2_147_483_647) as u32
}

#[cfg(test)]
mod tests;
