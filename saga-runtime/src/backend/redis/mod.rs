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
//! - On a Redis Cluster every script touches one slot: each partition is a
//!   slot of its own (the spread layout), a worker reads one slot per call
//!   and waits for watchers' wake-ups, and a process-manager message meets
//!   its instance in the instance's slot (it is forwarded there first when
//!   it was routed elsewhere).
//!
//! Files:
//!
//! - one per trait of the seam, as in `backend/`: `tasks`, `queue` (with
//!   `read`, how workers read), `dead_letters`, `housekeeping`, `process`
//!   (with `process_commit`), `tally`, `endpoint`, `leases`, `breakers`,
//!   `limits`, `partitions`, `runners`;
//! - `config` ([`RedisConfig`]), `server` (where commands go: a server,
//!   Sentinel, a cluster) and `primary` (Sentinel's primary), `keys`
//!   (the layout), `entry` (decoding stream entries), `watch` (idle
//!   readers' wake-ups on a cluster), `finished` (end-of-task
//!   notifications), `record` (the task record's layouts and which one a
//!   deployment writes), `cancel` (cancellation requests and their
//!   announcements), `durability` (what the server is asked at connect,
//!   and the wait after a write), `names` (which sagas have tasks, for an
//!   operator's misspelt name);
//! - `lua/` (the scripts, one file each, with a KEYS/ARGV header; shared
//!   fragments in `lua/lib/` as local functions) and `scripts/` (one typed
//!   call per script, the refusal codes in one table, and tests of every
//!   script against a real redis-server).

mod breakers;
mod cancel;
mod config;
mod dead_letters;
mod durability;
mod endpoint;
mod entry;
mod finished;
mod housekeeping;
mod keys;
mod leases;
mod limits;
mod names;
mod partitions;
mod primary;
mod process;
mod process_commit;
mod queue;
mod read;
mod record;
mod runners;
mod scripts;
mod server;
mod tally;
mod tasks;
mod watch;
mod write;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::{Client, FromRedisValue, RedisError, Value};
use tokio::time::Instant;

use super::{BackendError, Delivery};
use crate::util::Unpoisoned;
use keys::Keys;

pub use config::{Durability, KeyLayout, RedisConfig, CLUSTER_PARTITIONS};
pub use keys::{MAX_PROCESS_PARTITIONS, PROCESS_PARTITIONS};

/// The Redis backend. Cheap to clone.
#[derive(Clone)]
pub struct RedisBackend {
    shared: Arc<Shared>,
}

struct Shared {
    server: server::Server,
    /// `RedisConfig::process_partitions` as given (checked on connecting).
    asked_process_partitions: Option<u16>,
    keys: Keys,
    config: RedisConfig,
    readers: Mutex<HashMap<String, Reader>>,
    /// The dead-letter cap the janitor was last given, for scripts that add
    /// dead letters between its runs.
    dead_letters_max: std::sync::atomic::AtomicUsize,
    finished: Arc<finished::Finished>,
    /// Idle readers' wake-ups on a cluster (see `watch`).
    watch: watch::Watch,
    /// The connections durable writes wait on (see `durability`).
    durable: durability::Pool,
    /// Which record layout new writes use (see `record`).
    records: record::Mode,
}

