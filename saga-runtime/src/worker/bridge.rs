//! A route's bridge: a broker's deliveries into the store, then their
//! acknowledgement (see [`crate::transport`]).
//!
//! One engine of a deployment bridges a route at a time (the named lease
//! `bridge:<transport>:<route>`): one reader keeps the route's order, and
//! the others stand by to take over within a lease's TTL. A batch of
//! deliveries becomes one store write where it can (the envelopes of its
//! messages, enqueued together), a keyed start per command and a dead
//! letter per delivery that is not a message; only once every write of the
//! batch committed is the batch acknowledged. A write that fails is
//! retried, the deliveries kept meanwhile; a bridge that dies first leaves
//! them to be delivered again, and every copy is recognised by its id.
//!
//! The bridge does not outrun the workers: while the store's queue holds
//! more process-manager messages than the engine's backlog bound, it
//! waits (the broker keeps the rest, as brokers do).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::held_lease::HeldLease;
use super::runtime::Runtime;
use crate::error::Error;
use crate::model::envelope::{Envelope, EnvelopeKind};
use crate::model::task::TaskId;
use crate::model::wire::WorkItem;
use crate::transport::wire::{self, Read};
use crate::transport::{Inbound, Incoming, Route, RouteKind, TransportError};
use crate::util::BoxFuture;

/// Deliveries taken in one go (and so the most one store write carries).
pub(crate) const BATCH: usize = 256;

/// How long one receive waits for a delivery.
const WAIT: Duration = Duration::from_secs(1);

/// Starts a task of a saga from JSON, keyed (the engine's `start_json`).
pub(crate) type Starter = Arc<
    dyn Fn(&'static str, Value, String) -> BoxFuture<'static, Result<TaskId, Error>> + Send + Sync,
>;

/// One route of one transport, and what its bridge needs.
#[derive(Clone)]
pub(crate) struct Bridge {
    pub rt: Arc<Runtime>,
    pub carried: Arc<super::transports::Carried>,
    pub route: Route,
    pub start: Starter,
}

/// What one delivery becomes in the store (where it lands).
enum Landing {
    /// An envelope for the route's process manager.
    Envelope(Box<WorkItem>),
    /// A task of the route's saga.
    Start { key: String, input: Value },
    /// A dead letter.
    Park { payload: String, reason: String },
    /// Nothing (a message for another process manager).
    Nothing,
}

/// Whether the store's queue has room, asked at most every
/// [`ROOM_EVERY`] (one round trip per batch cost more than the batch's
/// own write when batches are small).
#[derive(Default)]
struct Room {
    asked: Option<(tokio::time::Instant, bool)>,
}

/// How long an answer about the store's backlog stands.
const ROOM_EVERY: Duration = Duration::from_millis(250);

impl Room {
    async fn left(&mut self, bridge: &Bridge) -> bool {
        match self.asked {
            Some((at, room)) if at.elapsed() < ROOM_EVERY => room,
            _ => {
                let room = bridge.has_room().await;
                self.asked = Some((tokio::time::Instant::now(), room));
                room
            }
        }
    }
}

/// Doubling pauses after failures, from 50 ms to 5 s.
struct Pause(Duration);

impl Pause {
    fn new() -> Self {
        Pause(Duration::from_millis(50))
    }

    fn next(&mut self) -> Duration {
        let now = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(5));
        now
    }
}

impl Bridge {
    fn label(&self) -> String {
        format!("{}:{}", self.carried.transport.name(), self.route.name())
    }

