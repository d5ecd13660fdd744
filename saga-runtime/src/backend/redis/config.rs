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
    /// they are what spreads the work over the shards (see the README,
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
    /// Each endpoint stream (`ctx.send`) keeps about this many messages
    /// (default 100,000); older ones are trimmed.
    pub endpoint_max_len: usize,
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
        }
    }
}
