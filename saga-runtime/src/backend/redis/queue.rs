//! The work queue on Streams consumer groups: enqueueing, settling,
//! handing back, delayed messages and dead-lettering (reading is in
//! `read.rs`, the dead-letter stream as an operator works it in
//! `dead_letters.rs`).

use std::time::Duration;

use async_trait::async_trait;
use redis::Value;

use super::entry::entries;
use super::scripts::{self as s};
use super::{unavailable, RedisBackend};
use crate::backend::{
    truncate_payload, BackendError, Delivery, Handling, Interest, QueueMessage, QueueStats,
    WorkItem, WorkQueue,
};
use crate::util::Unpoisoned;

/// A stream entry id as `(ms, seq)`, for ordering across streams.
pub(super) fn entry_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

impl RedisBackend {
    pub(super) async fn hand_back(
        &self,
        delivery: &Delivery,
        delay: Duration,
        answered: bool,
    ) -> Result<(), BackendError> {
        let (p, entry) = self.locate(delivery)?;
        let released = self
            .call(&s::Release {
                queue: self.keys().queue(p),
                delayed: self.keys().delayed(p),
                group: self.group(),
                consumer: &delivery.consumer,
                entry,
                delay_ms: delay.as_millis().min(1 << 40) as u64,
                answered,
            })
            .await?;
        if released == s::Released::NoPayload {
            // Nothing to copy back: the entry is dead-lettered (parked and
            // settled in one step) instead of settled and lost.
            let reason = match &delivery.item {
                Err(reason) => reason.clone(),
                Ok(_) => "malformed message (a stream entry with no `payload` field)".to_owned(),
            };
            tracing::error!(message = %delivery.id, %reason, "a message with no payload cannot be handed back; dead-lettering it");
            self.dead_letter(delivery, &reason, None).await?;
        }
        Ok(())
    }

    fn queue_of(&self, item: &WorkItem) -> String {
        let k = self.keys();
        match item {
            WorkItem::Saga(m) => k.queue(k.partition_of(m.task_id)),
            WorkItem::Process(envelope) => k.queue(k.envelope_stream(envelope)),
        }
    }
}

#[async_trait]
impl WorkQueue for RedisBackend {
    fn visibility_timeout(&self) -> Duration {
        self.shared.config.visibility_timeout
    }

    async fn enqueue(&self, items: &[WorkItem]) -> Result<(), BackendError> {
        let (processes, sagas): (Vec<&WorkItem>, Vec<&WorkItem>) = items
            .iter()
            .partition(|i| matches!(i, WorkItem::Process(_)));
        if !sagas.is_empty() {
            // One transaction per slot (on a single server, one for all).
            let cluster = self.shared.server.is_cluster();
            let mut pipes: Vec<(u16, redis::Pipeline)> = Vec::new();
            for item in sagas {
                let queue = self.queue_of(item);
                let slot = if cluster {
                    super::keys::slot(&queue)
                } else {
                    0
                };
                let i = match pipes.iter().position(|(s, _)| *s == slot) {
                    Some(i) => i,
                    None => {
                        let mut pipe = redis::pipe();
                        pipe.atomic();
                        pipes.push((slot, pipe));
                        pipes.len() - 1
                    }
                };
                pipes[i]
                    .1
                    .cmd("XADD")
                    .arg(queue)
                    .arg("*")
                    .arg("payload")
                    .arg(item.encode())
                    .ignore();
            }
            for (_, pipe) in pipes {
                let _: () = pipe
                    .query_async(&mut self.conn())
                    .await
                    .map_err(unavailable)?;
            }
        }
        if !processes.is_empty() {
            // A script: partitions are written only while an engine reads
            // them (compact layout). In the spread one, a call per slot.
            let mut calls: Vec<(u16, Vec<&WorkItem>)> = Vec::new();
            for item in processes {
                let slot = match self.keys().spread() {
                    true => super::keys::slot(&self.queue_of(item)),
                    false => 0,
                };
                match calls.iter_mut().find(|(s, _)| *s == slot) {
                    Some((_, items)) => items.push(item),
                    None => calls.push((slot, vec![item])),
                }
            }
            for (_, items) in calls {
                let enqueue = s::EnqueuePm {
                    messages: items
                        .iter()
                        .map(|item| (self.queue_of(item), item.encode()))
                        .collect(),
                    members: (!self.keys().spread()).then(|| self.keys().partition_members()),
                };
                self.call(&enqueue).await?;
            }
        }
        Ok(())
    }

    async fn enqueue_raw(&self, payload: &[u8]) -> Result<(), BackendError> {
        // A well-formed message still goes where its task's keys are: the
        // commit that settles it must touch one partition only.
        let queue = match WorkItem::decode(payload) {
            Ok(item) => self.queue_of(&item),
            Err(_) => self.keys().queue(0),
        };
        let _: String = redis::cmd("XADD")
            .arg(queue)
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
        interest: Interest,
        wait: Duration,
    ) -> Result<Option<Delivery>, BackendError> {
        let mut received = self.receive_many(consumer, interest, wait, 1, 0).await?;
        Ok(received.pop())
    }

    async fn receive_many(
        &self,
        consumer: &str,
        interest: Interest,
        wait: Duration,
        max: usize,
        in_flight: usize,
    ) -> Result<Vec<Delivery>, BackendError> {
        let streams = self.streams_for(interest);
        if streams.is_empty() {
            tokio::time::sleep(wait).await;
            return Ok(Vec::new());
        }
        let received = self
            .receive_from(consumer, &streams, interest, wait, max, in_flight)
            .await;
        if received.is_err() {
            self.reader(consumer, |r| r.recover = true);
        }
        received
    }

