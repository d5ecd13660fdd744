//! The Redis backend: durable tasks, leases with fencing, attempt claims,
//! a work queue on Streams consumer groups, delayed messages, a dead-letter
//! stream, and retention.
//!
//! - Task records are hashes `{doc, version, status}`; every write is a
//!   script that checks the fencing token and the version first. The audit
//!   log is a list of its own (capped): a write appends its new entries and
//!   never resends the history.
//! - A read takes up to the worker's free slots of messages in one script
//!   and, for each saga message, the task's lease and record with it; a
//!   worker that goes on with a task records the last outcome and the next
//!   attempt in one script. A 3-step chain costs 1.7 round trips per step.
//! - The lease is `SET NX PX` with a random token; each acquisition
//!   increments a per-task fence counter, and a write must carry the latest
//!   fence. Release and extension compare the token (compare-and-delete).
//! - Messages live on a stream per partition, read through a consumer group.
//!   A message stays pending until a script settles it; one left pending
//!   longer than the visibility timeout (its worker died) is taken over, and
//!   its delivery count (kept by Redis, carried across hand-backs) lets the
//!   engine dead-letter a poison message.
//! - Entries are read as raw values and decoded one by one: an entry a
//!   buggy producer wrote (a field name that is not UTF-8, no payload) is
//!   delivered as undecodable and dead-lettered alone.
//! - A consumer group lost with the data (a restart without persistence, a
//!   failover) is recreated on the first `NOGROUP`, on any path.
//! - Retry backoffs are a sorted set per partition moved onto the queue by
//!   the engine's timer poller.
//! - Finished tasks expire (`PEXPIRE` on every key at the terminal commit);
//!   the janitor removes their index entries, trims dead letters and removes
//!   consumers of workers that left.
//!
//! - The commit that ends a task publishes its id, so `wait` returns at
//!   once (polling stays as the fallback).
//!
//! Files: `keys` (layout), `scripts` (Lua), `entry` (decoding stream
//! entries), then one file per concern: `tasks`, `queue`, `process`,
//! `housekeeping`, `finished` (end-of-task notifications).

mod breakers;
mod endpoint;
mod entry;
mod finished;
mod housekeeping;
mod keys;
mod partitions;
mod primary;
mod process;
mod queue;
mod scripts;
mod tally;
mod tasks;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManagerConfig, MultiplexedConnection};
use redis::{Client, FromRedisValue, RedisError};
use tokio::time::Instant;

use super::{BackendError, Delivery};
use keys::Keys;

/// Settings of a [`RedisBackend`].
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// Prefix of every key (default `saga`): lets several applications share
    /// one Redis.
    pub prefix: String,
    /// Number of partitions (default 1). Each partition is one hash slot on
    /// Redis Cluster. Fixed for the life of a deployment's data: connecting
    /// with another count than the one recorded under `prefix` fails with
    /// [`BackendError::Misconfigured`].
    pub partitions: u16,
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

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            prefix: "saga".to_owned(),
            partitions: 1,
            group: "workers".to_owned(),
            visibility_timeout: Duration::from_secs(15),
            block: Duration::from_secs(1),
            response_timeout: Duration::from_secs(5),
            dead_letter_payload_limit: super::memory::DEFAULT_DEAD_LETTER_PAYLOAD_LIMIT,
            endpoint_max_len: 100_000,
        }
    }
}

/// The Redis backend. Cheap to clone.
#[derive(Clone)]
pub struct RedisBackend {
    shared: Arc<Shared>,
}

struct Shared {
    primary: Arc<primary::Primary>,
    keys: Keys,
    config: RedisConfig,
    readers: Mutex<HashMap<String, Reader>>,
    /// The dead-letter cap the janitor was last given, for scripts that add
    /// dead letters between its runs.
    dead_letters_max: std::sync::atomic::AtomicUsize,
    finished: Arc<finished::Finished>,
}

/// The blocking-read state of one consumer.
#[derive(Default)]
struct Reader {
    conn: Option<MultiplexedConnection>,
    last_claim: Option<Instant>,
    /// The stream the next read looks at first: reads go round the
    /// streams so that none is starved by a busy one.
    next_stream: u16,
    /// A read failed: a message may have been given to this consumer with
    /// the reply lost. The next read looks at its own pending messages
    /// first, rather than leave them for a visibility timeout.
    recover: bool,
}

fn manager_config(config: &RedisConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(config.response_timeout))
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_secs(1))
}

