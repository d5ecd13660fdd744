//! RabbitMQ (AMQP 0-9-1, on lapin): quorum queues in, confirmed publishes
//! out.
//!
//! The names, for the prefix `sagas` ([`RabbitMqConfig::prefix`]; in the
//! style of MassTransit's and NServiceBus's conventions: a durable queue
//! per consumer, bound to an exchange by message type):
//!
//! | what | name | kind |
//! |---|---|---|
//! | where events are published | `sagas` | topic exchange, durable |
//! | a process manager's messages | `sagas.process.<name>` | quorum queue, bound to `sagas` by each `Message::TYPE` it handles |
//! | commands starting saga `<name>` | `sagas.start.<name>` | quorum queue, bound to `sagas` by `start.<name>` |
//! | what the broker itself gives up on | `sagas.dead` | fanout exchange and classic queue |
//! | what a handler sends to endpoint `<e>` | the queue `<e>` | the default exchange, `mandatory` |
//! | what a handler publishes (if relayed) | `sagas`, routing key `Message::TYPE` | |
//!
//! Every queue the engine declares caps deliveries itself
//! (`x-delivery-limit`, [`RabbitMqConfig::delivery_limit`]; RabbitMQ 3.x
//! has no default, 4.x one of 20) and dead-letters what passes it to
//! `sagas.dead` at least once (`x-dead-letter-strategy`, which needs
//! `x-overflow = reject-publish`): nothing is dropped by a broker
//! default. The engine acknowledges a delivery within milliseconds of
//! receiving it (once its store holds it), so the queue's cap is a last
//! resort; the engine's own cap parks the message in its dead letters,
//! with a reason, first.
//!
//! A message for a process manager is a JSON body with CloudEvents
//! attributes in its headers (`cloudEvents_type`, `cloudEvents_id`; also
//! read: `cloudEvents:`), or this library's envelope, or a JSON body with
//! the AMQP `type` and `message_id` properties. What the engine sends
//! carries `message_id`, `type`, `content_type` and the `cloudEvents_*`
//! headers; it is persistent (`delivery_mode` 2).

mod inbound;
mod outbound;
mod topology;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lapin::{Connection, ConnectionProperties};
use tokio::sync::Mutex;

use super::{
    Destination, Inbound, Outbound, Route, RouteKind, Topology, Transport, TransportError,
};
use crate::saga::Saga;

/// The settings of a [`RabbitMq`] transport.
#[derive(Debug, Clone)]
pub struct RabbitMqConfig {
    /// What every name starts with (default `sagas`).
    pub prefix: String,
    /// Deliveries of one message a queue allows before it dead-letters it
    /// to `<prefix>.dead` (`x-delivery-limit`, default 20).
    pub delivery_limit: u32,
    /// Unacknowledged deliveries per receiver (`basic.qos`, default 256):
    /// what one store write takes at most.
    pub prefetch: u16,
    /// How long connecting, declaring or a publisher confirm may take
    /// (default 10 s).
    pub timeout: Duration,
}

impl Default for RabbitMqConfig {
    fn default() -> Self {
        RabbitMqConfig {
            prefix: "sagas".to_owned(),
            delivery_limit: 20,
            prefetch: 256,
            timeout: Duration::from_secs(10),
        }
    }
}

/// A RabbitMQ broker as a transport
/// ([`EngineBuilder::transport`](crate::EngineBuilder::transport)):
///
/// ```no_run
/// # async fn f() -> Result<(), saga_runtime::Error> {
/// use saga_runtime::transport::rabbitmq::RabbitMq;
/// # struct CreateZip;
/// # #[saga_runtime::saga] impl CreateZip { #[saga_step(1)] async fn s(&self, x: u32) -> Result<u32, saga_runtime::StepError> { Ok(x) } }
/// let rabbit = RabbitMq::new("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .starts::<CreateZip>()      // commands on `sagas.start.create-zip` start tasks
///     .relay("invoicing");        // what handlers send to `invoicing` goes to that queue
/// let engine = saga_runtime::Engine::builder()
///     .saga(CreateZip)
///     .transport(rabbit)
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
///
/// Every registered process manager gets its queue (see the module
/// docs).
pub struct RabbitMq {
    shared: Arc<Shared>,
    asked: Topology,
}

