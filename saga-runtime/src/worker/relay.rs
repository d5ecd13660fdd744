//! An endpoint's relay: what handlers sent (the outbox their atomic saves
//! wrote) published to a broker, each message settled only once the
//! broker confirmed it (see [`crate::transport`]).
//!
//! One engine of a deployment relays an endpoint at a time (the named
//! lease `relay:<transport>:<endpoint>`), reading it as the consumer
//! group `relay-<transport>` in order, in batches sent together whose
//! confirmations are awaited in order (a failure leaves the rest of the
//! batch pending, retried from it): the
//! messages of one sending instance reach the broker in the order its
//! saves wrote them. With the broker away, the message waits in the
//! endpoint (retried with growing pauses, kept from other consumers of
//! the group), and so does everything behind it. A publish the broker
//! refuses or cannot route (nothing receives the endpoint yet) is logged
//! as an error and retried; after the delivery cap of such refusals it is
//! parked on the endpoint's dead letters with the reason, so that one
//! message nobody can receive does not hold the endpoint for ever.
//!
//! A relay killed between the broker's confirmation and the settle
//! publishes the message again: the same message id, which a JetStream
//! stream's duplicate window drops, and which a receiver that keeps
//! handled ids (a process manager of this library) recognises.

use std::sync::Arc;
use std::time::Duration;

use super::held_lease::HeldLease;
use super::runtime::Runtime;
use crate::backend::{EndpointDelivery, ProcessBackend};
use crate::model::endpoint::PUBLISHED;
use crate::transport::wire;
use crate::transport::{Destination, Outbound, TransportError};

/// How long a read of the endpoint waits for a message.
const BLOCK: Duration = Duration::from_secs(1);
/// How often the relay removes what every group of its endpoint settled.
const TRIM_EVERY: Duration = Duration::from_secs(5);

/// One relayed destination of one transport.
pub(crate) struct Relay {
    pub rt: Arc<Runtime>,
    pub carried: Arc<super::transports::Carried>,
    pub to: Destination,
}

/// Messages published in one go (one broker wait for all of them).
const BATCH: usize = 64;

impl Relay {
    fn endpoint(&self) -> &str {
        match &self.to {
            Destination::Endpoint(e) => e,
            Destination::Published => PUBLISHED,
        }
    }

    fn label(&self) -> String {
        format!("{}:{}", self.carried.transport.name(), self.endpoint())
    }

    /// Relays while this engine holds the endpoint's lease, until
    /// shutdown.
    pub(crate) async fn run(self) {
        let rt = self.rt.clone();
        let Ok(endpoints) = rt.process_store() else {
            tracing::error!(relay = %self.label(), "the store keeps no endpoints: nothing to relay");
            return;
        };
        let mut lease = HeldLease::new(format!("relay:{}", self.label()), rt.lease_ttl());
        let mut publisher: Option<Box<dyn Outbound>> = None;
        let mut trimmed = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(50);
        while !rt.shutdown.is_cancelled() {
            if !lease.holds(rt.leases()).await {
                publisher = None;
                self.sleep(lease.retry_every()).await;
                continue;
            }
            if trimmed.elapsed() >= TRIM_EVERY {
                trimmed = tokio::time::Instant::now();
                let idle = rt.settings.idle_consumers;
                if let Err(error) = endpoints.endpoint_trim(self.endpoint(), idle).await {
                    tracing::debug!(relay = %self.label(), %error, "trimming the endpoint failed");
                }
            }
            let batch = self.take(&*endpoints).await;
            if batch.is_empty() {
                continue;
            }
            self.relay_batch(&*endpoints, batch, &mut publisher, &mut lease, &mut pause)
                .await;
        }
        let _ = endpoints
            .endpoint_leave(self.endpoint(), &self.group(), &rt.instance)
            .await;
        lease.release(rt.leases()).await;
    }

    fn group(&self) -> String {
        format!("relay-{}", self.carried.transport.name())
    }

    async fn sleep(&self, d: Duration) {
        tokio::select! {
            _ = self.rt.shutdown.cancelled() => {}
            _ = tokio::time::sleep(d) => {}
        }
    }