    /// Bridges while this engine holds the route's lease, until shutdown.
    pub(crate) async fn run(self) {
        let rt = &self.rt;
        let mut lease = HeldLease::new(format!("bridge:{}", self.label()), rt.lease_ttl());
        let mut pause = Pause::new();
        while !rt.shutdown.is_cancelled() {
            if !lease.holds(rt.leases()).await {
                self.sleep(lease.retry_every()).await;
                continue;
            }
            let opened = match self.carried.declared().await {
                Ok(()) => self.carried.transport.receiver(&self.route).await,
                Err(error) => Err(error),
            };
            let failed = match opened {
                Ok(rx) => self.bridge(rx, &mut lease).await.err(),
                Err(error) => Some(error),
            };
            match failed {
                Some(error) => {
                    let delay = pause.next();
                    tracing::warn!(route = %self.label(), %error, ?delay, "broker receive failed; connecting again");
                    self.sleep(delay).await;
                }
                None => pause = Pause::new(),
            }
        }
        lease.release(rt.leases()).await;
    }

    async fn sleep(&self, d: Duration) {
        tokio::select! {
            _ = self.rt.shutdown.cancelled() => {}
            _ = tokio::time::sleep(d) => {}
        }
    }

    /// Takes batches into the store and acknowledges them, while the
    /// lease holds; `Err` when the receiver failed.
    async fn bridge(
        &self,
        mut rx: Box<dyn Inbound>,
        lease: &mut HeldLease,
    ) -> Result<(), TransportError> {
        let rt = &self.rt;
        let mut room = Room::default();
        while !rt.shutdown.is_cancelled() && lease.holds(rt.leases()).await {
            if !room.left(self).await {
                self.sleep(Duration::from_millis(200)).await;
                continue;
            }
            let batch = tokio::select! {
                _ = rt.shutdown.cancelled() => return Ok(()),
                received = rx.receive(BATCH, WAIT) => received?,
            };
            if batch.is_empty() {
                continue;
            }
            let writes: Vec<Landing> = batch.iter().map(|d| self.write_of(d)).collect();
            if !self.store(&mut *rx, &batch, writes).await? {
                // Shutting down before the store took them: back to the
                // broker, for whoever bridges next.
                rx.release(&batch).await?;
                return Ok(());
            }
            rx.ack(&batch).await?;
            crate::metrics::bridged(self.carried.transport.name(), batch.len());
        }
        Ok(())
    }

    /// Whether the store's queue has room for more (see the module docs).
    async fn has_room(&self) -> bool {
        let bound = self.rt.settings.transport_backlog;
        match self.rt.backend.queue_stats().await {
            Ok(Some(stats)) => stats.processes.depth + stats.sagas.depth < bound,
            _ => true,
        }
    }

    /// What `d` becomes in the store.
    fn write_of(&self, d: &Incoming) -> Landing {
        let park = |reason: String| Landing::Park {
            payload: String::from_utf8_lossy(&d.body).into_owned(),
            reason: format!("from {} ({}): {reason}", self.label(), d.subject),
        };
        let cap = self.rt.settings.max_deliveries;
        if d.deliveries > cap {
            return park(format!(
                "delivered {} times without being taken into the store (a bridge that \
                 died on it each time?)",
                d.deliveries - 1
            ));
        }
        match wire::read(&self.route.kind, d) {
            Read::Bad(why) => park(why),
            Read::NotOurs(message_type) => self.not_ours(&message_type, park),
            Read::Start { key, input } => Landing::Start { key, input },
            Read::Message {
                message_id,
                message_type,
                payload,
                traceparent,
            } => match self.envelope(message_id, &message_type, payload, traceparent) {
                Some(item) => Landing::Envelope(Box::new(item)),
                None => park(format!("no process manager here handles `{message_type}`")),
            },
        }
    }

    /// A message of a type the route's process manager does not handle:
    /// another's, or nobody's. Nobody's is dead-lettered, by one route only
    /// (the first process manager's by name, whose bridge sees every
    /// event as the others' do); another's is left to its own route.
    fn not_ours(&self, message_type: &str, park: impl Fn(String) -> Landing) -> Landing {
        if self.rt.routes.contains_key(message_type) {
            return Landing::Nothing;
        }
        let first = self.rt.processes.keys().min().copied();
        match &self.route.kind {
            RouteKind::Process { process, .. } if Some(*process) == first => park(format!(
                "no process manager of this engine handles messages of type `{message_type}`"
            )),
            _ => Landing::Nothing,
        }
    }