pub(super) struct Shared {
    url: String,
    config: RabbitMqConfig,
    /// The connection every receiver and publisher opens its channel on;
    /// replaced once it failed.
    connection: Mutex<Option<Arc<Connection>>>,
}

impl RabbitMq {
    /// A transport on the broker at `url` (`amqp://user:pass@host:port/vhost`),
    /// with the default settings.
    pub fn new(url: &str) -> Self {
        Self::with_config(url, RabbitMqConfig::default())
    }

    /// A transport with `config`.
    pub fn with_config(url: &str, config: RabbitMqConfig) -> Self {
        RabbitMq {
            shared: Arc::new(Shared {
                url: url.to_owned(),
                config,
                connection: Mutex::new(None),
            }),
            asked: Topology::default(),
        }
    }

    /// Starts a task of `S` for each command on `<prefix>.start.<name>`,
    /// keyed by the message's id (a redelivered command starts nothing
    /// new).
    pub fn starts<S: Saga>(mut self) -> Self {
        self.asked.routes.push(Route {
            kind: RouteKind::Start {
                saga: S::definition().name,
            },
        });
        self
    }

    /// Relays what handlers send to `endpoint` to the queue of that name.
    pub fn relay(mut self, endpoint: &str) -> Self {
        self.asked
            .relays
            .push(Destination::Endpoint(endpoint.to_owned()));
        self
    }

    /// Relays what handlers publish to the `<prefix>` exchange, by type,
    /// for other services (this engine's own process managers get it
    /// through the store already).
    pub fn relay_published(mut self) -> Self {
        self.asked.relays.push(Destination::Published);
        self
    }
}

impl Shared {
    /// The open connection, or a new one.
    async fn connection(&self) -> Result<Arc<Connection>, TransportError> {
        let mut held = self.connection.lock().await;
        if let Some(c) = held.as_ref().filter(|c| c.status().connected()) {
            return Ok(c.clone());
        }
        let props = ConnectionProperties::default().with_connection_name("saga-runtime".into());
        let connect = Connection::connect(&self.url, props);
        let c = tokio::time::timeout(self.config.timeout, connect)
            .await
            .map_err(|_| unavailable(format!("no connection within {:?}", self.config.timeout)))?
            .map_err(unavailable)?;
        let c = Arc::new(c);
        *held = Some(c.clone());
        Ok(c)
    }

    /// The queue of `route`.
    fn queue(&self, route: &Route) -> String {
        let prefix = &self.config.prefix;
        match &route.kind {
            RouteKind::Process { process, .. } => format!("{prefix}.process.{process}"),
            RouteKind::Start { saga } => format!("{prefix}.start.{saga}"),
        }
    }
}

/// A failure of the connection or its channel.
fn unavailable(e: impl std::fmt::Display) -> TransportError {
    TransportError::Unavailable(e.to_string())
}

#[async_trait]
impl Transport for RabbitMq {
    fn name(&self) -> &str {
        "rabbitmq"
    }

    fn asked(&self) -> Topology {
        self.asked.clone()
    }

    async fn declare(&self, topology: &Topology) -> Result<(), TransportError> {
        topology::declare(&self.shared, topology).await
    }

    async fn receiver(&self, route: &Route) -> Result<Box<dyn Inbound>, TransportError> {
        Ok(Box::new(
            inbound::Receiver::open(&self.shared, route).await?,
        ))
    }

    async fn publisher(&self) -> Result<Box<dyn Outbound>, TransportError> {
        Ok(Box::new(outbound::Publisher::open(&self.shared).await?))
    }
}