    /// The next messages of the endpoint, in order: waiting up to a read's
    /// block for the first, then what is there, up to [`BATCH`].
    async fn take(&self, endpoints: &dyn ProcessBackend) -> Vec<EndpointDelivery> {
        let rt = &self.rt;
        let mut batch = Vec::new();
        let mut block = BLOCK;
        while batch.len() < BATCH {
            let received = endpoints
                .endpoint_receive(
                    self.endpoint(),
                    &self.group(),
                    &rt.instance,
                    rt.lease_ttl(),
                    block,
                )
                .await;
            match received {
                Ok(Some(d)) => batch.push(d),
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(relay = %self.label(), %error, "reading the endpoint failed");
                    if batch.is_empty() {
                        self.sleep(BLOCK).await;
                    }
                    break;
                }
            }
            block = Duration::ZERO;
        }
        batch
    }

    /// Publishes `batch` in order until the broker confirmed each (or it is
    /// to be given up on), settling what is done as it goes and keeping
    /// the rest meanwhile; what is left when the relay stops stays pending,
    /// for the next relay.
    async fn relay_batch(
        &self,
        endpoints: &dyn ProcessBackend,
        batch: Vec<EndpointDelivery>,
        publisher: &mut Option<Box<dyn Outbound>>,
        lease: &mut HeldLease,
        pause: &mut Duration,
    ) {
        let rt = &self.rt;
        // Entries that are not envelopes are parked at once, in place.
        let mut left: Vec<(EndpointDelivery, crate::transport::Outgoing)> = Vec::new();
        for d in batch {
            match wire::outgoing(&d.raw) {
                Ok(message) => left.push((d, message)),
                Err(why) => {
                    crate::metrics::relayed(self.carried.transport.name(), "dead_lettered");
                    self.settle(endpoints, &[d], Some(format!("not relayed: {why}")))
                        .await;
                }
            }
        }
        let mut refusals = 0u32;
        while !left.is_empty() {
            let messages: Vec<_> = left.iter().map(|(_, m)| m.clone()).collect();
            let (done, failed) = match self.publish(publisher, &messages).await {
                Ok(()) => (left.len(), None),
                Err((done, error)) => (done, Some(error)),
            };
            let rest = left.split_off(done);
            let published: Vec<EndpointDelivery> = left.into_iter().map(|(d, _)| d).collect();
            for _ in &published {
                crate::metrics::relayed(self.carried.transport.name(), "published");
            }
            self.settle(endpoints, &published, None).await;
            left = rest;
            let Some(error) = failed else {
                *pause = Duration::from_millis(50);
                return;
            };
            crate::metrics::relayed(self.carried.transport.name(), "failed");
            if !matches!(error, TransportError::Unavailable(_)) {
                refusals += 1;
                let (d, message) = &left[0];
                tracing::error!(relay = %self.label(), message_id = %message.message_id, %error, refusals, "the broker did not take a relayed message");
                if refusals >= rt.settings.max_deliveries {
                    crate::metrics::relayed(self.carried.transport.name(), "dead_lettered");
                    let why = format!(
                        "not relayed by {} after {refusals} tries: {error}",
                        self.carried.transport.name()
                    );
                    self.settle(endpoints, std::slice::from_ref(d), Some(why))
                        .await;
                    left.remove(0);
                    refusals = 0;
                    continue;
                }
            } else {
                tracing::warn!(relay = %self.label(), %error, "publish not confirmed; the messages wait in their endpoint");
                *publisher = None;
            }
            self.sleep(*pause).await;
            *pause = (*pause * 2).min(Duration::from_secs(30));
            if rt.shutdown.is_cancelled() || !lease.holds(rt.leases()).await {
                return;
            }
            for (d, _) in &left {
                let _ = endpoints
                    .endpoint_touch(self.endpoint(), &self.group(), &rt.instance, &d.id)
                    .await;
            }
        }
    }

    /// Publishes `messages` on the publisher (opened first if need be).
    async fn publish(
        &self,
        publisher: &mut Option<Box<dyn Outbound>>,
        messages: &[crate::transport::Outgoing],
    ) -> Result<(), (usize, TransportError)> {
        let open = match publisher.take() {
            Some(p) => Ok(p),
            None => match self.carried.declared().await {
                Ok(()) => self.carried.transport.publisher().await,
                Err(error) => Err(error),
            },
        };
        let mut p = open.map_err(|e| (0, e))?;
        let sent = p.publish_all(&self.to, messages).await;
        *publisher = Some(p);
        sent
    }

    /// Settles `done` (each with `dead` as its dead letter's reason, if
    /// any), all at once. A settle that fails leaves the message pending:
    /// published again later with the same id, which receivers drop.
    async fn settle(
        &self,
        endpoints: &dyn ProcessBackend,
        done: &[EndpointDelivery],
        dead: Option<String>,
    ) {
        let group = self.group();
        let settles = done
            .iter()
            .map(|d| endpoints.endpoint_settle(self.endpoint(), &group, d, dead.as_deref()));
        for settled in futures::future::join_all(settles).await {
            if let Err(error) = settled {
                tracing::warn!(relay = %self.label(), %error, "settling a relayed message failed");
            }
        }
    }
}
