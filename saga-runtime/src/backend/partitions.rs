//! Where process-manager work is placed when a backend keeps partitions
//! apart: which engine reads which partition, and moving a message to its
//! instance's partition. (Which engines run what is [`Runners`](super::Runners).)
//! A backend that does not partition offers none of it (every default
//! here is that answer).

use std::time::Duration;

use async_trait::async_trait;

use super::{BackendError, Delivery};
use crate::model::envelope::Envelope;

/// What a process-manager message is for, as the worker found it before
/// handling it: where [`Partitions::forward`] sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardTo<'a> {
    /// This instance.
    Instance(&'a str),
    /// No instance holds this correlation value (yet): the message may
    /// create one.
    Value(&'a str),
}

/// Placement of process-manager work over partitions and engines
/// ([`Backend::partitions`](super::Backend::partitions)). Every method has
/// the answer of a backend that keeps everything together.
#[async_trait]
pub trait Partitions: Send + Sync + 'static {
    /// Registers (or keeps) `member`, an engine that runs process managers,
    /// among the readers of process-manager messages for `ttl`, and returns
    /// the partitions it owns now, a bit each, for [`Interest`](super::Interest): the
    /// backend balances them over its live members, each partition owned
    /// by one at a time, so that one writer handles the messages of an
    /// instance. `busy`: the partitions `member` still handles messages of
    /// (a bit each, see [`owned_partition`](Self::owned_partition)); one
    /// balanced to another member stays `member`'s, unread, until it is no
    /// longer busy, so that the messages of an instance are handled in the
    /// order read across a hand-over. `None`: this backend does not
    /// partition (every reader reads every message, and versioning alone
    /// settles races).
    async fn process_partitions(
        &self,
        member: &str,
        ttl: Duration,
        busy: u64,
    ) -> Result<Option<u64>, BackendError> {
        let _ = (member, ttl, busy);
        Ok(None)
    }

    /// The partition `delivery` was read from, when it is one that a
    /// single member reads (see [`process_partitions`](Self::process_partitions)).
    fn owned_partition(&self, delivery: &Delivery) -> Option<u16> {
        let _ = delivery;
        None
    }

    /// The partition the messages of `process` for `target` (an instance
    /// id, or a correlation value) are published to.
    fn target_partition(&self, process: &str, target: &str) -> Option<u16> {
        let _ = (process, target);
        None
    }

    /// Lets go of `member`'s partitions (an engine shutting down), so
    /// that the others take them over without waiting for the TTL: at
    /// once, but those in `busy`, which it keeps for `ttl` more (its
    /// messages of them are being finished; it calls again).
    async fn leave_process_partitions(
        &self,
        member: &str,
        busy: u64,
        ttl: Duration,
    ) -> Result<(), BackendError> {
        let _ = (member, busy, ttl);
        Ok(())
    }

    /// Moves a process-manager message off a partition this worker's engine
    /// owns (see [`process_partitions`](Self::process_partitions)) onto the stream every
    /// engine reads: for a message of a process manager the owner does not
    /// run, which an engine that runs it must get. `false`: the message was
    /// on that stream already, or this backend does not partition; the
    /// caller then hands it back as usual.
    async fn share(&self, delivery: &Delivery) -> Result<bool, BackendError> {
        let _ = delivery;
        Ok(false)
    }

    /// Moves a process-manager message to the partition of what it is for
    /// (`to`: the instance the worker found, or the correlation value it
    /// may create one under), if that is another than the one it was read
    /// from: a backend whose partitions are apart (Redis Cluster) commits
    /// an instance only together with a message of the instance's own
    /// partition. `false`: it is where it belongs (always, for a backend
    /// that keeps every partition together); the caller handles it.
    /// `true`: it was moved (naming the instance from then on, and as a
    /// delivery that was not answered, so that a message that moves for
    /// ever still reaches the delivery cap), and this delivery is settled.
    async fn forward(
        &self,
        delivery: &Delivery,
        envelope: &Envelope,
        to: ForwardTo<'_>,
    ) -> Result<bool, BackendError> {
        let _ = (delivery, envelope, to);
        Ok(false)
    }

    /// An id for a new instance of `process` found by correlation value
    /// `near` (one it does not take its id from): random, and for a
    /// backend whose partitions are apart, in the partition of `near`, so
    /// that the instance and its correlation entry share one.
    fn new_instance_id(&self, process: &str, near: &str) -> String {
        let _ = (process, near);
        uuid::Uuid::new_v4().to_string()
    }
}
