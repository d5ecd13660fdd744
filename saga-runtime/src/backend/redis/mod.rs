//! The Redis backend: durable tasks, leases with fencing, idempotency keys,
//! a work queue on Streams consumer groups and a dead-letter stream.
//!
//! - Task records are hashes `{doc, version}`; every write is a script that
//!   checks the fencing token and the version first.
//! - The lock is `SET NX PX` with a random token; each acquisition increments
//!   a per-task fence counter, and a write must carry the latest fence.
//!   Release and extension compare the token (compare-and-delete).
//! - Messages live on a stream per partition read through a consumer group.
//!   A message stays pending until the commit script acknowledges (and
//!   deletes) it; one left pending longer than the visibility timeout (its
//!   worker died) is taken over with `XAUTOCLAIM`.
//! - Blocking reads use a connection of their own per consumer, whose
//!   response timeout exceeds the block time.
//! - Cancellation is a flag key plus a pub/sub notification; running steps
//!   also see the flag through their heartbeat if a notification is lost.
//!
//! Steady state per step: one `XREADGROUP`, one script to lock and load, one
//! to persist the attempt and claim its idempotency key, one to commit,
//! enqueue, acknowledge and unlock.

mod keys;
mod scripts;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::streams::{StreamAutoClaimReply, StreamReadReply};
use redis::{AsyncConnectionConfig, Client, RedisError, Value};
use tokio::time::Instant;
use uuid::Uuid;

use super::{
    Backend, BackendError, DeadLetter, Delivery, Heartbeat, Lease, Locked, ProcessCommit,
    ProcessInstance, Settle,
};
use crate::task::{TaskId, TaskInstance, Timestamp};
use keys::Keys;
use scripts as s;

/// Settings of a [`RedisBackend`].
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// Prefix of every key (default `saga`): lets several applications share
    /// one Redis.
    pub prefix: String,
    /// Number of partitions (default 1). Each partition is one hash slot on
    /// Redis Cluster.
    pub partitions: u16,
    /// Consumer group name (default `workers`).
    pub group: String,
    /// A message pending longer than this is redelivered to another worker
    /// (default 30 s). Running steps keep their message alive, so this bounds
    /// how long a dead worker's message waits.
    pub visibility_timeout: Duration,
    /// How long one blocking read waits (default 1 s).
    pub block: Duration,
    /// Response timeout of ordinary commands (default 5 s).
    pub response_timeout: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            prefix: "saga".to_owned(),
            partitions: 1,
            group: "workers".to_owned(),
            visibility_timeout: Duration::from_secs(30),
            block: Duration::from_secs(1),
            response_timeout: Duration::from_secs(5),
        }
    }
}

/// The Redis backend. Cheap to clone.
#[derive(Clone)]
pub struct RedisBackend {
    shared: Arc<Shared>,
}

struct Shared {
    client: Client,
    conn: ConnectionManager,
    keys: Keys,
    config: RedisConfig,
    readers: Mutex<HashMap<String, Reader>>,
}

/// The blocking-read state of one consumer.
struct Reader {
    conn: Option<MultiplexedConnection>,
    last_claim: Option<Instant>,
    /// Entries already delivered to this consumer by one read (a read over
    /// several streams returns up to one per stream; a claim up to
    /// `CLAIM_BATCH`) and not yet handed out. They are pending for this
    /// consumer, so they must be handed out, not dropped.
    buffered: std::collections::VecDeque<Delivery>,
}

/// Messages taken over per `XAUTOCLAIM` call.
const CLAIM_BATCH: usize = 16;

fn unavailable(e: RedisError) -> BackendError {
    BackendError::Unavailable(e.to_string())
}

fn corrupt(what: impl std::fmt::Display) -> BackendError {
    BackendError::Corrupt(what.to_string())
}

/// A stored millisecond timestamp (the cancellation flag's value).
fn timestamp(stored: Option<String>) -> Option<Timestamp> {
    stored.and_then(|s| s.parse().ok()).map(Timestamp)
}