/// The blocking-read state of one consumer.
#[derive(Default)]
struct Reader {
    conn: Option<server::Conn>,
    last_claim: Option<Instant>,
    /// The stream the next read looks at first: reads go round the
    /// streams so that none is starved by a busy one.
    next_stream: u16,
    /// The same on a cluster, where a read looks at one slot group.
    next_group: usize,
    /// On a cluster: the last round of reads found nothing. The next one
    /// marks the watchers first (see `receive_sharded`); a busy worker
    /// does not pay for that.
    idle: bool,
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
                    | "MOVED"
                    | "ASK"
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

/// What a URL names: a server, a cluster or a Sentinel deployment.
#[derive(Debug, PartialEq)]
enum Target {
    Single(String),
    /// `redis+cluster://host:port,host:port`: some of a cluster's nodes.
    Cluster(Vec<String>),
    /// `redis+sentinel://host:port,host:port/<service>`.
    Sentinel {
        sentinels: Vec<String>,
        service: String,
    },
}

impl Target {
    fn parse(url: &str) -> Result<Self, BackendError> {
        let hosts = |rest: &str| -> Vec<String> {
            rest.split(',')
                .filter(|h| !h.is_empty())
                .map(|h| format!("redis://{h}"))
                .collect()
        };
        let bad = |why: &str| {
            BackendError::Misconfigured(format!(
                "bad Redis URL `{}`: {why}; write `redis://host:port`, \
                 `redis+cluster://host:port,host:port` or \
                 `redis+sentinel://host:port,host:port/<service>`",
                crate::backend::redacted(url)
            ))
        };
        if let Some(rest) = url.strip_prefix("redis+cluster://") {
            let nodes = hosts(rest.trim_end_matches('/'));
            if nodes.is_empty() {
                return Err(bad("no node named"));
            }
            return Ok(Target::Cluster(nodes));
        }
        if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            let (list, service) = rest
                .split_once('/')
                .ok_or_else(|| bad("no service name after the sentinels"))?;
            let sentinels = hosts(list);
            if sentinels.is_empty() || service.is_empty() {
                return Err(bad("no sentinel or no service named"));
            }
            return Ok(Target::Sentinel {
                sentinels,
                service: service.to_owned(),
            });
        }
        Ok(Target::Single(url.to_owned()))
    }
}

impl RedisBackend {
    /// Connects with the default [`RedisConfig`]. `url` is a server's
    /// (`redis://host:port`), a cluster's (`redis+cluster://host:port,..`,
    /// some of its nodes) or a Sentinel deployment's
    /// (`redis+sentinel://host:port,../<service>`).
    pub async fn connect(url: &str) -> Result<Self, BackendError> {
        RedisBackend::connect_with(url, RedisConfig::default()).await
    }

    /// Connects with `config` (`url` as for [`connect`](Self::connect)).
    pub async fn connect_with(url: &str, config: RedisConfig) -> Result<Self, BackendError> {
        let backend = RedisBackend::open(url, config).await?;
        backend.check_server().await?;
        backend.check_layout().await?;
        backend.ensure_groups().await?;
        Ok(backend)
    }

    /// Connects to a Redis Cluster through some of its nodes
    /// (`redis://host:port` each). Every script touches one hash slot, and
    /// the partitions' slots are spread over the slot range (see
    /// [`KeyLayout::Spread`]), so the work of one saga spreads over the
    /// shards; redirects (resharding) and failovers are followed. What a
    /// failover can lose is in the guide (`guide/03-stores.md`, "Redis Cluster").
    pub async fn connect_cluster(
        nodes: &[&str],
        config: RedisConfig,
    ) -> Result<Self, BackendError> {
        let server = RedisBackend::cluster_server(nodes, &config).await?;
        let backend = RedisBackend::with_server(server, config);
        backend.check_server().await?;
        backend.check_layout().await?;
        backend.ensure_groups().await?;
        Ok(backend)
    }

    async fn cluster_server(
        nodes: &[&str],
        config: &RedisConfig,
    ) -> Result<server::Server, BackendError> {
        if nodes.is_empty() {
            return Err(BackendError::Misconfigured(
                "no cluster node named: give at least one `redis://host:port`".to_owned(),
            ));
        }
        let cluster = server::Cluster::connect(
            nodes,
            config.response_timeout,
            config.block + Duration::from_secs(5),
        )
        .await
        .map_err(unavailable)?;
        Ok(server::Server::Cluster(cluster))
    }

