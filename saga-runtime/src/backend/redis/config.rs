//! What a [`RedisBackend`](super::RedisBackend) is told: the key prefix,
//! partitions and their layout, the consumer group, timeouts and caps.

use std::time::Duration;

#[allow(unused_imports)] // doc links
use super::RedisBackend;
#[allow(unused_imports)] // doc links
use crate::backend::BackendError;

/// Settings of a [`RedisBackend`].
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// Prefix of every key (default `saga`): lets several applications share
    /// one Redis.
    pub prefix: String,
    /// Number of saga partitions: a task's keys and its messages live in one
    /// partition, chosen from its id, and each partition is one hash slot.
    /// `None` (the default) is 1 on a single server or Sentinel, where
    /// more buy nothing, and [`CLUSTER_PARTITIONS`] on a cluster, where
    /// they are what spreads the work over the shards (see `guide/03-stores.md`,
    /// "Redis Cluster", for how to choose). Fixed for the life of a
    /// deployment's data: connecting with another count than the one
    /// recorded under `prefix` fails with [`BackendError::Misconfigured`].
    pub partitions: Option<u16>,
    /// Where the partitions' hash tags put them: see [`KeyLayout`]
    /// (default [`KeyLayout::Auto`]). Recorded with the partition count.
    pub layout: KeyLayout,
    /// Number of process-manager partitions in the spread layout: `None`
    /// (the default) is [`CLUSTER_PARTITIONS`] (24), at most
    /// [`MAX_PROCESS_PARTITIONS`] (64): each engine that runs process
    /// managers owns a share of them. The compact layout has
    /// [`PROCESS_PARTITIONS`] (16), always.
    /// Recorded with the partition count.
    pub process_partitions: Option<u16>,
    /// Consumer group name (default `workers`).
    pub group: String,
    /// A message pending longer than this is redelivered to another worker
    /// (default 15 s). Running steps keep their message alive, so this
    /// bounds how long a dead worker's message waits; task leases default to
    /// it too.
    pub visibility_timeout: Duration,
    /// How long one blocking read waits (default 1 s).
    pub block: Duration,
    /// Response timeout of ordinary commands (default 5 s).
    pub response_timeout: Duration,
    /// Dead-lettered payloads keep at most this many bytes (default
    /// 256 KiB): a flood of huge garbage must not fill the server.
    pub dead_letter_payload_limit: usize,
    /// Each endpoint stream (`ctx.send`) keeps at most this many messages
    /// (default 100,000): while a consumer group reads it, a write that
    /// would go past it is refused (the writer waits); while none does,
    /// the oldest are trimmed.
    pub endpoint_max_len: usize,
    /// When a write counts as done: see [`Durability`] (default
    /// [`Durability::Primary`], acknowledged by the primary alone).
    pub durability: Durability,
    /// Connect even though the server's `maxmemory-policy` evicts keys
    /// (default `false`: connecting fails with
    /// [`BackendError::Misconfigured`]). An evicting server deletes task
    /// records, messages and leases silently when it runs out of memory,
    /// and `volatile-*` policies are no safer: the engine sets expiries on
    /// the keys of finished tasks and on leases, so live keys carry
    /// expiries too. Set it only for a server whose memory cannot run out
    /// (or for a throwaway one).
    pub allow_eviction: bool,
}

