//! How workers read the work queue: one blocking read per consumer on a
//! connection of its own, taking the message's task lease (or loading its
//! process-manager instance) in the same script, taking over what dead
//! consumers left unsettled, and on a cluster one slot's streams per round.

use std::time::Duration;

use redis::{RedisError, Value};
use tokio::time::Instant;
use uuid::Uuid;

use super::entry::{self, delivery, entries};
use super::scripts::{self as s, Loaded};
use super::server::Conn;
use super::watch::Marks;
use super::{ms, unavailable, RedisBackend};
use crate::backend::{
    BackendError, Delivery, Interest, Lease, LoadedInstance, Locked, TakenLease, TaskStore,
    WorkItem,
};

/// Messages taken over per stream per claim. One: a message claimed but
/// not yet started is not kept alive by anyone, and would be claimed again
/// (and counted as another unanswered delivery) if it waited behind others
/// longer than the visibility timeout. A claim that finds something is
/// followed at once by another, so a backlog still drains quickly.
const CLAIM_BATCH: usize = 1;

/// The process-manager instance `TAKE` loaded with a delivery, if that is
/// what it loaded. One whose record does not parse is left for the worker
/// to load (and meet the problem) the ordinary way.
fn loaded_instance(loaded: &Loaded) -> Option<LoadedInstance> {
    let Loaded::Instance {
        key,
        key_field,
        doc,
        version,
    } = loaded
    else {
        return None;
    };
    let instance = super::process::parse_instance(doc.clone(), version.clone()).ok()?;
    Some(LoadedInstance {
        key: key.clone(),
        key_field: key_field.clone(),
        instance,
    })
}

impl RedisBackend {
    /// The blocking-read connection of a consumer: its own, with a response
    /// timeout longer than the block time (the crate's default would cut a
    /// blocking read off).
    pub(super) async fn reader_conn(&self, consumer: &str) -> Result<Conn, BackendError> {
        if let Some(conn) = self.reader(consumer, |r| r.conn.clone()) {
            return Ok(conn);
        }
        let conn = self
            .shared
            .server
            .blocking(self.shared.config.block)
            .await
            .map_err(unavailable)?;
        self.reader(consumer, |r| r.conn = Some(conn.clone()));
        Ok(conn)
    }