/// A Redis error as a backend error: transient when the connection failed
/// or the server asks to wait (loading, busy, failing over), a refusal
/// otherwise (a script error: the same call would fail again).
fn unavailable(e: RedisError) -> BackendError {
    use redis::RetryMethod;
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || !matches!(e.retry_method(), RetryMethod::NoRetry)
        || matches!(
            e.code(),
            Some(
                "BUSY"
                    | "OOM"
                    | "LOADING"
                    | "MASTERDOWN"
                    | "TRYAGAIN"
                    | "CLUSTERDOWN"
                    | "READONLY"
                    | "NOREPLICAS"
                    | "NOGROUP"
            )
        );
    match transient {
        true => BackendError::Unavailable(Arc::new(e)),
        false => BackendError::Rejected(Arc::new(e)),
    }
}

fn corrupt(what: impl std::fmt::Display) -> BackendError {
    BackendError::Corrupt(what.to_string())
}

/// A duration for Redis, in milliseconds: at least 1, and at most about
/// 31 years (Redis refuses expiry times past its range).
fn ms(d: Duration) -> u64 {
    d.as_millis().clamp(1, 1_000_000_000_000) as u64
}

/// The largest `MAXLEN` Redis accepts (a signed 64-bit integer).
const MAXLEN_LIMIT: u64 = i64::MAX as u64;

impl RedisBackend {
    /// Connects with the default [`RedisConfig`].
    pub async fn connect(url: &str) -> Result<Self, BackendError> {
        RedisBackend::connect_with(url, RedisConfig::default()).await
    }

    /// Connects with `config`.
    pub async fn connect_with(url: &str, config: RedisConfig) -> Result<Self, BackendError> {
        let backend = RedisBackend::open(url, config).await?;
        backend.check_layout().await?;
        backend.ensure_groups().await?;
        Ok(backend)
    }

    /// Connects to the deployment already under `config.prefix`, as an
    /// operator's tool does: it takes the partition count the deployment
    /// recorded (`config.partitions` is ignored) and writes nothing on
    /// connecting, so it can neither fix the layout of a deployment that
    /// has not started yet nor leave keys under a mistyped prefix. Fails
    /// with [`BackendError::Misconfigured`] when nothing was recorded
    /// there.
    pub async fn attach(url: &str, mut config: RedisConfig) -> Result<Self, BackendError> {
        let probe = RedisBackend::open(url, config.clone()).await?;
        let recorded: Option<u16> = redis::cmd("GET")
            .arg(probe.keys().layout())
            .query_async(&mut probe.conn())
            .await
            .map_err(unavailable)?;
        let Some(partitions) = recorded else {
            return Err(BackendError::Misconfigured(format!(
                "no deployment under prefix `{}` on this Redis (no layout recorded): \
                 check the URL and the prefix",
                config.prefix
            )));
        };
        config.partitions = partitions;
        RedisBackend::open(url, config).await
    }

