//! Durability checked, not assumed: what the server is asked at connect
//! (an evicting `maxmemory-policy`, persistence, `WAITAOF` support), and
//! the wait after each write at a [`Durability`] level above the default.
//!
//! `WAIT` and `WAITAOF` wait for the offset of the last write *of the
//! connection they are sent on*, and block that connection while they
//! wait. So a durable write is sent with its wait in one pipeline (nothing
//! can come between them, and a connection lost between them fails both)
//! on a connection of a small pool of its own: the shared connection, with
//! the engine's leases, heartbeats and reads on it, never waits for a
//! replica. On a cluster the pipeline goes to its keys' primary, and the
//! wait counts that shard's replicas: a message moved to another shard
//! (`partitions.rs`' forward, `read.rs`' relay) waits on the target shard
//! before the source lets go of it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::{Cmd, Pipeline, RedisError, Script, Value};
use tokio::sync::{Mutex, MutexGuard};

use super::scripts::ScriptCmd;
use super::{server, unavailable, Durability, RedisBackend};
use crate::backend::BackendError;

/// How many durable writes wait at once, each on its own connection. One
/// acknowledgement of a replica releases every write waiting for it, so
/// the more wait together the less each costs: measured with
/// `bench_redis` (4 workers reading 16), 8 gave 2,800 steps/s and 32
/// gave 6,300.
const POOL: usize = 32;

/// The connections durable writes are sent on, opened when first needed
/// and dropped after a failure (the next write opens another: after a
/// Sentinel failover, to the new primary).
pub(super) struct Pool {
    slots: Vec<Mutex<Option<server::Conn>>>,
    next: AtomicUsize,
}

impl Default for Pool {
    fn default() -> Self {
        Pool {
            slots: (0..POOL).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }
}

/// A durable pipeline: `first`, then `wait` (the level's wait), their
/// errors returned as values.
fn with_wait(first: Cmd, wait: Cmd) -> Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.add_command(first).add_command(wait);
    pipe
}

/// Policies under which a full server deletes keys.
fn evicts(policy: &str) -> bool {
    policy.starts_with("allkeys-") || policy.starts_with("volatile-")
}

/// The value of a `CONFIG GET <name>` answer (RESP2 pairs or a RESP3 map).
fn setting(reply: &Value) -> Option<String> {
    match reply {
        Value::Array(items) => items.get(1).map(super::entry::text),
        Value::Map(pairs) => pairs.first().map(|(_, v)| super::entry::text(v)),
        _ => None,
    }
}

/// Whether an error leaves a pooled connection unfit for the next write.
fn broken(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "MOVED"))
}