    /// The envelope of a message for the route's process manager.
    fn envelope(
        &self,
        message_id: String,
        message_type: &str,
        payload: Value,
        traceparent: Option<String>,
    ) -> Option<WorkItem> {
        let RouteKind::Process {
            process,
            message_types,
        } = &self.route.kind
        else {
            return None;
        };
        let message_type = *message_types.iter().find(|t| **t == message_type)?;
        let pm = self.rt.processes.get(process)?;
        let (key, key_field) = crate::process::routing_key(pm.as_ref(), message_type, &payload);
        Some(WorkItem::Process(Envelope {
            message_id,
            process: (*process).to_owned(),
            message_type: message_type.to_owned(),
            payload,
            kind: EnvelopeKind::Message,
            instance_id: None,
            generation: None,
            failures: 0,
            key,
            key_field,
            traceparent,
            due_ms: None,
            hops: 0,
            hold_until: None,
        }))
    }

    /// Writes `writes` (of `batch`), retrying what fails (the deliveries
    /// kept meanwhile) until each is written; `false` if the engine shut
    /// down first.
    async fn store(
        &self,
        rx: &mut dyn Inbound,
        batch: &[Incoming],
        mut writes: Vec<Landing>,
    ) -> Result<bool, TransportError> {
        let mut pause = Pause::new();
        let mut kept = tokio::time::Instant::now();
        loop {
            match self.write(&mut writes).await {
                Ok(()) => return Ok(true),
                Err(error) => {
                    let delay = pause.next();
                    tracing::warn!(route = %self.label(), %error, ?delay, "the store did not take a batch of broker messages; retrying");
                }
            }
            if self.rt.shutdown.is_cancelled() {
                return Ok(false);
            }
            if kept.elapsed() >= Duration::from_secs(5) {
                rx.keep(batch).await?;
                kept = tokio::time::Instant::now();
            }
            self.sleep(pause.0).await;
        }
    }

    /// Writes what is left of `writes`, each marked done (`Nothing`) once
    /// written, so that a retry does not write it again.
    async fn write(&self, writes: &mut [Landing]) -> Result<(), Error> {
        let items: Vec<WorkItem> = writes
            .iter()
            .filter_map(|w| match w {
                Landing::Envelope(item) => Some((**item).clone()),
                _ => None,
            })
            .collect();
        if !items.is_empty() {
            self.rt.backend.enqueue(&items).await?;
            for w in writes.iter_mut() {
                if matches!(w, Landing::Envelope(_)) {
                    *w = Landing::Nothing;
                }
            }
        }
        for w in writes.iter_mut() {
            match w {
                Landing::Start { key, input } => {
                    let RouteKind::Start { saga } = &self.route.kind else {
                        *w = Landing::Nothing;
                        continue;
                    };
                    match (self.start)(saga, input.clone(), key.clone()).await {
                        Ok(_) => *w = Landing::Nothing,
                        Err(Error::Unavailable { source, .. } | Error::Backend(source)) => {
                            return Err(Error::Backend(source))
                        }
                        // The command cannot start a task (an input that does
                        // not decode, a key reused with another input): parked.
                        Err(refused) => {
                            *w = Landing::Park {
                                payload: input.to_string(),
                                reason: format!("from {}: {refused}", self.label()),
                            }
                        }
                    }
                }
                Landing::Park { .. } | Landing::Envelope(_) | Landing::Nothing => {}
            }
        }
        for w in writes.iter_mut() {
            if let Landing::Park { payload, reason } = w {
                tracing::error!(route = %self.label(), %reason, "broker message dead-lettered");
                self.rt.backend.park(payload, reason).await?;
                crate::metrics::dead_lettered(crate::metrics::DeadLetterKind::Undecodable);
                *w = Landing::Nothing;
            }
        }
        Ok(())
    }
}
