//! The work queue: deliveries with a visibility timeout, handed back,
//! delayed or dead-lettered.

use std::time::Duration;

use async_trait::async_trait;

use super::{BackendError, Locked, ProcessInstance, QueueMessage, WorkItem};
use crate::model::task::TaskId;

/// A message handed to a worker; settle it (commit, acknowledge,
/// dead-letter) or release it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Backend-assigned id (for Redis: partition and stream entry id).
    pub id: String,
    /// The decoded message, or why the entry could not be decoded.
    pub item: Result<WorkItem, String>,
    /// The entry as text (lossy for bytes that are not UTF-8), kept for the
    /// dead-letter queue and logs.
    pub raw: String,
    /// Deliveries of this message that were not answered (neither settled
    /// nor released by a live worker), this one included: 1 for a first
    /// delivery. A worker that dies while handling it (a poison message that
    /// aborts the process) leaves its delivery unanswered; the engine
    /// dead-letters a message once this exceeds its cap.
    pub deliveries: u32,
    /// The consumer it was delivered to.
    pub consumer: String,
    /// The lease on the message's task, when the backend tried to take it
    /// in the same round trip as the read (the Redis backend does, for a
    /// saga message whose task exists). `None`: the worker takes it itself
    /// with [`TaskStore::lock_and_load`](super::TaskStore::lock_and_load). A taken lease belongs to the
    /// worker the message was delivered to: it releases it whatever it
    /// does with the message.
    pub lease: Option<TakenLease>,
    /// The process-manager instance the message is for, when the backend
    /// loaded it in the same round trip as the read (the Redis backend
    /// does, for an envelope that names its instance or carries its
    /// routing key). `None`: the worker loads it.
    pub instance: Option<Box<LoadedInstance>>,
}

/// A process-manager instance loaded while delivering a message for it.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedInstance {
    /// What it was looked up by: an instance id, or a value of `key_field`.
    pub key: String,
    /// The state property `key` is a value of; `None` for an instance id.
    pub key_field: Option<String>,
    /// The instance found, if any.
    pub instance: Option<ProcessInstance>,
}

impl LoadedInstance {
    /// The same record as found by `lookup` (an id, or a value of a field
    /// it holds), if that lookup finds it; `None` if it cannot tell.
    pub(crate) fn found_by(self, lookup: (String, Option<&str>)) -> Option<LoadedInstance> {
        match lookup {
            (key, None) if key == self.key && self.key_field.is_none() => Some(self),
            (value, Some(field)) => {
                let holds = self
                    .instance
                    .as_ref()?
                    .keys
                    .iter()
                    .any(|(f, v)| f == field && *v == value);
                holds.then(|| LoadedInstance {
                    key: value,
                    key_field: Some(field.to_owned()),
                    instance: self.instance,
                })
            }
            _ => None,
        }
    }
}

/// A task lease taken while delivering the task's message.
#[derive(Debug, Clone)]
pub enum TakenLease {
    /// The lease is held, and the task loaded under it.
    Held {
        /// What [`TaskStore::lock_and_load`](super::TaskStore::lock_and_load) would have returned.
        locked: Box<Locked>,
        /// When the read that took it was sent: the lease runs from then
        /// at the latest.
        requested_at: tokio::time::Instant,
        /// How long it was taken for (the backend's visibility timeout,
        /// which may differ from the engine's lease TTL).
        ttl: Duration,
    },
    /// Another worker holds the task's lease.
    Busy,
}

/// How a write settles the message being processed.
#[derive(Debug, Clone, Copy)]
pub enum Settle<'a> {
    /// Nothing to settle (an operator action, not a delivery).
    Nothing,
    /// Acknowledge it: its effect is recorded.
    Ack(&'a Delivery),
    /// Acknowledge it and park a copy on the dead-letter queue.
    DeadLetter(&'a Delivery, &'a str),
    /// Remove this entry from the dead-letter queue: an operator requeued
    /// its task, and the commit enqueues the task's next message.
    ResolveDeadLetter(&'a str),
}

/// How a delivery is settled on its own, outside a task's write
/// ([`WorkQueue::settle_delivery`]). Inside one, [`Settle`] says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling<'a> {
    /// Acknowledged: it will not be delivered again.
    Ack,
    /// Handed back unsettled, delivered again after the delay (promptly,
    /// not after the visibility timeout); the delivery counts as answered.
    Release(Duration),
    /// Handed back like [`Release`](Self::Release), but the delivery
    /// counts as unanswered, so that a message no worker can handle still
    /// reaches the delivery cap.
    Defer(Duration),
    /// Acknowledged, and a copy parked on the dead-letter queue with
    /// `reason` (and the task's id, when it is a task's message).
    DeadLetter {
        /// Why it was parked, for the operator.
        reason: &'a str,
        /// The task the message advanced, if known.
        task: Option<TaskId>,
    },
}