    async fn touch(&self, delivery: &Delivery) -> Result<(), BackendError> {
        let (p, entry) = self.locate(delivery)?;
        let _: Value = redis::cmd("XCLAIM")
            .arg(self.keys().queue(p))
            .arg(self.group())
            .arg(&delivery.consumer)
            .arg(0)
            .arg(entry)
            .arg("JUSTID")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn settle_delivery(
        &self,
        delivery: &Delivery,
        how: Handling<'_>,
    ) -> Result<(), BackendError> {
        match how {
            Handling::Ack => {
                let (p, entry) = self.locate(delivery)?;
                self.call(&s::Ack {
                    queue: self.keys().queue(p),
                    group: self.group(),
                    entry,
                })
                .await?;
                Ok(())
            }
            Handling::Release(delay) => self.hand_back(delivery, delay, true).await,
            Handling::Defer(delay) => self.hand_back(delivery, delay, false).await,
            Handling::DeadLetter {
                reason,
                task: task_id,
            } => {
                let (p, entry) = self.locate(delivery)?;
                let (payload, size) =
                    truncate_payload(&delivery.raw, self.shared.config.dead_letter_payload_limit);
                self.call(&s::DeadLetter {
                    queue: self.keys().queue(p),
                    dead: self.keys().dead(p),
                    group: self.group(),
                    entry,
                    payload,
                    reason,
                    task: task_id,
                    size,
                    dead_cap: self.dead_letters_ceiling(),
                })
                .await?;
                Ok(())
            }
        }
    }

    async fn leave(&self, consumer: &str) -> Result<(), BackendError> {
        // Nothing is buffered (a read hands out what it takes); the
        // consumer's reading state (its blocking connection) goes.
        self.shared.readers.locked().remove(consumer);
        // The last saga reader of this backend gives up its place among the
        // readers, so that the others watch its partitions at once.
        if self.shared.watch.left(consumer) {
            self.call(&s::Readers {
                readers: self.keys().saga_readers(),
                member: &self.shared.watch.member,
                ttl_ms: None,
            })
            .await?;
        }
        Ok(())
    }

    /// On the first stream's dead letters, in one script (a dead letter's
    /// time is the server's, and the write is as durable as a dead
    /// letter's).
    async fn park(&self, payload: &str, reason: &str) -> Result<(), BackendError> {
        let (payload, size) =
            truncate_payload(payload, self.shared.config.dead_letter_payload_limit);
        self.call(&s::Park {
            dead: self.keys().dead(0),
            payload,
            reason,
            size,
            dead_cap: self.dead_letters_ceiling(),
        })
        .await?;
        Ok(())
    }

    /// The delayed entry the commit that parked the task left
    /// (`0:<payload>` in its partition's delayed set) moves onto the
    /// partition's queue, in one script. A message handed back with a
    /// delay (`release`, `defer`) carries its count of unanswered
    /// deliveries in its entry and is not found: it comes back when its
    /// delay ends.
    async fn wake(&self, message: &QueueMessage) -> Result<bool, BackendError> {
        let p = self.keys().partition_of(message.task_id);
        self.call(&s::Wake {
            delayed: self.keys().delayed(p),
            queue: self.keys().queue(p),
            payload: WorkItem::Saga(message.clone()).encode(),
        })
        .await
    }

    async fn release_due(&self, limit: usize) -> Result<usize, BackendError> {
        let k = self.keys();
        let mut moved = 0;
        // A call per slot: each saga partition; the process-manager
        // streams of the compact layout share one, each partition of the
        // spread one has its own.
        let all: Vec<u16> = (0..k.streams()).collect();
        for group in self.slot_groups(&all) {
            let release = s::ReleaseDelayed {
                pairs: group.iter().map(|p| (k.delayed(*p), k.queue(*p))).collect(),
                limit,
            };
            moved += self.call(&release).await?;
        }
        Ok(moved)
    }

    /// One pipelined round trip (on a cluster, one per command, at once):
    /// the server's clock, then `XLEN` and the
    /// first entry of every stream. Settled messages are deleted from
    /// their stream, so its length is what waits or is being worked on,
    /// and its first entry the oldest of those.
    async fn queue_stats(&self) -> Result<Option<QueueStats>, BackendError> {
        let k = self.keys();
        let mut cmds = vec![redis::cmd("TIME")];
        for p in 0..k.streams() {
            cmds.push(redis::cmd("XLEN").arg(k.queue(p)).clone());
            cmds.push(
                redis::cmd("XRANGE")
                    .arg(k.queue(p))
                    .arg("-")
                    .arg("+")
                    .arg("COUNT")
                    .arg(1)
                    .clone(),
            );
        }
        let replies = self.query_each(cmds).await?;
        let bad = || super::corrupt("unexpected reply to the queue statistics");
        let (time, streams) = replies.split_first().ok_or_else(bad)?;
        let (secs, micros): (u64, u64) = redis::from_redis_value_ref(time).map_err(|_| bad())?;
        let now_ms = secs * 1000 + micros / 1000;
        let mut stats = QueueStats::default();
        for (p, reply) in (0..k.streams()).zip(streams.chunks(2)) {
            let [len, first] = reply else {
                return Err(bad());
            };
            let backlog = match k.is_process(p) {
                true => &mut stats.processes,
                false => &mut stats.sagas,
            };
            backlog.depth += redis::from_redis_value_ref::<u64>(len).map_err(|_| bad())?;
            if let Some((id, _)) = entries(first).first() {
                let age = Duration::from_millis(now_ms.saturating_sub(entry_order(id).0));
                backlog.oldest = backlog.oldest.max(Some(age));
            }
        }
        Ok(Some(stats))
    }
}
