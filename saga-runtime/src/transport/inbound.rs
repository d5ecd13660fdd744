//! The deliveries of one route, as a broker hands them out.

use std::time::Duration;

use async_trait::async_trait;

use super::TransportError;

/// One delivery, as the broker gave it. `tag` is the receiver's own
/// handle for it (a delivery tag, an acknowledgement subject): pass the
/// delivery back to the receiver that gave it to settle it.
#[derive(Debug, Clone)]
pub struct Incoming {
    /// The message body.
    pub body: Vec<u8>,
    /// Its headers (application properties), as text; binary values are
    /// left out.
    pub headers: Vec<(String, String)>,
    /// The broker's message id, if the sender set one (AMQP `message_id`,
    /// `Nats-Msg-Id`).
    pub message_id: Option<String>,
    /// The message's type, if the sender set one (AMQP `type`).
    pub message_type: Option<String>,
    /// Where it came from: the routing key or subject it was published to.
    pub subject: String,
    /// How many times the broker delivered it, this one included (1 when
    /// it cannot tell).
    pub deliveries: u32,
    /// The receiver's handle for it.
    pub tag: u64,
}

/// The deliveries of one route ([`Transport::receiver`](super::Transport::receiver)).
/// A receiver that lost its connection answers `Err` and is dropped; the
/// engine opens another (whatever it held unacknowledged, the broker
/// delivers again).
#[async_trait]
pub trait Inbound: Send {
    /// Up to `max` deliveries, waiting up to `wait` for the first.
    async fn receive(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Incoming>, TransportError>;

    /// Acknowledges deliveries this receiver gave: their effect is in the
    /// engine's store; they are not delivered again.
    async fn ack(&mut self, taken: &[Incoming]) -> Result<(), TransportError>;

    /// Hands deliveries back to be delivered again (the store could not
    /// take them now), counting the delivery.
    async fn release(&mut self, taken: &[Incoming]) -> Result<(), TransportError>;

    /// Keeps deliveries from being delivered again while the engine is
    /// still at them (a store that is slow to answer): a broker with an
    /// acknowledgement deadline restarts it. The default does nothing.
    async fn keep(&mut self, taken: &[Incoming]) -> Result<(), TransportError> {
        let _ = taken;
        Ok(())
    }
}
