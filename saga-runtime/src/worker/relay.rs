//! An endpoint's relay: what handlers sent (the outbox their atomic saves
//! wrote) published to a broker, each message settled only once the
//! broker confirmed it (see [`crate::transport`]).
//!
//! One engine of a deployment relays an endpoint at a time (the named
//! lease `relay:<transport>:<endpoint>`), reading it as the consumer
//! group `relay-<transport>` one message at a time, in order: the
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

/// How a message's publish went.
enum Sent {
    /// Confirmed, or given up on (parked): settle it.
    Settle(Option<String>),
    /// Not yet: try again after a pause (the publisher is to be opened
    /// again if it failed).
    Again { reopen: bool },
}

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
            let received = endpoints
                .endpoint_receive(
                    self.endpoint(),
                    &self.group(),
                    &rt.instance,
                    rt.lease_ttl(),
                    BLOCK,
                )
                .await;
            let delivery = match received {
                Ok(Some(d)) => d,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(relay = %self.label(), %error, "reading the endpoint failed");
                    self.sleep(BLOCK).await;
                    continue;
                }
            };
            let settled = self
                .relay_one(
                    &*endpoints,
                    &delivery,
                    &mut publisher,
                    &mut lease,
                    &mut pause,
                )
                .await;
            if let Some(dead) = settled {
                let settle = endpoints
                    .endpoint_settle(self.endpoint(), &self.group(), &delivery, dead.as_deref())
                    .await;
                if let Err(error) = settle {
                    // Published, not settled: published again later (the
                    // same id), which receivers drop.
                    tracing::warn!(relay = %self.label(), %error, "settling a relayed message failed");
                }
            }
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

    /// Publishes `d` until the broker confirms it (or it is to be given
    /// up on), keeping it meanwhile; what to settle it with, `None` if the
    /// relay stopped first (it stays pending, for the next relay).
    async fn relay_one(
        &self,
        endpoints: &dyn ProcessBackend,
        d: &EndpointDelivery,
        publisher: &mut Option<Box<dyn Outbound>>,
        lease: &mut HeldLease,
        pause: &mut Duration,
    ) -> Option<Option<String>> {
        let rt = &self.rt;
        let mut refusals = 0u32;
        loop {
            match self.send(d, publisher, &mut refusals).await {
                Sent::Settle(dead) => {
                    *pause = Duration::from_millis(50);
                    return Some(dead);
                }
                Sent::Again { reopen } => {
                    if reopen {
                        *publisher = None;
                    }
                }
            }
            self.sleep(*pause).await;
            *pause = (*pause * 2).min(Duration::from_secs(30));
            if rt.shutdown.is_cancelled() || !lease.holds(rt.leases()).await {
                return None;
            }
            let _ = endpoints
                .endpoint_touch(self.endpoint(), &self.group(), &rt.instance, &d.id)
                .await;
        }
    }

    /// One try at publishing `d`.
    async fn send(
        &self,
        d: &EndpointDelivery,
        publisher: &mut Option<Box<dyn Outbound>>,
        refusals: &mut u32,
    ) -> Sent {
        let message = match wire::outgoing(&d.raw) {
            Ok(message) => message,
            Err(why) => {
                crate::metrics::relayed(self.carried.transport.name(), "dead_lettered");
                return Sent::Settle(Some(format!("not relayed: {why}")));
            }
        };
        let open = match publisher.take() {
            Some(p) => Ok(p),
            None => match self.carried.declared().await {
                Ok(()) => self.carried.transport.publisher().await,
                Err(error) => Err(error),
            },
        };
        let mut p = match open {
            Ok(p) => p,
            Err(error) => {
                tracing::warn!(relay = %self.label(), %error, "no publisher: the message waits in its endpoint");
                return Sent::Again { reopen: true };
            }
        };
        let sent = p.publish(&self.to, &message).await;
        *publisher = Some(p);
        match sent {
            Ok(()) => {
                crate::metrics::relayed(self.carried.transport.name(), "published");
                Sent::Settle(None)
            }
            Err(error) => {
                crate::metrics::relayed(self.carried.transport.name(), "failed");
                let reopen = matches!(error, TransportError::Unavailable(_));
                if reopen {
                    tracing::warn!(relay = %self.label(), %error, "publish not confirmed; the message waits in its endpoint");
                    return Sent::Again { reopen };
                }
                *refusals += 1;
                let cap = self.rt.settings.max_deliveries;
                tracing::error!(relay = %self.label(), message_id = %message.message_id, %error, refusals = *refusals, "the broker did not take a relayed message");
                if *refusals >= cap {
                    crate::metrics::relayed(self.carried.transport.name(), "dead_lettered");
                    return Sent::Settle(Some(format!(
                        "not relayed by {} after {refusals} tries: {error}",
                        self.carried.transport.name()
                    )));
                }
                Sent::Again { reopen }
            }
        }
    }
}