impl RedisBackend {
    /// Reads the settings of every primary and refuses those that lose
    /// data silently: an evicting `maxmemory-policy` (unless
    /// `allow_eviction`), and for [`Durability::Fsynced`] a server without
    /// the append-only file or without `WAITAOF`. Persistence off is
    /// logged. A server that refuses `CONFIG` (renamed or disabled, as on
    /// managed Redis) is logged as unchecked, not refused.
    pub(super) async fn check_server(&self) -> Result<(), BackendError> {
        let config = &self.shared.config;
        match self.settings().await {
            Ok(nodes) => {
                for (node, policy, appendonly, save) in nodes {
                    if evicts(&policy) && !config.allow_eviction {
                        return Err(BackendError::Misconfigured(format!(
                            "the Redis server at {node} has `maxmemory-policy {policy}`: when it \
                             runs out of memory it deletes keys, and with them tasks, messages \
                             and leases, without a trace (`volatile-*` policies too: the engine \
                             sets expiries on live keys). Set `maxmemory-policy noeviction` (a \
                             full server then refuses writes, and the engine retries them), or, \
                             if its memory cannot run out, `RedisConfig::allow_eviction: true`"
                        )));
                    }
                    if evicts(&policy) {
                        tracing::warn!(%node, %policy, "the server evicts keys when full; connecting anyway (`RedisConfig::allow_eviction`)");
                    }
                    match (appendonly == "yes", save.trim().is_empty()) {
                        (false, true) => {
                            tracing::warn!(%node, "persistence is off on the Redis server (no append-only file, no snapshots): a restart loses every task")
                        }
                        (false, false) => {
                            tracing::warn!(%node, %save, "the Redis server has no append-only file, only snapshots: a crash loses the writes since the last snapshot")
                        }
                        (true, _) => {}
                    }
                    if matches!(config.durability, Durability::Fsynced { .. })
                        && appendonly != "yes"
                    {
                        return Err(BackendError::Misconfigured(format!(
                            "`RedisConfig::durability` is `Fsynced`, but the Redis server at \
                             {node} has `appendonly no`: there is no append-only file to fsync. \
                             Set `appendonly yes`, or choose `Durability::Replicated` or \
                             `Durability::Primary`"
                        )));
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, "could not read the Redis server's settings (`CONFIG GET` refused: renamed or disabled, as on managed Redis); its eviction policy and persistence are not checked: make sure `maxmemory-policy` is `noeviction` and persistence is on")
            }
        }
        self.check_level().await
    }

    /// Each primary's address, `maxmemory-policy`, `appendonly` and `save`.
    async fn settings(&self) -> Result<Vec<(String, String, String, String)>, RedisError> {
        let server = &self.shared.server;
        let get = |name: &str| {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("GET").arg(name);
            server.on_primaries(cmd)
        };
        let policies = get("maxmemory-policy").await?;
        let appendonly = get("appendonly").await?;
        let save = get("save").await?;
        let of = |answers: &[(String, Value)], node: &str| {
            answers
                .iter()
                .find(|(n, _)| n == node)
                .and_then(|(_, v)| setting(v))
                .unwrap_or_default()
        };
        Ok(policies
            .iter()
            .map(|(node, policy)| {
                (
                    node.clone(),
                    setting(policy).unwrap_or_default(),
                    of(&appendonly, node),
                    of(&save, node),
                )
            })
            .collect())
    }

    /// Checks that the servers can give the durability level: `WAITAOF`
    /// known (Redis 7.2 or later) for [`Durability::Fsynced`], tried once;
    /// for [`Durability::Replicated`], logs a primary with fewer replicas
    /// than asked (not refused: one may be restarting; its writes fail
    /// until they are back).
    async fn check_level(&self) -> Result<(), BackendError> {
        let server = &self.shared.server;
        match self.shared.config.durability {
            Durability::Primary => Ok(()),
            Durability::Replicated { replicas, .. } => {
                if replicas == 0 {
                    return Err(BackendError::Misconfigured(
                        "`Durability::Replicated { replicas: 0, .. }` waits for nothing: ask for \
                         at least 1 replica, or choose `Durability::Primary`"
                            .to_owned(),
                    ));
                }
                let info = server
                    .on_primaries(redis::cmd("INFO").arg("replication").clone())
                    .await
                    .map_err(unavailable)?;
                for (node, info) in info {
                    let connected = super::entry::text(&info)
                        .lines()
                        .find_map(|l| l.strip_prefix("connected_slaves:"))
                        .and_then(|n| n.trim().parse::<u32>().ok())
                        .unwrap_or(0);
                    if connected < replicas {
                        tracing::warn!(%node, connected, replicas, "the Redis primary has fewer replicas than `RedisConfig::durability` asks for: its writes fail until they are back");
                    }
                }
                Ok(())
            }
            Durability::Fsynced { .. } => {
                let probe = redis::cmd("WAITAOF").arg(1).arg(0).arg(100).clone();
                match server.on_primaries(probe).await {
                    Ok(_) => Ok(()),
                    Err(error) if error.code().is_some() => {
                        Err(BackendError::Misconfigured(format!(
                            "`RedisConfig::durability` is `Fsynced`, but the Redis server refuses \
                             `WAITAOF` ({error}): it needs Redis 7.2 or later with `appendonly \
                             yes`. Upgrade the server, or choose `Durability::Replicated` (`WAIT`) \
                             or `Durability::Primary`"
                        )))
                    }
                    Err(error) => Err(unavailable(error)),
                }
            }
        }
    }

    /// A connection of the pool, held until the guard is dropped: the one
    /// the round-robin points at if free, else the first free one, else
    /// the round-robin's, once free.
    async fn pooled(&self) -> MutexGuard<'_, Option<server::Conn>> {
        let pool = &self.shared.durable;
        let first = pool.next.fetch_add(1, Ordering::Relaxed);
        let n = pool.slots.len();
        for i in 0..n {
            if let Ok(slot) = pool.slots[(first + i) % n].try_lock() {
                return slot;
            }
        }
        pool.slots[first % n].lock().await
    }

    /// Runs `pipe` (a command and the level's wait, [`with_wait`]) on a
    /// pooled connection, and returns their replies as values (a server
    /// error as [`Value::ServerError`]). The `script` the command invokes,
    /// if any, is loaded once on `NOSCRIPT`.
    async fn pipeline(
        &self,
        pipe: &Pipeline,
        script: Option<&Script>,
    ) -> Result<(Value, Value), BackendError> {
        let timeout = self.shared.config.response_timeout
            + self.shared.config.durability.timeout()
            + Duration::from_secs(1);
        let mut slot = self.pooled().await;
        for attempt in 0..2 {
            let conn = match slot.as_mut() {
                Some(conn) => conn,
                None => slot.insert(
                    self.shared
                        .server
                        .dedicated(timeout)
                        .await
                        .map_err(unavailable)?,
                ),
            };
            let (reply, acked): (Value, Value) = match pipe.query_async(conn).await {
                Ok(replies) => replies,
                Err(error) => {
                    if broken(&error) {
                        self.shared.server.failed(&error);
                        *slot = None;
                    }
                    return Err(unavailable(error));
                }
            };
            // A primary that became a replica (a failover) answers
            // `READONLY`: the next write opens a connection to the new one.
            if let Value::ServerError(error) = &reply {
                let error = RedisError::from(error.clone());
                if broken(&error) {
                    self.shared.server.failed(&error);
                    *slot = None;
                    return Ok((reply, acked));
                }
            }
            let noscript = matches!(&reply, Value::ServerError(e) if e.code() == "NOSCRIPT");
            match (noscript, script) {
                (true, Some(script)) if attempt == 0 => {
                    script.load_async(conn).await.map_err(unavailable)?;
                }
                _ => return Ok((reply, acked)),
            }
        }
        Err(BackendError::unavailable(
            "a script was not found after loading it",
        ))
    }

