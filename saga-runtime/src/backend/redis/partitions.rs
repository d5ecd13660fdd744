//! Process-manager partitions: which engine reads which partition stream.
//!
//! Every process-manager message goes to one of
//! [`PROCESS_PARTITIONS`](super::keys::PROCESS_PARTITIONS) streams, chosen
//! from its instance id or correlation value, so that the messages of one
//! instance meet in one stream. Each partition is read by one engine at a
//! time, the holder of its owner lease: `BALANCE` spreads the partitions
//! over the engines that renewed their membership within its TTL. An
//! owner keeps a partition balanced away (or left, shutting down) until
//! the messages of it in flight are done (it reads no more of them
//! meanwhile; see the worker's `partitions`), so that the next owner
//! reads an instance's next message only then. One
//! writer per instance is thus the normal case across processes, not
//! only within one; versioning still settles the rare overlap (an owner
//! that stalls past its lease).

use std::time::Duration;

use async_trait::async_trait;

use super::{ms, scripts as s, RedisBackend};
use crate::backend::{BackendError, Delivery, ForwardTo, Partitions, WorkItem};
use crate::model::envelope::Envelope;

impl RedisBackend {
    /// Runs `BALANCE` for `member`; the partitions it owns after it.
    pub(super) async fn balance(
        &self,
        member: &str,
        ttl: Duration,
        leaving: bool,
        busy: u64,
    ) -> Result<u64, BackendError> {
        let k = self.keys();
        let owned = self
            .call(&s::Balance {
                members: k.partition_members(),
                owner_prefix: k.partition_owner_prefix(),
                member,
                ttl_ms: ms(ttl).max(1),
                partitions: k.pm_count(),
                leaving,
                pm_prefix: (!k.spread()).then(|| k.process_prefix(k.process_stream())),
                busy: (0..64).filter(|k| busy & (1 << k) != 0).collect(),
            })
            .await?;
        Ok(owned
            .into_iter()
            .filter(|k| *k < 64)
            .fold(0, |mask, k| mask | 1 << k))
    }
}

/// Moves of a process-manager message between partitions that do not
/// count toward its delivery cap (one is the common case: a message routed
/// by a value its instance holds besides its id).
const FREE_HOPS: u32 = 4;

#[async_trait]
impl Partitions for RedisBackend {
    async fn process_partitions(
        &self,
        member: &str,
        ttl: Duration,
        busy: u64,
    ) -> Result<Option<u64>, BackendError> {
        self.balance(member, ttl, false, busy).await.map(Some)
    }

    async fn leave_process_partitions(
        &self,
        member: &str,
        busy: u64,
        ttl: Duration,
    ) -> Result<(), BackendError> {
        self.balance(member, ttl, true, busy).await.map(drop)
    }

    fn target_partition(&self, process: &str, target: &str) -> Option<u16> {
        Some(self.keys().pm_k(process, target))
    }

    fn owned_partition(&self, delivery: &Delivery) -> Option<u16> {
        let k = self.keys();
        let (stream, _) = k.split_id(&delivery.id)?;
        let p = stream.checked_sub(k.process_partition(0))?;
        (p < k.pm_count()).then_some(p)
    }

    async fn share(&self, delivery: &Delivery) -> Result<bool, BackendError> {
        let (p, entry) = self.locate(delivery)?;
        let k = self.keys();
        if !k.is_process(p) || p == k.shared_stream(p) {
            return Ok(false);
        }
        self.call(&s::Share {
            from: k.queue(p),
            to: k.queue(k.shared_stream(p)),
            group: self.group(),
            entry,
            consumer: &delivery.consumer,
        })
        .await?;
        Ok(true)
    }

    async fn forward(
        &self,
        delivery: &Delivery,
        envelope: &Envelope,
        to: ForwardTo<'_>,
    ) -> Result<bool, BackendError> {
        let k = self.keys();
        let (p, entry) = self.locate(delivery)?;
        if !k.spread() || !k.is_process(p) {
            return Ok(false);
        }
        let (target, instance) = match to {
            ForwardTo::Instance(id) => (id, Some(id)),
            ForwardTo::Value(value) => (value, None),
        };
        let to = k.process_route(&envelope.process, target);
        if k.stream_slot(to) == k.stream_slot(p) {
            return Ok(false);
        }
        let moved = Envelope {
            instance_id: instance
                .map(str::to_owned)
                .or_else(|| envelope.instance_id.clone()),
            hops: envelope.hops.saturating_add(1),
            ..envelope.clone()
        };
        // A move answers the delivery, as a hand-back does, up to a bound:
        // past it (a message moving for ever: routing that never settles)
        // each move counts, and the delivery cap ends it.
        let unanswered = match envelope.hops < FREE_HOPS {
            true => delivery.deliveries.saturating_sub(1),
            false => delivery.deliveries,
        };
        // The copy first: a crash in between leaves the message here too,
        // and it is forwarded again (the instance drops the duplicate).
        // At a durability level above the default, the copy waits for the
        // target shard's replicas (or disk) before the source lets go.
        self.query_durable(
            redis::cmd("XADD")
                .arg(k.queue(to))
                .arg("*")
                .arg("payload")
                .arg(WorkItem::Process(moved).encode())
                .arg("unanswered")
                .arg(unanswered)
                .clone(),
        )
        .await?;
        self.call(&s::Ack {
            queue: k.queue(p),
            group: self.group(),
            entry,
        })
        .await?;
        Ok(true)
    }

    fn new_instance_id(&self, process: &str, near: &str) -> String {
        match self.keys().spread() {
            true => self.id_in_partition(process, self.keys().pm_k(process, near)),
            false => uuid::Uuid::new_v4().to_string(),
        }
    }
}
