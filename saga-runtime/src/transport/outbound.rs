//! Publishing to a broker, confirmed.

use async_trait::async_trait;

use super::TransportError;

/// Where a relayed message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// What a handler sent to this endpoint (`ctx.send(endpoint, msg)`):
    /// to the queue (RabbitMQ) or subject (NATS) of that name, in the
    /// transport's naming.
    Endpoint(String),
    /// What a handler published (`ctx.publish(msg)`): to every subscriber
    /// of its type.
    Published,
}

/// A message to publish: the envelope v1 as its body, with its
/// CloudEvents attributes (`wire.rs`), which each broker writes as
/// headers under its binding's prefix (AMQP `cloudEvents_`, NATS `ce-`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The message id (`message_id`, `Nats-Msg-Id`, `ce-id`): a broker
    /// that deduplicates by it drops a relay's second publish.
    pub message_id: String,
    /// `Message::TYPE`.
    pub message_type: String,
    /// The body.
    pub body: Vec<u8>,
    /// The CloudEvents attributes, by their bare names (`id`, `type`,
    /// `source`, `time`, `specversion`, `datacontenttype`).
    pub attributes: Vec<(String, String)>,
}

/// Publishes messages the broker confirms
/// ([`Transport::publisher`](super::Transport::publisher)).
#[async_trait]
pub trait Outbound: Send {
    /// Publishes `message` to `to`, and returns once the broker confirmed
    /// it (stored, routed to at least one queue or stream). `Err` when it
    /// did not: refused, unroutable (nothing receives `to`: an error to
    /// show, not a message to drop), or the connection failed. A
    /// publisher that answered `Err` for its connection is dropped; the
    /// engine opens another.
    async fn publish(&mut self, to: &Destination, message: &Outgoing)
        -> Result<(), TransportError>;

    /// Publishes `messages` to `to` in order, and returns once the broker
    /// confirmed them all, or with how many it confirmed (in order) before
    /// the first that it did not, and why. A broker that keeps a channel's
    /// order may send them all before waiting (one wait for many): the
    /// default publishes one at a time.
    async fn publish_all(
        &mut self,
        to: &Destination,
        messages: &[Outgoing],
    ) -> Result<(), (usize, TransportError)> {
        for (n, message) in messages.iter().enumerate() {
            self.publish(to, message).await.map_err(|e| (n, e))?;
        }
        Ok(())
    }
}