    /// Connects through Redis Sentinel to the primary of `service` (the
    /// name the sentinels monitor it under), given the addresses of some of
    /// the sentinels (`redis://127.0.0.1:26379`). After a failover the
    /// backend follows the new primary: a command that fails because the
    /// primary went away or became a replica makes it ask the sentinels
    /// again, and the engine retries the command as after any transient
    /// error. What a failover can lose is in the README ("Sentinel").
    pub async fn connect_sentinel(
        sentinels: &[&str],
        service: &str,
        config: RedisConfig,
    ) -> Result<Self, BackendError> {
        let sentinel = redis::sentinel::SentinelClient::build(
            sentinels.to_vec(),
            service.to_owned(),
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(unavailable)?;
        let clients = sentinels
            .iter()
            .map(|url| Client::open(*url))
            .collect::<Result<Vec<_>, _>>()
            .map_err(unavailable)?;
        let primary = primary::Primary::sentinel(
            sentinel,
            clients,
            service.to_owned(),
            manager_config(&config),
        )
        .await
        .map_err(unavailable)?;
        let backend = RedisBackend::with_primary(primary, config);
        backend.check_layout().await?;
        backend.ensure_groups().await?;
        Ok(backend)
    }

    /// A connection, with no check and no write.
    async fn open(url: &str, config: RedisConfig) -> Result<Self, BackendError> {
        let client = Client::open(url).map_err(unavailable)?;
        let primary = primary::Primary::fixed(client, manager_config(&config))
            .await
            .map_err(unavailable)?;
        Ok(RedisBackend::with_primary(primary, config))
    }

    fn with_primary(primary: Arc<primary::Primary>, config: RedisConfig) -> Self {
        RedisBackend {
            shared: Arc::new(Shared {
                primary,
                keys: Keys::new(&config.prefix, config.partitions),
                config,
                readers: Mutex::new(HashMap::new()),
                dead_letters_max: std::sync::atomic::AtomicUsize::new(100_000),
                finished: finished::Finished::new(),
            }),
        }
    }

    /// Refuses a partition count other than the one the deployment's data
    /// was written with: a task's keys are found by its id modulo the
    /// count, so a different count would not find the tasks in flight (nor
    /// their queues). The first backend to connect records it.
    async fn check_layout(&self) -> Result<(), BackendError> {
        let partitions = self.keys().partitions();
        let key = self.keys().layout();
        let (_, stored): (Option<String>, String) = redis::pipe()
            .cmd("SET")
            .arg(&key)
            .arg(partitions)
            .arg("NX")
            .cmd("GET")
            .arg(&key)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if stored == partitions.to_string() {
            return Ok(());
        }
        Err(BackendError::Misconfigured(format!(
            "`RedisConfig::partitions` is {partitions}, but the data under prefix `{}` was written \
             with {stored} partitions: tasks would not be found where they are. Use {stored}, or \
             start the new layout under another `prefix` and let the old deployment drain",
            self.shared.config.prefix
        )))
    }

    /// The configuration in use.
    pub fn config(&self) -> &RedisConfig {
        &self.shared.config
    }

    fn conn(&self) -> primary::Conn {
        self.shared.primary.conn()
    }

    /// A client for the current primary, for a connection of its own.
    fn client(&self) -> Client {
        self.shared.primary.client()
    }

    fn keys(&self) -> &Keys {
        &self.shared.keys
    }

    fn group(&self) -> &str {
        &self.shared.config.group
    }

    /// The hard ceiling of a dead-letter stream between two housekeeping
    /// passes: ten times the cap housekeeping trims to (precisely, and
    /// sparing the letters of parked tasks). Clamped to what `MAXLEN`
    /// accepts: a cap meant as "no limit" (`usize::MAX`) must not make
    /// Redis refuse the write that parks a message.
    fn dead_letters_ceiling(&self) -> u64 {
        let cap = self
            .shared
            .dead_letters_max
            .load(std::sync::atomic::Ordering::Relaxed)
            .saturating_mul(10);
        u64::try_from(cap).map_or(MAXLEN_LIMIT, |cap| cap.min(MAXLEN_LIMIT))
    }

    /// Creates the consumer group of every queue (idempotent). Reading from
    /// `0` rather than `$` keeps messages enqueued before any worker started
    /// (and, after a restart that lost the group, those enqueued since).
    async fn ensure_groups(&self) -> Result<(), BackendError> {
        let mut conn = self.conn();
        for p in 0..self.keys().streams() {
            let result: Result<(), RedisError> = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(self.keys().queue(p))
                .arg(self.group())
                .arg("0")
                .arg("MKSTREAM")
                .query_async(&mut conn)
                .await;
            match result {
                Ok(()) => {}
                Err(e) if e.code() == Some("BUSYGROUP") => {}
                Err(e) => return Err(unavailable(e)),
            }
        }
        Ok(())
    }

    /// Runs a script; on `NOGROUP` (the server lost the consumer groups)
    /// recreates them and runs it once more.
    async fn run<T: FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, BackendError> {
        match invocation.invoke_async(&mut self.conn()).await {
            Err(e) if e.code() == Some("NOGROUP") => {
                tracing::warn!("the server lost the consumer groups; recreating them");
                self.ensure_groups().await?;
                invocation
                    .invoke_async(&mut self.conn())
                    .await
                    .map_err(unavailable)
            }
            other => other.map_err(unavailable),
        }
    }

    fn reader<T>(&self, consumer: &str, f: impl FnOnce(&mut Reader) -> T) -> T {
        let mut readers = self
            .shared
            .readers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        f(readers.entry(consumer.to_owned()).or_default())
    }

    /// The process-manager stream and entry id of a delivery.
    fn process_entry_of(&self, delivery: &Delivery) -> Result<(u16, String), BackendError> {
        match self.keys().split_id(&delivery.id) {
            Some((p, entry)) if self.keys().is_process(p) => Ok((p, entry.to_owned())),
            _ => Err(corrupt(format!(
                "delivery {} is not a process-manager message",
                delivery.id
            ))),
        }
    }

    /// The stream entry id of a delivery, checked to be in stream `p`.
    fn entry_of(&self, delivery: &Delivery, p: u16) -> Result<String, BackendError> {
        match self.keys().split_id(&delivery.id) {
            Some((dp, entry)) if dp == p => Ok(entry.to_owned()),
            _ => Err(corrupt(format!(
                "delivery {} is not in partition {p}",
                delivery.id
            ))),
        }
    }

    /// A delivery's stream and entry id.
    fn locate(&self, delivery: &Delivery) -> Result<(u16, String), BackendError> {
        self.keys()
            .split_id(&delivery.id)
            .map(|(p, e)| (p, e.to_owned()))
            .ok_or_else(|| corrupt(format!("bad delivery id {}", delivery.id)))
    }
}
