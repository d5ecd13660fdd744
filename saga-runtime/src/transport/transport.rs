//! A broker connection as the engine uses it.

use async_trait::async_trait;

use super::{Inbound, Outbound, Route, Topology};

/// Why a broker did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The connection failed or was lost: the engine connects again.
    #[error("the broker is unavailable: {0}")]
    Unavailable(String),
    /// The broker refused a publish (a negative confirmation, a full
    /// queue).
    #[error("the broker refused the message: {0}")]
    Refused(String),
    /// Nothing receives where the message was published to.
    #[error("nothing receives `{0}`: the message was returned unrouted")]
    Unroutable(String),
    /// The topology could not be declared as asked (a queue that exists
    /// with other arguments, a name the broker rejects).
    #[error("the broker's topology is not as this engine needs it: {0}")]
    Topology(String),
}

/// One broker, as the engine uses it
/// ([`EngineBuilder::transport`](crate::EngineBuilder::transport)). The
/// engine declares the topology at start, then opens a receiver per route
/// and a publisher per relayed endpoint, each again whenever it failed.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// Its name in logs, metrics and lease names (`rabbitmq`, `nats`):
    /// two transports of one engine have different names.
    fn name(&self) -> &str;

    /// What the user asked this transport to carry besides the process
    /// managers' routes, which the engine adds: the sagas it starts from
    /// commands, and the endpoints it relays.
    fn asked(&self) -> Topology;

    /// Declares what `topology` needs (exchanges, queues, bindings,
    /// streams, consumers), idempotently: engines of a deployment declare
    /// the same at every start.
    async fn declare(&self, topology: &Topology) -> Result<(), TransportError>;

    /// A receiver of `route`'s deliveries.
    async fn receiver(&self, route: &Route) -> Result<Box<dyn Inbound>, TransportError>;

    /// A publisher.
    async fn publisher(&self) -> Result<Box<dyn Outbound>, TransportError>;
}