/// The kinds of work a worker takes: an engine that runs no process
/// managers must not take (and dead-letter) their messages, nor one that
/// runs no sagas saga messages, when deployments share a Redis. An entry
/// that does not decode is for anyone (to dead-letter with the reason); on
/// Redis, for the workers that read the stream it was written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    /// Saga task messages.
    pub sagas: bool,
    /// Process-manager messages and timeouts.
    pub processes: bool,
    /// Which process-manager partitions, a bit each, as
    /// [`Partitions::process_partitions`](super::Partitions::process_partitions) handed them out (every one by
    /// default). A backend that does not partition ignores it.
    pub process_partitions: u64,
}

impl Interest {
    /// Every kind.
    pub const ALL: Interest = Interest {
        sagas: true,
        processes: true,
        process_partitions: u64::MAX,
    };

    /// Whether a worker with this interest takes `item`.
    pub fn takes(&self, item: &Result<WorkItem, String>) -> bool {
        match item {
            Ok(WorkItem::Process(_)) => self.processes,
            Ok(WorkItem::Saga(_)) => self.sagas,
            Err(_) => true,
        }
    }
}

/// The backlog of the work queue ([`WorkQueue::queue_stats`]), by kind of
/// message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Saga task messages (and entries that decode as nothing).
    pub sagas: QueueBacklog,
    /// Process-manager messages and timeouts.
    pub processes: QueueBacklog,
}

/// The backlog of one kind of message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueBacklog {
    /// Messages on the queue and not yet settled: waiting to be taken, or
    /// taken and being worked on. Delayed messages (retry backoffs,
    /// timeouts) count once they are due and on the queue.
    pub depth: u64,
    /// How long the oldest of them has been on the queue (since it was
    /// enqueued, or last handed back); `None` when there are none.
    pub oldest: Option<Duration>,
}