/// When a write (a task's start, a step's outcome, a cancellation, a
/// process manager's commit, a message moved to another shard) counts as
/// done, and so what a failover or a crash of the server can still lose.
/// See the guide (`guide/03-stores.md`, "Durability") for each level's cost.
///
/// A write that does not reach the level within its timeout fails with a
/// transient [`BackendError::Unavailable`] saying so; it is not undone (it
/// was applied on the primary, and Redis cannot roll it back). The engine
/// treats it as a write whose reply was lost: every write is fenced and
/// versioned, so the retry is refused, found to have landed and not
/// applied twice; while the level cannot be reached (every replica down)
/// the engine makes no progress, and resumes when it can.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Durability {
    /// Done when the primary applied it (Redis' own behaviour). A failover
    /// loses what the replicas had not copied yet (usually milliseconds of
    /// writes); a crash of a server without `appendfsync always` loses
    /// what was not fsynced.
    #[default]
    Primary,
    /// Done when `replicas` replicas (of the primary that took it) hold it:
    /// `WAIT replicas timeout` after it. A failover to one of those
    /// replicas loses nothing acknowledged; a power loss of every server
    /// at once can, since replicas acknowledge from memory.
    Replicated {
        /// How many replicas must acknowledge (at least 1).
        replicas: u32,
        /// How long to wait for them; then the write fails as above.
        timeout: Duration,
    },
    /// Done when the primary's append-only file holds it on disk, and the
    /// append-only files of `replicas` replicas too: `WAITAOF 1 replicas
    /// timeout` after it. Needs Redis 7.2 or later and `appendonly yes`
    /// on the primary (and on the replicas counted); connecting fails
    /// otherwise.
    Fsynced {
        /// How many replicas must have it on disk too (0: the primary's
        /// disk alone).
        replicas: u32,
        /// How long to wait; then the write fails as above.
        timeout: Duration,
    },
}

impl Durability {
    /// The command that waits for the level after a write, if any.
    pub(super) fn wait_cmd(&self) -> Option<redis::Cmd> {
        match *self {
            Durability::Primary => None,
            Durability::Replicated { replicas, timeout } => {
                let mut cmd = redis::cmd("WAIT");
                cmd.arg(replicas).arg(super::ms(timeout));
                Some(cmd)
            }
            Durability::Fsynced { replicas, timeout } => {
                let mut cmd = redis::cmd("WAITAOF");
                cmd.arg(1).arg(replicas).arg(super::ms(timeout));
                Some(cmd)
            }
        }
    }

    /// How long a write may wait for the level.
    pub(super) fn timeout(&self) -> Duration {
        match *self {
            Durability::Primary => Duration::ZERO,
            Durability::Replicated { timeout, .. } | Durability::Fsynced { timeout, .. } => timeout,
        }
    }
}

/// The saga partitions of a deployment on Redis Cluster unless
/// [`RedisConfig::partitions`] says otherwise, and its process-manager
/// partitions unless [`RedisConfig::process_partitions`] does: 24 divide
/// evenly among 2, 3, 4, 6, 8 or 12 primaries (16 would leave one of 3
/// with 6 of them, 37.5% of the work), and few enough that an idle
/// worker's round of reads stays short.
pub const CLUSTER_PARTITIONS: u16 = 24;

#[allow(unused_imports)] // doc links
use super::keys::{MAX_PROCESS_PARTITIONS, PROCESS_PARTITIONS};

/// Where the keys of each partition live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KeyLayout {
    /// [`Spread`](Self::Spread) on a cluster, [`Compact`](Self::Compact)
    /// otherwise.
    #[default]
    Auto,
    /// Partition `p`'s hash tag is `{<prefix>:<p>}`, and every
    /// process-manager key shares one tag: the layout of a single server.
    Compact,
    /// Each partition's hash tag is chosen so that the partitions' slots
    /// are spread evenly over the slot range: whatever contiguous ranges a
    /// cluster's primaries serve (`redis-cli --cluster create` gives each
    /// an equal one), each holds an equal share of the partitions, within
    /// one.
    Spread,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            prefix: "saga".to_owned(),
            partitions: None,
            layout: KeyLayout::Auto,
            process_partitions: None,
            group: "workers".to_owned(),
            visibility_timeout: Duration::from_secs(15),
            block: Duration::from_secs(1),
            response_timeout: Duration::from_secs(5),
            dead_letter_payload_limit: crate::backend::memory::DEFAULT_DEAD_LETTER_PAYLOAD_LIMIT,
            endpoint_max_len: 100_000,
            durability: Durability::Primary,
            allow_eviction: false,
        }
    }
}