fn ms(d: Duration) -> u64 {
    d.as_millis().max(1) as u64
}

impl RedisBackend {
    /// Connects with the default [`RedisConfig`].
    pub async fn connect(url: &str) -> Result<Self, BackendError> {
        RedisBackend::connect_with(url, RedisConfig::default()).await
    }

    /// Connects with `config`.
    pub async fn connect_with(url: &str, config: RedisConfig) -> Result<Self, BackendError> {
        let client = Client::open(url).map_err(unavailable)?;
        let manager_config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(config.response_timeout))
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(1));
        let conn = client
            .get_connection_manager_with_config(manager_config)
            .await
            .map_err(unavailable)?;
        let backend = RedisBackend {
            shared: Arc::new(Shared {
                client,
                conn,
                keys: Keys::new(&config.prefix, config.partitions),
                config,
                readers: Mutex::new(HashMap::new()),
            }),
        };
        backend.ensure_groups().await?;
        Ok(backend)
    }

    /// The configuration in use.
    pub fn config(&self) -> &RedisConfig {
        &self.shared.config
    }

    fn conn(&self) -> ConnectionManager {
        self.shared.conn.clone()
    }

    fn keys(&self) -> &Keys {
        &self.shared.keys
    }

    /// Creates the consumer group of every partition's queue (idempotent).
    /// Reading from `0` rather than `$` keeps messages enqueued before any
    /// worker started.
    async fn ensure_groups(&self) -> Result<(), BackendError> {
        let mut conn = self.conn();
        for p in 0..self.keys().streams() {
            let result: Result<(), RedisError> = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(self.keys().queue(p))
                .arg(&self.shared.config.group)
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

    fn check_write(
        reply: &[i64],
        task: &TaskInstance,
        lease: &Lease,
        stored: Option<String>,
    ) -> Result<u64, BackendError> {
        match reply.first().copied() {
            Some(v) if v > 0 => Ok(v as u64),
            Some(-1) => Err(BackendError::LockLost {
                task: task.id,
                fence: lease.fence,
            }),
            Some(-2) => Err(BackendError::Conflict {
                task: task.id,
                expected: task.version,
                actual: stored.and_then(|s| s.parse().ok()).unwrap_or(0),
            }),
            Some(-3) => Err(BackendError::NotFound(task.id)),
            Some(-5) => Err(BackendError::CancelRequested {
                task: task.id,
                at: timestamp(stored).unwrap_or_else(Timestamp::now),
            }),
            _ => Err(corrupt("unexpected reply from a write script")),
        }
    }

    fn partition_of_payload(&self, payload: &str) -> u16 {
        #[derive(serde::Deserialize)]
        struct Probe {
            task_id: Option<TaskId>,
            process: Option<String>,
        }
        match serde_json::from_str::<Probe>(payload) {
            Ok(Probe {
                process: Some(_), ..
            }) => self.keys().process_stream(),
            Ok(Probe {
                task_id: Some(id), ..
            }) => self.keys().partition_of(id),
            _ => 0,
        }
    }

    fn parse_instance(
        doc: Option<String>,
        version: Option<String>,
    ) -> Result<Option<ProcessInstance>, BackendError> {
        let Some(doc) = doc else { return Ok(None) };
        let mut instance: ProcessInstance = serde_json::from_str(&doc).map_err(corrupt)?;
        instance.version = version
            .and_then(|v| v.parse().ok())
            .unwrap_or(instance.version);
        Ok(Some(instance))
    }

    /// Turns one stream entry into a delivery.
    fn delivery(
        &self,
        partition: u16,
        entry: &redis::streams::StreamId,
        consumer: &str,
    ) -> Delivery {
        let payload = match entry.map.get("payload") {
            Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => String::new(),
        };
        Delivery {
            id: format!("{partition}/{}", entry.id),
            payload,
            delivery_count: entry.delivered_count.unwrap_or(0) as u64,
            consumer: consumer.to_owned(),
        }
    }

    async fn reader_conn(&self, consumer: &str) -> Result<MultiplexedConnection, BackendError> {
        if let Some(conn) = self.reader(consumer, |r| r.conn.clone()) {
            return Ok(conn);
        }
        // The block time plus a margin: the crate's default response timeout
        // would otherwise cut a blocking read off.
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(self.shared.config.block + Duration::from_secs(5)))
            .set_connection_timeout(Some(Duration::from_secs(5)));
        let conn = self
            .shared
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(unavailable)?;
        self.reader(consumer, |r| r.conn = Some(conn.clone()));
        Ok(conn)
    }

    fn reader<T>(&self, consumer: &str, f: impl FnOnce(&mut Reader) -> T) -> T {
        let mut readers = self
            .shared
            .readers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let reader = readers.entry(consumer.to_owned()).or_insert(Reader {
            conn: None,
            last_claim: None,
            buffered: std::collections::VecDeque::new(),
        });
        f(reader)
    }

    /// Takes over messages whose consumer stopped settling them; returns
    /// the first and buffers the rest.
    async fn autoclaim(&self, consumer: &str) -> Result<Option<Delivery>, BackendError> {
        let mut conn = self.conn();
        let mut claimed = Vec::new();
        for p in 0..self.keys().streams() {
            let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
                .arg(self.keys().queue(p))
                .arg(&self.shared.config.group)
                .arg(consumer)
                .arg(ms(self.shared.config.visibility_timeout))
                .arg("0-0")
                .arg("COUNT")
                .arg(CLAIM_BATCH)
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            for entry in &reply.claimed {
                tracing::info!(message = %entry.id, consumer, "took over a message whose worker stopped");
                claimed.push(self.delivery(p, entry, consumer));
            }
        }
        Ok(self.hand_out(consumer, claimed))
    }

    /// Returns the first of `deliveries` and buffers the rest for `consumer`.
    fn hand_out(&self, consumer: &str, deliveries: Vec<Delivery>) -> Option<Delivery> {
        let mut it = deliveries.into_iter();
        let first = it.next();
        let rest: Vec<Delivery> = it.collect();
        if !rest.is_empty() {
            self.reader(consumer, |r| r.buffered.extend(rest));
        }
        first
    }

    async fn read_new(
        &self,
        consumer: &str,
        wait: Duration,
    ) -> Result<Option<Delivery>, BackendError> {
        let mut conn = self.reader_conn(consumer).await?;
        let block = wait.min(self.shared.config.block);
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.shared.config.group)
            .arg(consumer)
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(ms(block))
            .arg("STREAMS");
        let partitions = self.keys().streams();
        for p in 0..partitions {
            cmd.arg(self.keys().queue(p));
        }
        for _ in 0..partitions {
            cmd.arg(">");
        }
        let reply: Result<Option<StreamReadReply>, RedisError> = cmd.query_async(&mut conn).await;
        match reply {
            Ok(Some(reply)) => {
                // COUNT is per stream: a read over several streams may
                // return one entry from each. All of them are now pending
                // for this consumer; hand out one and buffer the others.
                let mut deliveries = Vec::new();
                for key in reply.keys {
                    let p = (0..partitions)
                        .find(|p| self.keys().queue(*p) == key.key)
                        .unwrap_or(0);
                    deliveries.extend(
                        key.ids
                            .iter()
                            .map(|entry| self.delivery(p, entry, consumer)),
                    );
                }
                Ok(self.hand_out(consumer, deliveries))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                // Drop the connection so the next read reconnects; recreate
                // the groups if the server lost them (a restart without AOF).
                self.reader(consumer, |r| r.conn = None);
                if e.code() == Some("NOGROUP") {
                    self.ensure_groups().await?;
                }
                Err(unavailable(e))
            }
        }
    }

    fn parse_doc(
        doc: Option<String>,
        version: Option<String>,
    ) -> Result<Option<TaskInstance>, BackendError> {
        let Some(doc) = doc else { return Ok(None) };
        let mut task: TaskInstance = serde_json::from_str(&doc).map_err(corrupt)?;
        task.version = version.and_then(|v| v.parse().ok()).unwrap_or(task.version);
        Ok(Some(task))
    }

    fn doc(task: &TaskInstance) -> Result<String, BackendError> {
        serde_json::to_string(task).map_err(corrupt)
    }

    fn dead_letter_from(
        &self,
        partition: u16,
        id: &str,
        fields: &HashMap<String, Value>,
    ) -> DeadLetter {
        let text = |name: &str| match fields.get(name) {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => String::new(),
        };
        DeadLetter {
            id: format!("{partition}/{id}"),
            payload: text("payload"),
            reason: text("reason"),
            task_id: text("task").parse().ok(),
            at: Timestamp(text("at").parse().unwrap_or(0)),
        }
    }
}