/// The work queue: [`WorkItem`]s delivered to workers, redelivered when not
/// settled within the visibility timeout, delayed, or dead-lettered.
#[async_trait]
pub trait WorkQueue: Send + Sync + 'static {
    /// How long a delivered, unsettled message stays invisible before it is
    /// delivered again. The engine sizes its task leases on it, so that a
    /// dead worker's tasks resume on the order of this timeout.
    fn visibility_timeout(&self) -> Duration;

    /// Enqueues messages (publishing process-manager messages from outside
    /// a handler).
    async fn enqueue(&self, items: &[WorkItem]) -> Result<(), BackendError>;

    /// Enqueues an entry as it is, without encoding: for bridges and for
    /// tests of bad input. An entry that does not decode is delivered with
    /// an error `item`.
    async fn enqueue_raw(&self, payload: &[u8]) -> Result<(), BackendError>;

    /// The next message of a kind in `interest`, waiting up to `wait` for
    /// one. Messages of other kinds stay for workers that take them.
    async fn receive(
        &self,
        consumer: &str,
        interest: Interest,
        wait: Duration,
    ) -> Result<Option<Delivery>, BackendError>;

    /// Up to `max` messages of kinds in `interest`, waiting up to `wait`
    /// for any: the worker works on all of them at once, so a backend
    /// hands out only what is to be started now. `in_flight` messages
    /// delivered to `consumer` are still being worked on: a backend that
    /// re-reads a consumer's own unsettled messages (after a read whose
    /// reply was lost) must not hand those out again. The default receives
    /// one; a network backend should read several in one round trip.
    async fn receive_many(
        &self,
        consumer: &str,
        interest: Interest,
        wait: Duration,
        max: usize,
        in_flight: usize,
    ) -> Result<Vec<Delivery>, BackendError> {
        let _ = (max, in_flight);
        Ok(self
            .receive(consumer, interest, wait)
            .await?
            .into_iter()
            .collect())
    }

    /// Keeps an in-flight message from being redelivered while it is worked
    /// on.
    async fn touch(&self, delivery: &Delivery) -> Result<(), BackendError>;

    /// Settles `delivery` on its own, outside a task's write: the one
    /// write a store implements for [`ack`](Self::ack),
    /// [`release`](Self::release), [`defer`](Self::defer) and
    /// [`dead_letter`](Self::dead_letter), which are provided on top of it.
    async fn settle_delivery(
        &self,
        delivery: &Delivery,
        how: Handling<'_>,
    ) -> Result<(), BackendError>;

    /// Acknowledges a message: it will not be delivered again.
    ///
    /// Provided ([`Handling::Ack`]).
    async fn ack(&self, delivery: &Delivery) -> Result<(), BackendError> {
        self.settle_delivery(delivery, Handling::Ack).await
    }

    /// Hands a message back unsettled, to be delivered again after `delay`
    /// (promptly: not after the visibility timeout). The delivery counts as
    /// answered.
    ///
    /// Provided ([`Handling::Release`]).
    async fn release(&self, delivery: &Delivery, delay: Duration) -> Result<(), BackendError> {
        self.settle_delivery(delivery, Handling::Release(delay))
            .await
    }

    /// Hands a message back like [`release`](Self::release), but its
    /// delivery counts as unanswered: for a message this worker cannot
    /// handle (its saga is not deployed here yet), so that one no worker
    /// can handle still reaches the delivery cap.
    ///
    /// Provided ([`Handling::Defer`]).
    async fn defer(&self, delivery: &Delivery, delay: Duration) -> Result<(), BackendError> {
        self.settle_delivery(delivery, Handling::Defer(delay)).await
    }

    /// `consumer` is leaving (a graceful shutdown): hands back what was
    /// delivered to it and not handed out yet, so that nothing waits out
    /// the visibility timeout.
    async fn leave(&self, consumer: &str) -> Result<(), BackendError> {
        let _ = consumer;
        Ok(())
    }

    /// Acknowledges a message and parks a copy on the dead-letter queue.
    ///
    /// Provided ([`Handling::DeadLetter`]).
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &str,
        task_id: Option<TaskId>,
    ) -> Result<(), BackendError> {
        let how = Handling::DeadLetter {
            reason,
            task: task_id,
        };
        self.settle_delivery(delivery, how).await
    }

    /// Parks `payload`, a message that never was on the queue (a broker
    /// delivery that is not a message: garbage, an unknown type, no id),
    /// on the dead-letter queue with `reason`, so that an operator sees
    /// it; the payload is cut to the dead-letter size limit, as a
    /// delivery's is. The default enqueues it as an entry that does not
    /// decode, which a worker then parks with a reason of its own.
    async fn park(&self, payload: &str, reason: &str) -> Result<(), BackendError> {
        let _ = reason;
        self.enqueue_raw(payload.as_bytes()).await
    }

    /// Moves delayed messages that fell due onto the queue, at most `limit`;
    /// returns how many moved. Backends that promote them on `receive` may
    /// return 0.
    async fn release_due(&self, limit: usize) -> Result<usize, BackendError>;

    /// Makes `message` due now if it still waits as a delayed message (a
    /// task parked by a flow-control limit, woken because a slot freed),
    /// whether or not its delay already ran out (the timer poller may not
    /// have moved it yet); true when this call moved it. A message already
    /// moved, taken or gone is left alone, so a late or repeated wake does
    /// nothing. `Ok(false)`, the default: the parked task comes back when
    /// its delay ends.
    async fn wake(&self, message: &QueueMessage) -> Result<bool, BackendError> {
        let _ = message;
        Ok(false)
    }

    /// The queue's backlog, for the `saga_queue_*` metrics: every engine
    /// running workers asks once per housekeeping interval, so it must be
    /// cheap (one round trip, no scan of the messages). `None`, the
    /// default: this backend cannot tell.
    async fn queue_stats(&self) -> Result<Option<QueueStats>, BackendError> {
        Ok(None)
    }
}