    /// Fails unless `acked` (the reply of the level's wait) reaches the
    /// level.
    fn reached(&self, acked: Value) -> Result<(), BackendError> {
        let durability = self.shared.config.durability;
        let number = |v: Option<&Value>| match v {
            Some(Value::Int(n)) => *n,
            _ => -1,
        };
        let (missing, what) = match durability {
            Durability::Primary => return Ok(()),
            Durability::Replicated { replicas, .. } => {
                let acked = number(Some(&acked));
                (
                    acked < i64::from(replicas),
                    format!("{acked} of the {replicas} replica(s) it asks for acknowledged it"),
                )
            }
            Durability::Fsynced { replicas, .. } => {
                let answer = match &acked {
                    Value::Array(items) => items.clone(),
                    _ => Vec::new(),
                };
                let (local, remote) = (number(answer.first()), number(answer.get(1)));
                (
                    local < 1 || remote < i64::from(replicas),
                    format!(
                        "the primary's disk has it: {}; {remote} of the {replicas} replica(s) it \
                         asks for have it on disk",
                        local >= 1
                    ),
                )
            }
        };
        if let Value::ServerError(error) = &acked {
            return Err(unavailable(RedisError::from(error.clone())));
        }
        match missing {
            false => Ok(()),
            true => Err(BackendError::unavailable(format!(
                "a write did not reach `RedisConfig::durability` ({durability:?}) in time: \
                 {what}. It was applied on the primary and is not undone (a retry finds it \
                 done), but a failover or a crash now could lose it"
            ))),
        }
    }

    /// Runs a script call that must reach the durability level: with its
    /// wait, in one pipeline, on a pooled connection (recreating lost
    /// consumer groups, as [`run`](RedisBackend::run) does). At
    /// [`Durability::Primary`], [`run`](RedisBackend::run) itself.
    pub(super) async fn run_durable(&self, invocation: ScriptCmd) -> Result<Value, BackendError> {
        let Some(wait) = self.shared.config.durability.wait_cmd() else {
            return self.run(&invocation).await;
        };
        let script = invocation.script;
        let pipe = with_wait(invocation.cmd, wait);
        let mut regrouped = false;
        loop {
            let (reply, acked) = self.pipeline(&pipe, Some(script)).await?;
            match reply {
                Value::ServerError(error) if error.code() == "NOGROUP" && !regrouped => {
                    tracing::warn!("the server lost the consumer groups; recreating them");
                    self.ensure_groups().await?;
                    regrouped = true;
                }
                Value::ServerError(error) => return Err(unavailable(RedisError::from(error))),
                reply => {
                    let reply = reply.extract_error().map_err(unavailable)?;
                    self.reached(acked)?;
                    return Ok(reply);
                }
            }
        }
    }

    /// Runs a command that must reach the durability level (a message
    /// moved to another shard), with its wait, as
    /// [`run_durable`](Self::run_durable) does; at [`Durability::Primary`]
    /// on the shared connection.
    pub(super) async fn query_durable(&self, cmd: Cmd) -> Result<Value, BackendError> {
        let Some(wait) = self.shared.config.durability.wait_cmd() else {
            return cmd.query_async(&mut self.conn()).await.map_err(unavailable);
        };
        let (reply, acked) = self.pipeline(&with_wait(cmd, wait), None).await?;
        let reply = reply.extract_error().map_err(unavailable)?;
        self.reached(acked)?;
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_policies_are_told_apart() {
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-ttl",
        ] {
            assert!(evicts(policy), "{policy}");
        }
        assert!(!evicts("noeviction"));
    }

    #[test]
    fn settings_read_from_either_protocol() {
        let name = Value::BulkString(b"appendonly".to_vec());
        let yes = Value::BulkString(b"yes".to_vec());
        assert_eq!(
            setting(&Value::Array(vec![name.clone(), yes.clone()])).as_deref(),
            Some("yes")
        );
        assert_eq!(
            setting(&Value::Map(vec![(name, yes)])).as_deref(),
            Some("yes")
        );
        assert_eq!(setting(&Value::Array(vec![])), None);
    }
}