#[async_trait]
impl Backend for RedisBackend {
    async fn create_task(&self, task: &TaskInstance, message: &str) -> Result<(), BackendError> {
        let k = self.keys();
        let p = k.partition_of(task.id);
        let created: i64 = s::CREATE
            .key(k.task(task.id))
            .key(k.saga_index(p, &task.saga))
            .key(k.queue(p))
            .arg(Self::doc(task)?)
            .arg(task.id.to_string())
            .arg(message)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if created == 1 {
            Ok(())
        } else {
            Err(corrupt(format!("task {} already exists", task.id)))
        }
    }

    async fn load_task(&self, id: TaskId) -> Result<Option<TaskInstance>, BackendError> {
        let (doc, version): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(self.keys().task(id))
            .arg("doc")
            .arg("version")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Self::parse_doc(doc, version)
    }

    async fn list_tasks(&self, saga: &str) -> Result<Vec<TaskInstance>, BackendError> {
        let mut conn = self.conn();
        let mut tasks = Vec::new();
        for p in 0..self.keys().partitions() {
            let ids: Vec<String> = redis::cmd("SMEMBERS")
                .arg(self.keys().saga_index(p, saga))
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            for chunk in ids.chunks(200) {
                let mut pipe = redis::pipe();
                for id in chunk {
                    let id: TaskId = id.parse().map_err(corrupt)?;
                    pipe.cmd("HMGET")
                        .arg(self.keys().task(id))
                        .arg("doc")
                        .arg("version");
                }
                let docs: Vec<(Option<String>, Option<String>)> =
                    pipe.query_async(&mut conn).await.map_err(unavailable)?;
                for (doc, version) in docs {
                    tasks.extend(Self::parse_doc(doc, version)?);
                }
            }
        }
        tasks.sort_by_key(|t| (t.created_at, t.id));
        Ok(tasks)
    }