    /// Connects to the deployment already under `config.prefix`, as an
    /// operator's tool does: it takes the partition count and layout the
    /// deployment recorded (`config.partitions` and `config.layout` are
    /// ignored) and writes nothing on connecting, so it can neither fix the
    /// layout of a deployment that has not started yet nor leave keys under
    /// a mistyped prefix. Fails with [`BackendError::Misconfigured`] when
    /// nothing was recorded there.
    pub async fn attach(url: &str, mut config: RedisConfig) -> Result<Self, BackendError> {
        let probe = RedisBackend::open(url, config.clone()).await?;
        let recorded: Option<String> = redis::cmd("GET")
            .arg(probe.keys().layout())
            .query_async(&mut probe.conn())
            .await
            .map_err(unavailable)?;
        let Some(recorded) = recorded.as_deref().and_then(keys::parse_layout) else {
            return Err(BackendError::Misconfigured(format!(
                "no deployment under prefix `{}` on this Redis (no layout recorded): \
                 check the URL and the prefix",
                config.prefix
            )));
        };
        config.partitions = Some(recorded.partitions);
        config.process_partitions = Some(recorded.process_partitions);
        config.layout = recorded.layout;
        Ok(RedisBackend::with_server(
            probe.shared.server.clone(),
            config,
        ))
    }

    /// Connects through Redis Sentinel to the primary of `service` (the
    /// name the sentinels monitor it under), given the addresses of some of
    /// the sentinels (`redis://127.0.0.1:26379`). After a failover the
    /// backend follows the new primary: a command that fails because the
    /// primary went away or became a replica makes it ask the sentinels
    /// again, and the engine retries the command as after any transient
    /// error. What a failover can lose is in the guide (`guide/03-stores.md`, "Sentinel").
    pub async fn connect_sentinel(
        sentinels: &[&str],
        service: &str,
        config: RedisConfig,
    ) -> Result<Self, BackendError> {
        let server = RedisBackend::sentinel_server(sentinels, service, &config).await?;
        let backend = RedisBackend::with_server(server, config);
        backend.check_server().await?;
        backend.check_layout().await?;
        backend.ensure_groups().await?;
        Ok(backend)
    }