    /// `streams` grouped by hash slot, in order: what one script call may
    /// read on a cluster (on a single server any keys may meet in a script,
    /// but the grouping costs nothing where it is used: claims, once a
    /// half visibility timeout).
    pub(super) fn slot_groups(&self, streams: &[u16]) -> Vec<Vec<u16>> {
        let mut groups: Vec<(u16, Vec<u16>)> = Vec::new();
        for &p in streams {
            let slot = self.keys().stream_slot(p);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, group)) => group.push(p),
                None => groups.push((slot, vec![p])),
            }
        }
        groups.into_iter().map(|(_, group)| group).collect()
    }

    /// Takes over one message whose consumer stopped settling it, from the
    /// first stream (in turn) that has one: a call per slot (each saga
    /// partition is one; the process-manager streams of the compact layout
    /// share one).
    async fn claim(
        &self,
        consumer: &str,
        streams: &[u16],
    ) -> Result<Option<Delivery>, BackendError> {
        let k = self.keys();
        let groups = self.slot_groups(streams);
        let n = groups.len();
        let first = usize::from(self.reader(consumer, |r| r.next_stream));
        for i in 0..n {
            let slot = (first + i) % n;
            let group = &groups[slot];
            let claim = s::Claim {
                queues: group.iter().map(|p| k.queue(*p)).collect(),
                group: self.group(),
                consumer,
                min_idle_ms: ms(self.shared.config.visibility_timeout),
                count: CLAIM_BATCH,
            };
            if let Some(claimed) = self.call(&claim).await? {
                let Some(&p) = group.get(claimed.queue) else {
                    return Err(BackendError::Corrupt("CLAIM answered a bad stream".into()));
                };
                let (id, count) = (claimed.id, claimed.deliveries);
                self.reader(consumer, |r| r.next_stream = (slot + 1) as u16);
                tracing::info!(message = %id, consumer, deliveries = count, "took over a message whose worker stopped");
                return Ok(Some(delivery(p, &id, &claimed.fields, count, consumer)));
            }
        }
        Ok(None)
    }

    /// Reads up to `max` new messages without blocking, and takes the
    /// lease of the task of each saga message (see `TAKE`).
    async fn take(
        &self,
        consumer: &str,
        streams: &[u16],
        own: bool,
        max: usize,
    ) -> Result<Vec<Delivery>, BackendError> {
        let first = usize::from(self.reader(consumer, |r| r.next_stream)) % streams.len();
        let token = Uuid::new_v4().simple().to_string();
        let ttl = self.shared.config.visibility_timeout;
        let k = self.keys();
        let take = s::Take {
            streams: streams
                .iter()
                .map(|p| s::TakeFrom {
                    queue: k.queue(*p),
                    prefix: match (k.is_process(*p), k.pm_partition_of(*p)) {
                        (true, Some(part)) if k.spread() => {
                            format!("pm|{}|{part}|{}", k.process_prefix(*p), k.pm_count())
                        }
                        (true, _) => format!("pm|{}", k.process_prefix(*p)),
                        (false, _) => k.task_prefix(*p),
                    },
                })
                .collect(),
            group: self.group(),
            consumer,
            first,
            own,
            token: &token,
            ttl_ms: ms(ttl),
            max: max.max(1),
        };
        let requested_at = Instant::now();
        let mut deliveries = Vec::new();
        for taken in self.call(&take).await? {
            let slot = taken.stream;
            let Some(&p) = streams.get(slot) else {
                return Err(BackendError::Corrupt(format!(
                    "TAKE answered stream {slot}"
                )));
            };
            self.reader(consumer, |r| r.next_stream = (slot + 1) as u16);
            let mut delivery = delivery(p, &taken.id, &taken.fields, taken.deliveries, consumer);
            match loaded_instance(&taken.loaded) {
                Some(instance) => delivery.instance = Some(Box::new(instance)),
                None => {
                    delivery.lease = self
                        .taken_lease(&delivery, &taken.loaded, &token, requested_at, ttl)
                        .await
                }
            }
            deliveries.push(delivery);
        }
        Ok(deliveries)
    }

    /// Relays a message a commit just left on relay stream `relays` (entry
    /// `entry`) to the endpoint stream `endpoint`, and deletes the entry;
    /// on failure the entry stays, for housekeeping to relay.
    pub(super) async fn relay_now(
        &self,
        relays: &str,
        endpoint: &str,
        envelope: &str,
        entry: &str,
    ) -> bool {
        // At a durability level above the default, the copy waits for the
        // endpoint's shard's replicas (or disk) before the entry goes.
        let appended = self
            .call(&s::EndpointAppend {
                stream: endpoint,
                envelope,
                cap: (self.shared.config.endpoint_max_len as u64).min(super::MAXLEN_LIMIT),
            })
            .await;
        let deleted = match appended {
            Ok(None) => {
                tracing::error!(
                    endpoint,
                    "endpoint full: a relayed message waits until its consumers catch up"
                );
                return false;
            }
            Ok(Some(_)) => redis::cmd("XDEL")
                .arg(relays)
                .arg(entry)
                .query_async::<i64>(&mut self.conn())
                .await
                .map(drop)
                .map_err(super::unavailable),
            Err(error) => Err(error),
        };
        match deleted {
            Ok(()) => true,
            Err(error) => {
                tracing::debug!(%error, endpoint, "relaying an endpoint message failed; housekeeping relays it");
                false
            }
        }
    }

    /// The lease `TAKE` took with a delivery, checked against the decoded
    /// message. One that cannot be used (a record this version cannot
    /// parse, an id that is not the message's) is released at once; the
    /// worker then goes the ordinary way and meets the problem there.
    async fn taken_lease(
        &self,
        delivery: &Delivery,
        loaded: &Loaded,
        token: &str,
        requested_at: Instant,
        ttl: Duration,
    ) -> Option<TakenLease> {
        let is_for = |id| matches!(&delivery.item, Ok(WorkItem::Saga(m)) if m.task_id == id);
        let (fence, id, record, cancel) = match loaded {
            Loaded::Busy { task } => return is_for(*task).then_some(TakenLease::Busy),
            Loaded::Lease {
                fence,
                task,
                record,
                cancel,
            } => (*fence, *task, record, cancel),
            _ => return None,
        };
        let lease = Lease {
            task_id: id,
            token: token.to_owned(),
            fence,
        };
        match super::tasks::parse_doc(record.clone()) {
            Ok(Some(task)) if is_for(id) => Some(TakenLease::Held {
                locked: Box::new(Locked {
                    lease,
                    task: Some(task),
                    cancel_requested: super::tasks::cancel_time(cancel.clone()),
                }),
                requested_at,
                ttl,
            }),
            _ => {
                if let Err(error) = self.unlock(&lease).await {
                    tracing::debug!(%error, task_id = %id, "unlock failed; the lease expires on its own");
                }
                None
            }
        }
    }

    /// The streams a worker with `interest` reads: the saga partitions,
    /// the shared process-manager stream and the process-manager
    /// partitions its engine owns, or both.
    pub(super) fn streams_for(&self, interest: Interest) -> Vec<u16> {
        let k = self.keys();
        let sagas = (0..k.partitions()).filter(|_| interest.sagas);
        let owned = (0..k.pm_count())
            .filter(|p| interest.process_partitions & (1 << p) != 0)
            .map(|p| k.process_partition(p));
        let processes = k
            .shared_streams()
            .into_iter()
            .chain(owned)
            .filter(|_| interest.processes);
        sagas.chain(processes).collect()
    }

    /// Waits up to `wait` for new messages on any stream, at most `max`
    /// (a blocking read over several streams may return that many from
    /// each: the extras are handed back at once).
    async fn read_new(
        &self,
        consumer: &str,
        streams: &[u16],
        wait: Duration,
        max: usize,
    ) -> Result<Vec<Delivery>, BackendError> {
        let mut conn = self.reader_conn(consumer).await?;
        let block = wait.min(self.shared.config.block);
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(self.group())
            .arg(consumer)
            .arg("COUNT")
            .arg(max.max(1))
            .arg("BLOCK")
            .arg(ms(block))
            .arg("STREAMS");
        for p in streams {
            cmd.arg(self.keys().queue(*p));
        }
        for _ in streams {
            cmd.arg(">");
        }
        let reply: Result<Value, RedisError> = cmd.query_async(&mut conn).await;
        match reply {
            Ok(reply) => {
                let mut deliveries = Vec::new();
                for stream in entry::items(&reply) {
                    let [key, list] = entry::items(stream)[..] else {
                        continue;
                    };
                    let key = entry::text(key);
                    let Some(&p) = streams.iter().find(|p| self.keys().queue(**p) == key) else {
                        continue;
                    };
                    for (id, fields) in entries(list) {
                        deliveries.push(delivery(p, &id, fields, 1, consumer));
                    }
                }
                // Up to `max` from each stream: the rest goes straight
                // back (rare: only when the queues were idle).
                for extra in deliveries.split_off(max.max(1).min(deliveries.len())) {
                    if let Err(error) = self.hand_back(&extra, Duration::ZERO, true).await {
                        tracing::debug!(%error, message = %extra.id, "handing back an extra message failed; it is redelivered after the visibility timeout");
                    }
                }
                Ok(deliveries)
            }
            Err(e) => {
                // Drop the connection so the next read reconnects; recreate
                // the groups if the server lost them (a restart without
                // persistence, a failover): then the read simply found
                // nothing this time.
                self.reader(consumer, |r| r.conn = None);
                self.shared.server.failed(&e);
                if e.code() == Some("NOGROUP") {
                    tracing::warn!("the server lost the consumer groups; recreating them");
                    self.ensure_groups().await?;
                    return Ok(Vec::new());
                }
                Err(unavailable(e))
            }
        }
    }

    /// One receive over `streams`: this consumer's own messages whose read
    /// reply was lost (after a failed read; only once nothing else of this
    /// consumer is in flight, or those would be handed out twice: until
    /// then the claim path takes them after the visibility timeout),
    /// messages whose consumer stopped (every half visibility timeout), new
    /// messages (up to `max`), and only then a blocking wait.
    pub(super) async fn receive_from(
        &self,
        consumer: &str,
        streams: &[u16],
        interest: Interest,
        wait: Duration,
        max: usize,
        in_flight: usize,
    ) -> Result<Vec<Delivery>, BackendError> {
        if self.shared.server.is_cluster() {
            return self
                .receive_sharded(consumer, streams, interest, wait, max, in_flight)
                .await;
        }
        let all = [streams.to_vec()];
        if let Some(found) = self.recover_or_claim(consumer, &all, in_flight).await? {
            return Ok(found);
        }
        let new = self.take(consumer, streams, false, max).await?;
        if !new.is_empty() {
            return Ok(new);
        }
        self.read_new(consumer, streams, wait, max).await
    }

    /// What a read looks at before new messages, from `groups` (streams a
    /// script may read together): this consumer's own messages whose read
    /// reply was lost (after a failed read; only once nothing else of this
    /// consumer is in flight, or those would be handed out twice: until
    /// then the claim path takes them after the visibility timeout), then,
    /// every half visibility timeout, messages whose consumer stopped.
    async fn recover_or_claim(
        &self,
        consumer: &str,
        groups: &[Vec<u16>],
        in_flight: usize,
    ) -> Result<Option<Vec<Delivery>>, BackendError> {
        if in_flight == 0 && self.reader(consumer, |r| r.recover) {
            for group in groups {
                let own = self.take(consumer, group, true, 1).await?;
                if !own.is_empty() {
                    return Ok(Some(own));
                }
            }
            self.reader(consumer, |r| r.recover = false);
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
            let streams: Vec<u16> = groups.concat();
            if let Some(delivery) = self.claim(consumer, &streams).await? {
                // More may be waiting: claim again on the next receive.
                self.reader(consumer, |r| r.last_claim = None);
                return Ok(Some(vec![delivery]));
            }
        }
        Ok(None)
    }

    /// [`receive_from`](Self::receive_from) on a cluster, where a script
    /// reads one slot: own messages after a failed read, then claims, then
    /// a round of reads, one call per slot from where the last round found
    /// something; with nothing anywhere, a wait for a watcher's wake-up
    /// (see `watch`) and a read of the stream that grew.
    async fn receive_sharded(
        &self,
        consumer: &str,
        streams: &[u16],
        interest: Interest,
        wait: Duration,
        max: usize,
        in_flight: usize,
    ) -> Result<Vec<Delivery>, BackendError> {
        let groups = self.slot_groups(streams);
        if let Some(found) = self.recover_or_claim(consumer, &groups, in_flight).await? {
            return Ok(found);
        }
        let started = Instant::now();
        // The watchers' counters are marked before a round of reads, so
        // that a message arriving during the round wakes the wait after
        // it; a busy worker (its last round found something) skips that
        // until a round finds nothing, and then reads once more.
        let watching = !wait.is_zero();
        let mut marks = match watching && self.reader(consumer, |r| r.idle) {
            true => Some(self.marks(consumer, interest, streams).await),
            false => None,
        };
        let mut taken = self.take_round(consumer, &groups, max).await?;
        if taken.is_empty() && watching && marks.is_none() {
            marks = Some(self.marks(consumer, interest, streams).await);
            taken = self.take_round(consumer, &groups, max).await?;
        }
        self.reader(consumer, |r| r.idle = taken.is_empty());
        if !taken.is_empty() {
            return Ok(taken);
        }
        let left = wait.saturating_sub(started.elapsed());
        let Some(marks) = marks.filter(|_| !left.is_zero()) else {
            return Ok(Vec::new());
        };
        // Woken: read the stream that grew (the next receive reads them
        // all again, from there).
        let Some(queue) = marks.wait(left).await else {
            return Ok(Vec::new());
        };
        let k = self.keys();
        match groups
            .iter()
            .position(|g| g.iter().any(|p| k.queue(*p) == queue))
        {
            Some(g) => {
                self.reader(consumer, |r| r.next_group = g);
                self.take(consumer, &groups[g], false, max).await
            }
            None => Ok(Vec::new()),
        }
    }

    /// The watchers' counters of the streams this backend's idle workers
    /// are woken for (see [`homes`](Self::homes)).
    async fn marks(&self, consumer: &str, interest: Interest, streams: &[u16]) -> Marks {
        let homes = self.homes(consumer, interest, streams).await;
        let c = &self.shared.config;
        self.shared
            .watch
            .marks(&self.shared.server, &c.group, c.block, &homes)
    }

    /// Reads each slot group in turn, from where the last round found
    /// something, until one has messages.
    async fn take_round(
        &self,
        consumer: &str,
        groups: &[Vec<u16>],
        max: usize,
    ) -> Result<Vec<Delivery>, BackendError> {
        let n = groups.len();
        let first = self.reader(consumer, |r| r.next_group);
        for i in 0..n {
            let g = (first + i) % n;
            let taken = self.take(consumer, &groups[g], false, max).await?;
            if !taken.is_empty() {
                // The next round starts after it: a busy partition does
                // not starve the others.
                self.reader(consumer, |r| r.next_group = g + 1);
                return Ok(taken);
            }
        }
        Ok(Vec::new())
    }

    /// The streams this backend's idle workers are woken for: its share of
    /// the saga partitions (by rank among the backends reading sagas,
    /// renewed now and then) and the process-manager streams it reads.
    async fn homes(&self, consumer: &str, interest: Interest, streams: &[u16]) -> Vec<String> {
        let k = self.keys();
        let mut homes = Vec::new();
        if interest.sagas {
            let watch = &self.shared.watch;
            watch.joined(consumer);
            let (mut place, due) = watch.place();
            if due {
                let renewed = self
                    .call(&s::Readers {
                        readers: k.saga_readers(),
                        member: &watch.member,
                        ttl_ms: Some(ms(super::watch::MEMBERSHIP_TTL)),
                    })
                    .await;
                match renewed {
                    Ok(Some((rank, size))) => {
                        watch.set_place(rank, size);
                        place = watch.place().0;
                    }
                    Ok(None) => {}
                    Err(error) => {
                        tracing::debug!(%error, "renewing this backend's place among the saga readers failed")
                    }
                }
            }
            homes.extend(
                (0..k.partitions())
                    .filter(|p| p % place.size == place.rank)
                    .map(|p| k.queue(p)),
            );
        }
        // The partitions this engine owns, and the shared streams: a
        // message the owner of its partition does not run goes there for
        // an engine that does, which must hear of it at once.
        homes.extend(
            streams
                .iter()
                .filter(|p| k.is_process(**p))
                .map(|p| k.queue(*p)),
        );
        homes
    }
}