    async fn save_and_claim(
        &self,
        task: &TaskInstance,
        lease: &Lease,
        claim: &str,
        ttl: Duration,
    ) -> Result<(u64, bool), BackendError> {
        let k = self.keys();
        let (code, extra): (i64, Option<String>) = s::SAVE_AND_CLAIM
            .key(k.fence(task.id))
            .key(k.task(task.id))
            .key(k.idempotency(claim))
            .arg(lease.fence)
            .arg(task.version)
            .arg(Self::doc(task)?)
            .arg(ms(ttl))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let version = Self::check_write(&[code], task, lease, extra.clone())?;
        Ok((version, extra.as_deref() == Some("1")))
    }

    async fn commit(
        &self,
        task: &TaskInstance,
        lease: &Lease,
        enqueue: Option<&str>,
        settle: Settle<'_>,
        unless_cancelled: bool,
    ) -> Result<u64, BackendError> {
        let k = self.keys();
        let p = k.partition_of(task.id);
        let (kind, entry, payload, reason) = match settle {
            Settle::Nothing => ("none", String::new(), "", ""),
            Settle::Ack(d) => ("ack", self.entry_of(d, p)?, "", ""),
            Settle::DeadLetter(d, reason) => {
                ("dead", self.entry_of(d, p)?, d.payload.as_str(), reason)
            }
            Settle::ResolveDeadLetter(id) => {
                let (lp, entry) = k
                    .split_id(id)
                    .ok_or_else(|| corrupt(format!("bad dead letter id {id}")))?;
                if lp != p {
                    return Err(corrupt(format!(
                        "dead letter {id} is not in task {}'s partition",
                        task.id
                    )));
                }
                ("resolve", entry.to_owned(), "", "")
            }
        };
        let reply: Vec<Option<String>> = s::COMMIT
            .key(k.fence(task.id))
            .key(k.task(task.id))
            .key(k.lock(task.id))
            .key(k.queue(p))
            .key(k.dead(p))
            .key(k.cancel(task.id))
            .arg(lease.fence)
            .arg(task.version)
            .arg(Self::doc(task)?)
            .arg(&lease.token)
            .arg(enqueue.unwrap_or(""))
            .arg(kind)
            .arg(entry)
            .arg(&self.shared.config.group)
            .arg(payload)
            .arg(reason)
            .arg(task.id.to_string())
            .arg(Timestamp::now().0)
            .arg(if unless_cancelled { "1" } else { "0" })
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let code: i64 = reply
            .first()
            .cloned()
            .flatten()
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| corrupt("unexpected reply from the commit script"))?;
        Self::check_write(&[code], task, lease, reply.get(1).cloned().flatten())
    }

    async fn try_lock_and_load(
        &self,
        id: TaskId,
        ttl: Duration,
    ) -> Result<Option<Locked>, BackendError> {
        let token = Uuid::new_v4().simple().to_string();
        let reply: Option<(u64, Option<String>, Option<String>, Option<String>)> = self
            .lock_script(id, &token, ttl, true)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let Some((fence, doc, version, cancel)) = reply else {
            return Ok(None);
        };
        Ok(Some(Locked {
            lease: Lease {
                task_id: id,
                token,
                fence,
            },
            task: Self::parse_doc(doc, version)?,
            cancel_requested: timestamp(cancel),
        }))
    }

    async fn try_lock(&self, id: TaskId, ttl: Duration) -> Result<Option<Lease>, BackendError> {
        let token = Uuid::new_v4().simple().to_string();
        let reply: Option<Vec<u64>> = self
            .lock_script(id, &token, ttl, false)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(reply.and_then(|r| r.first().copied()).map(|fence| Lease {
            task_id: id,
            token,
            fence,
        }))
    }

    async fn extend_lock(&self, lease: &Lease, ttl: Duration) -> Result<bool, BackendError> {
        let extended: i64 = s::EXTEND
            .key(self.keys().lock(lease.task_id))
            .arg(&lease.token)
            .arg(ms(ttl))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(extended == 1)
    }

    async fn unlock(&self, lease: &Lease) -> Result<bool, BackendError> {
        let released: i64 = s::UNLOCK
            .key(self.keys().lock(lease.task_id))
            .arg(&lease.token)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(released == 1)
    }

    async fn try_claim(&self, key: &str, ttl: Duration) -> Result<bool, BackendError> {
        let set: Option<String> = redis::cmd("SET")
            .arg(self.keys().idempotency(key))
            .arg("1")
            .arg("NX")
            .arg("PX")
            .arg(ms(ttl))
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(set.is_some())
    }

    async fn enqueue(&self, payload: &str) -> Result<(), BackendError> {
        let p = self.partition_of_payload(payload);
        let _: String = redis::cmd("XADD")
            .arg(self.keys().queue(p))
            .arg("*")
            .arg("payload")
            .arg(payload)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn receive(
        &self,
        consumer: &str,
        wait: Duration,
    ) -> Result<Option<Delivery>, BackendError> {
        if let Some(buffered) = self.reader(consumer, |r| r.buffered.pop_front()) {
            return Ok(Some(buffered));
        }
        let claim_every =
            (self.shared.config.visibility_timeout / 2).max(Duration::from_millis(50));
        let due = self.reader(consumer, |r| {
            let due = r.last_claim.is_none_or(|at| at.elapsed() >= claim_every);
            if due {
                r.last_claim = Some(Instant::now());
            }
            due
        });
        if due {
            if let Some(delivery) = self.autoclaim(consumer).await? {
                return Ok(Some(delivery));
            }
        }
        self.read_new(consumer, wait).await
    }

    async fn touch(&self, delivery: &Delivery) -> Result<(), BackendError> {
        let Some((p, entry)) = self.keys().split_id(&delivery.id) else {
            return Ok(());
        };
        let _: Value = redis::cmd("XCLAIM")
            .arg(self.keys().queue(p))
            .arg(&self.shared.config.group)
            .arg(&delivery.consumer)
            .arg(0)
            .arg(entry)
            .arg("JUSTID")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn heartbeat(
        &self,
        lease: &Lease,
        delivery: &Delivery,
        ttl: Duration,
    ) -> Result<Heartbeat, BackendError> {
        let k = self.keys();
        let p = k.partition_of(lease.task_id);
        let entry = self.entry_of(delivery, p)?;
        let (held, cancel): (i64, Option<String>) = s::HEARTBEAT
            .key(k.lock(lease.task_id))
            .key(k.queue(p))
            .key(k.cancel(lease.task_id))
            .arg(&lease.token)
            .arg(ms(ttl))
            .arg(&self.shared.config.group)
            .arg(&delivery.consumer)
            .arg(entry)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(Heartbeat {
            lock_held: held == 1,
            cancel_requested: timestamp(cancel),
        })
    }

    async fn ack(&self, delivery: &Delivery) -> Result<(), BackendError> {
        let Some((p, entry)) = self.keys().split_id(&delivery.id) else {
            return Err(corrupt(format!("bad delivery id {}", delivery.id)));
        };
        let _: i64 = s::ACK
            .key(self.keys().queue(p))
            .arg(&self.shared.config.group)
            .arg(entry)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn release(&self, _delivery: &Delivery, _delay: Duration) -> Result<(), BackendError> {
        // Left pending: XAUTOCLAIM hands it to a worker once the visibility
        // timeout passes. Streams have no per-message delay.
        Ok(())
    }

    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &str,
        task_id: Option<TaskId>,
    ) -> Result<(), BackendError> {
        let Some((p, entry)) = self.keys().split_id(&delivery.id) else {
            return Err(corrupt(format!("bad delivery id {}", delivery.id)));
        };
        let _: String = s::DEAD_LETTER
            .key(self.keys().queue(p))
            .key(self.keys().dead(p))
            .arg(&self.shared.config.group)
            .arg(entry)
            .arg(&delivery.payload)
            .arg(reason)
            .arg(task_id.map(|t| t.to_string()).unwrap_or_default())
            .arg(Timestamp::now().0)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn dead_letters(&self) -> Result<Vec<DeadLetter>, BackendError> {
        let mut conn = self.conn();
        let mut letters = Vec::new();
        for p in 0..self.keys().streams() {
            let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(self.keys().dead(p))
                .arg("-")
                .arg("+")
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            letters.extend(
                reply
                    .ids
                    .iter()
                    .map(|e| self.dead_letter_from(p, &e.id, &e.map)),
            );
        }
        letters.sort_by_key(|l| l.at);
        Ok(letters)
    }

    async fn requeue_dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        let Some((p, entry)) = self.keys().split_id(id) else {
            return Ok(None);
        };
        let fields: Option<Vec<String>> = s::REQUEUE
            .key(self.keys().dead(p))
            .key(self.keys().queue(p))
            .arg(entry)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(fields.map(|fields| {
            let map = fields
                .chunks(2)
                .filter_map(|kv| match kv {
                    [k, v] => Some((k.clone(), Value::BulkString(v.clone().into_bytes()))),
                    _ => None,
                })
                .collect();
            self.dead_letter_from(p, entry, &map)
        }))
    }

    async fn request_cancel(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError> {
        let previous: Option<String> = s::CANCEL
            .key(self.keys().cancel(id))
            .arg(Timestamp::now().0)
            .arg(self.keys().cancel_channel())
            .arg(id.to_string())
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(timestamp(previous))
    }

    async fn cancel_requested(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError> {
        let at: Option<String> = redis::cmd("GET")
            .arg(self.keys().cancel(id))
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(timestamp(at))
    }

    async fn process_load(
        &self,
        process: &str,
        id: &str,
    ) -> Result<Option<ProcessInstance>, BackendError> {
        let (doc, version): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(self.keys().instance(process, id))
            .arg("doc")
            .arg("version")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Self::parse_instance(doc, version)
    }

    async fn process_find(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Option<ProcessInstance>, BackendError> {
        let id: Option<String> = redis::cmd("GET")
            .arg(self.keys().correlation(process, field, value))
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        match id {
            Some(id) => self.process_load(process, &id).await,
            None => Ok(None),
        }
    }

    async fn process_list(&self, process: &str) -> Result<Vec<ProcessInstance>, BackendError> {
        let mut conn = self.conn();
        let ids: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.keys().instances(process))
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let mut list = Vec::new();
        for chunk in ids.chunks(200) {
            let mut pipe = redis::pipe();
            for id in chunk {
                pipe.cmd("HMGET")
                    .arg(self.keys().instance(process, id))
                    .arg("doc")
                    .arg("version");
            }
            let docs: Vec<(Option<String>, Option<String>)> =
                pipe.query_async(&mut conn).await.map_err(unavailable)?;
            for (doc, version) in docs {
                list.extend(Self::parse_instance(doc, version)?);
            }
        }
        list.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(list)
    }

    async fn process_commit(
        &self,
        process: &str,
        commit: ProcessCommit<'_>,
    ) -> Result<u64, BackendError> {
        let k = self.keys();
        let pm = k.process_stream();
        let (kind, entry, payload, reason) = match commit.settle {
            Settle::Nothing => ("none", String::new(), "", ""),
            Settle::Ack(d) => ("ack", self.entry_of(d, pm)?, "", ""),
            Settle::DeadLetter(d, reason) => {
                ("dead", self.entry_of(d, pm)?, d.payload.as_str(), reason)
            }
            Settle::ResolveDeadLetter(_) => {
                return Err(corrupt("process commits do not resolve dead letters"))
            }
        };
        let (id, doc, version) = match commit.instance {
            Some(i) => (
                i.id.clone(),
                serde_json::to_string(i).map_err(corrupt)?,
                i.version,
            ),
            None => (String::new(), String::new(), 0),
        };
        let mut invocation = s::PROCESS_COMMIT.prepare_invoke();
        invocation
            .key(k.instance(process, &id))
            .key(k.instances(process))
            .key(k.queue(pm))
            .key(k.scheduled())
            .key(k.dead(pm));
        for (field, value) in commit.add_keys.iter().chain(&commit.remove_keys) {
            invocation.key(k.correlation(process, field, value));
        }
        for (endpoint, _) in &commit.endpoints {
            invocation.key(k.endpoint(endpoint));
        }
        invocation
            .arg(if commit.instance.is_some() { "1" } else { "0" })
            .arg(version)
            .arg(doc)
            .arg(&id)
            .arg(if commit.delete { "1" } else { "0" })
            .arg(commit.add_keys.len())
            .arg(commit.remove_keys.len())
            .arg(commit.endpoints.len())
            .arg(commit.enqueue.len())
            .arg(commit.schedule.len())
            .arg(kind)
            .arg(entry)
            .arg(&self.shared.config.group)
            .arg(payload)
            .arg(reason)
            .arg(Timestamp::now().0);
        for payload in &commit.enqueue {
            invocation.arg(payload);
        }
        for (_, payload) in &commit.endpoints {
            invocation.arg(payload);
        }
        for (due, payload) in &commit.schedule {
            invocation.arg(*due).arg(payload);
        }
        let reply: Vec<Value> = invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        match reply.first() {
            Some(Value::Int(v)) if *v >= 0 => Ok(*v as u64),
            Some(Value::Int(_)) => Err(BackendError::ProcessConflict {
                process: process.to_owned(),
                instance: id,
            }),
            _ => Err(corrupt("unexpected reply from the process commit script")),
        }
    }

    async fn process_enqueue(&self, payloads: &[String]) -> Result<(), BackendError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        let queue = self.keys().queue(self.keys().process_stream());
        for payload in payloads {
            pipe.cmd("XADD")
                .arg(&queue)
                .arg("*")
                .arg("payload")
                .arg(payload)
                .ignore();
        }
        let _: () = pipe
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn process_release_due(&self, now_ms: u64, limit: usize) -> Result<usize, BackendError> {
        let moved: usize = s::RELEASE_DUE
            .key(self.keys().scheduled())
            .key(self.keys().queue(self.keys().process_stream()))
            .arg(now_ms)
            .arg(limit)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(moved)
    }

    async fn process_scheduled(&self) -> Result<Vec<(u64, String)>, BackendError> {
        let entries: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(self.keys().scheduled())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(entries
            .into_iter()
            .map(|(payload, due)| (due as u64, payload))
            .collect())
    }

    async fn endpoint_messages(&self, endpoint: &str) -> Result<Vec<String>, BackendError> {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(self.keys().endpoint(endpoint))
            .arg("-")
            .arg("+")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(reply
            .ids
            .iter()
            .map(|e| match e.map.get("payload") {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            })
            .collect())
    }

    async fn named_lease(
        &self,
        name: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let held: i64 = s::NAMED_LEASE
            .key(self.keys().lease(name))
            .arg(token)
            .arg(ms(ttl))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(held == 1)
    }

    async fn release_named_lease(&self, name: &str, token: &str) -> Result<bool, BackendError> {
        let released: i64 = s::UNLOCK
            .key(self.keys().lease(name))
            .arg(token)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(released == 1)
    }

    async fn cancellations(&self) -> Result<BoxStream<'static, TaskId>, BackendError> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let client = self.shared.client.clone();
        let channel = self.keys().cancel_channel();
        // Resubscribes after a disconnect; ends when the receiver is dropped.
        tokio::spawn(async move {
            loop {
                match client.get_async_pubsub().await {
                    Ok(mut pubsub) => {
                        if pubsub.subscribe(&channel).await.is_ok() {
                            let mut messages = pubsub.on_message();
                            while let Some(msg) = messages.next().await {
                                let Ok(text) = msg.get_payload::<String>() else {
                                    continue;
                                };
                                if let Ok(id) = text.parse::<TaskId>() {
                                    if tx.send(id).is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                    }
                    Err(error) => {
                        tracing::debug!(%error, "cancellation subscription failed; retrying")
                    }
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Ok(tokio_stream_from(rx))
    }
}

impl RedisBackend {
    /// The lock script: takes the lease and, with `load`, reads the task and
    /// its cancellation flag in the same round trip.
    fn lock_script(
        &self,
        id: TaskId,
        token: &str,
        ttl: Duration,
        load: bool,
    ) -> redis::ScriptInvocation<'static> {
        let k = self.keys();
        let mut invocation = s::LOCK.prepare_invoke();
        invocation
            .key(k.lock(id))
            .key(k.fence(id))
            .key(k.task(id))
            .key(k.cancel(id))
            .arg(token)
            .arg(ms(ttl))
            .arg(if load { "1" } else { "0" });
        invocation
    }

    /// The stream entry id of a delivery, checked to be in partition `p`.
    fn entry_of(&self, delivery: &Delivery, p: u16) -> Result<String, BackendError> {
        match self.keys().split_id(&delivery.id) {
            Some((dp, entry)) if dp == p => Ok(entry.to_owned()),
            _ => Err(corrupt(format!(
                "delivery {} is not in partition {p}",
                delivery.id
            ))),
        }
    }
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<TaskId>,
) -> BoxStream<'static, TaskId> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}