    async fn sentinel_server(
        sentinels: &[&str],
        service: &str,
        config: &RedisConfig,
    ) -> Result<server::Server, BackendError> {
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
            manager_config(config),
        )
        .await
        .map_err(unavailable)?;
        Ok(server::Server::single(primary))
    }

    /// A connection, with no check and no write.
    async fn open(url: &str, config: RedisConfig) -> Result<Self, BackendError> {
        let server = match Target::parse(url)? {
            Target::Single(url) => {
                let client = Client::open(url).map_err(unavailable)?;
                let primary = primary::Primary::fixed(client, manager_config(&config))
                    .await
                    .map_err(unavailable)?;
                server::Server::single(primary)
            }
            Target::Cluster(nodes) => {
                let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
                RedisBackend::cluster_server(&nodes, &config).await?
            }
            Target::Sentinel { sentinels, service } => {
                let sentinels: Vec<&str> = sentinels.iter().map(String::as_str).collect();
                RedisBackend::sentinel_server(&sentinels, &service, &config).await?
            }
        };
        Ok(RedisBackend::with_server(server, config))
    }

    fn with_server(server: server::Server, mut config: RedisConfig) -> Self {
        let cluster = server.is_cluster();
        let partitions = config.partitions.unwrap_or(match cluster {
            true => CLUSTER_PARTITIONS,
            false => 1,
        });
        let layout = match config.layout {
            KeyLayout::Auto if cluster => KeyLayout::Spread,
            KeyLayout::Auto => KeyLayout::Compact,
            chosen => chosen,
        };
        let spread = layout == KeyLayout::Spread;
        let pm_count = match spread {
            true => config.process_partitions.unwrap_or(CLUSTER_PARTITIONS),
            false => PROCESS_PARTITIONS,
        };
        config.partitions = Some(partitions);
        config.layout = layout;
        let asked = config.process_partitions;
        config.process_partitions = Some(pm_count);
        let keys = Keys::new(&config.prefix, partitions, pm_count, spread);
        RedisBackend {
            shared: Arc::new(Shared {
                server,
                asked_process_partitions: asked,
                keys,
                config,
                readers: Mutex::new(HashMap::new()),
                dead_letters_max: std::sync::atomic::AtomicUsize::new(100_000),
                finished: finished::Finished::new(),
                watch: watch::Watch::default(),
                durable: durability::Pool::default(),
                records: record::Mode::default(),
            }),
        }
    }

    /// Refuses a partition count other than the one the deployment's data
    /// was written with: a task's keys are found by its id modulo the
    /// count, so a different count would not find the tasks in flight (nor
    /// their queues). The first backend to connect records it.
    async fn check_layout(&self) -> Result<(), BackendError> {
        let prefix = &self.shared.config.prefix;
        if self.keys().spread() && prefix.contains(['{', '}']) {
            return Err(BackendError::Misconfigured(format!(
                "`RedisConfig::prefix` is `{prefix}`: on a cluster it must not hold `{{` or `}}` \
                 (the partitions' hash tags are built from it, and Redis would hash the \
                 prefix's braces instead)"
            )));
        }
        match (self.keys().spread(), self.shared.asked_process_partitions) {
            (false, Some(n)) if n != PROCESS_PARTITIONS => {
                return Err(BackendError::Misconfigured(format!(
                    "`RedisConfig::process_partitions` is {n}, but the compact layout (a single \
                     server or Sentinel) has {PROCESS_PARTITIONS}: leave it `None`, or use the \
                     spread layout (`layout: KeyLayout::Spread`)"
                )))
            }
            (true, Some(n)) if !(1..=MAX_PROCESS_PARTITIONS).contains(&n) => {
                return Err(BackendError::Misconfigured(format!(
                    "`RedisConfig::process_partitions` is {n}: give 1 to \
                     {MAX_PROCESS_PARTITIONS} (each engine's share of them is a 64-bit mask)"
                )))
            }
            _ => {}
        }
        self.prepare_record_layout().await?;
        let record = self.keys().layout_record();
        let key = self.keys().layout();
        let (_, stored): (Option<String>, String) = redis::pipe()
            .cmd("SET")
            .arg(&key)
            .arg(&record)
            .arg("NX")
            .cmd("GET")
            .arg(&key)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if stored == record {
            return self.load_record_layout().await;
        }
        let Some(mine) = keys::parse_layout(&record) else {
            return Err(corrupt(format!(
                "the layout record `{record}` does not parse"
            )));
        };
        Err(BackendError::Misconfigured(
            match keys::parse_layout(&stored) {
                Some(theirs) => format!(
                "`RedisConfig::partitions` is {} ({:?} layout, {} process-manager partitions), \
                 but the data under prefix `{prefix}` was written with {} partitions ({:?} \
                 layout, {} process-manager partitions): tasks would not be found where they \
                 are. Set `partitions: Some({})`, `layout: KeyLayout::{:?}` and \
                 `process_partitions: Some({})`, or start the new layout under another \
                 `prefix` and let the old deployment drain",
                mine.partitions,
                mine.layout,
                mine.process_partitions,
                theirs.partitions,
                theirs.layout,
                theirs.process_partitions,
                theirs.partitions,
                theirs.layout,
                theirs.process_partitions,
            ),
                None => format!(
                "the layout recorded under prefix `{prefix}` (`{stored}`) is not one this version \
                 knows: a newer version wrote it. Use that version, or another `prefix`"
            ),
            },
        ))
    }

    /// The configuration in use (with the partition count and layout
    /// resolved: never `None` nor [`KeyLayout::Auto`]).
    pub fn config(&self) -> &RedisConfig {
        &self.shared.config
    }

    fn conn(&self) -> server::Conn {
        self.shared.server.conn()
    }

    /// Runs commands that may touch several slots: in one pipelined round
    /// trip on a single server; on a cluster, where a pipeline must stay in
    /// one slot, each on its own and all at once.
    async fn query_each(&self, cmds: Vec<redis::Cmd>) -> Result<Vec<Value>, BackendError> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        if self.shared.server.is_cluster() {
            let conn = self.conn();
            return futures::future::try_join_all(cmds.into_iter().map(|cmd| {
                let mut conn = conn.clone();
                async move { cmd.query_async::<Value>(&mut conn).await }
            }))
            .await
            .map_err(unavailable);
        }
        let mut pipe = redis::pipe();
        for cmd in cmds {
            pipe.add_command(cmd);
        }
        pipe.query_async(&mut self.conn())
            .await
            .map_err(unavailable)
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

    /// Runs a script (loading it on `NOSCRIPT`); on `NOGROUP` (the server
    /// lost the consumer groups) recreates them and runs it once more.
    async fn run<T: FromRedisValue>(
        &self,
        invocation: &scripts::ScriptCmd,
    ) -> Result<T, BackendError> {
        match invocation.invoke(&mut self.conn()).await {
            Err(e) if e.code() == Some("NOGROUP") => {
                tracing::warn!("the server lost the consumer groups; recreating them");
                self.ensure_groups().await?;
                invocation
                    .invoke(&mut self.conn())
                    .await
                    .map_err(unavailable)
            }
            other => other.map_err(unavailable),
        }
    }

    fn reader<T>(&self, consumer: &str, f: impl FnOnce(&mut Reader) -> T) -> T {
        let mut readers = self.shared.readers.locked();
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

/// Everything, shared by every engine on the deployment.
impl crate::backend::Backend for RedisBackend {
    fn processes(self: Arc<Self>) -> Option<Arc<dyn crate::backend::ProcessBackend>> {
        Some(self)
    }

    fn leases(self: Arc<Self>) -> Option<Arc<dyn crate::backend::Leases>> {
        Some(self)
    }

    fn breakers(self: Arc<Self>) -> Option<Arc<dyn crate::backend::Breakers>> {
        Some(self)
    }

    fn limits(self: Arc<Self>) -> Option<Arc<dyn crate::backend::Limits>> {
        Some(self)
    }

    fn partitions(self: Arc<Self>) -> Option<Arc<dyn crate::backend::Partitions>> {
        Some(self)
    }

    fn runners(self: Arc<Self>) -> Option<Arc<dyn crate::backend::Runners>> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_server_a_cluster_or_a_sentinel_deployment() {
        assert_eq!(
            Target::parse("redis://127.0.0.1:6379/").unwrap(),
            Target::Single("redis://127.0.0.1:6379/".into())
        );
        assert_eq!(
            Target::parse("redis+cluster://10.0.0.1:7000,10.0.0.2:7001/").unwrap(),
            Target::Cluster(vec![
                "redis://10.0.0.1:7000".into(),
                "redis://10.0.0.2:7001".into()
            ])
        );
        assert_eq!(
            Target::parse("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/sagas").unwrap(),
            Target::Sentinel {
                sentinels: vec![
                    "redis://10.0.0.1:26379".into(),
                    "redis://10.0.0.2:26379".into()
                ],
                service: "sagas".into()
            }
        );
        for bad in [
            "redis+cluster://",
            "redis+sentinel://10.0.0.1:26379",
            "redis+sentinel://10.0.0.1:26379/",
            "redis+sentinel:///sagas",
        ] {
            let error = Target::parse(bad).unwrap_err().to_string();
            assert!(
                error.contains("redis+cluster://host:port"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn layouts_round_trip_through_their_record() {
        let layout = |partitions, process_partitions, layout| keys::Layout {
            partitions,
            process_partitions,
            layout,
        };
        assert_eq!(
            keys::parse_layout("4"),
            Some(layout(4, 16, KeyLayout::Compact))
        );
        assert_eq!(
            keys::parse_layout(&Keys::new("saga", 16, 32, true).layout_record()),
            Some(layout(16, 32, KeyLayout::Spread))
        );
        assert_eq!(
            keys::parse_layout(&Keys::new("saga", 3, 32, false).layout_record()),
            Some(layout(3, 16, KeyLayout::Compact)),
            "the compact layout has 16 process-manager partitions, always"
        );
        for bad in [
            "spread/x/16",
            "spread/4",
            "spread/4/65",
            "spread/4/0",
            "future/3",
        ] {
            assert_eq!(keys::parse_layout(bad), None, "{bad}");
        }
    }
}
