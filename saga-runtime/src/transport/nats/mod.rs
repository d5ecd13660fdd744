//! NATS JetStream (on async-nats): durable pull consumers in, publishes
//! with `Nats-Msg-Id` out.
//!
//! The names, for the prefix `sagas` ([`NatsConfig::prefix`]) and the
//! stream `SAGAS` ([`NatsConfig::stream`]):
//!
//! | what | subject | JetStream |
//! |---|---|---|
//! | events | `sagas.events.<Message::TYPE>` | the stream `SAGAS`, subjects `sagas.>` |
//! | a process manager's messages | every event | durable consumer `process-<name>`, filter `sagas.events.>` |
//! | commands starting saga `<name>` | `sagas.start.<name>` | durable consumer `start-<name>` |
//! | what a handler sends to endpoint `<e>` | `sagas.send.<e>` | (yours to consume) |
//! | what a handler publishes (if relayed) | `sagas.events.<Message::TYPE>` | |
//!
//! A process manager's consumer reads every event (NATS 2.9 filters a
//! consumer by one subject) and acknowledges those of types it does not
//! handle at once: one consumer per process manager keeps its messages in
//! the order they were stored. JetStream has no dead-letter queue and
//! redelivers without limit by default: every consumer the engine makes
//! caps deliveries (`MaxDeliver`, [`NatsConfig::max_deliver`]) and the
//! engine parks what passes its own cap in its dead letters first, with
//! a reason. `MaxAckPending` follows what one receive takes, and
//! `AckWait` outlasts a store write; a receiver that waits for its store
//! says so (`+WPI`).
//!
//! A message for a process manager is a JSON body with CloudEvents
//! headers (`ce-type`, `ce-id`), or this library's envelope, or a JSON
//! body whose type is the subject's last token and whose id is its
//! `Nats-Msg-Id`. What the engine sends carries `Nats-Msg-Id` (the
//! stream's duplicate window drops a relay's second publish of one
//! message) and the `ce-*` headers.
//!
//! A JetStream publish acknowledgement means stored in memory, not on
//! disk: a file stream syncs every 2 minutes unless the server runs with
//! `sync_interval: always` (see `guide/04-talking-to-other-services.md`).

mod inbound;
mod outbound;

use std::time::Duration;

use async_nats::jetstream::{self, stream::StorageType};
use async_trait::async_trait;
use tokio::sync::Mutex;

use super::{
    Destination, Inbound, Outbound, Route, RouteKind, Topology, Transport, TransportError,
};
use crate::saga::Saga;

/// The settings of a [`Nats`] transport.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// What every subject starts with (default `sagas`).
    pub prefix: String,
    /// The stream (default `SAGAS`).
    pub stream: String,
    /// How long the stream keeps a message (default 7 days): the stream
    /// is bounded by time, as everything is.
    pub max_age: Duration,
    /// The window in which a second publish with one `Nats-Msg-Id` is
    /// dropped (default 2 minutes).
    pub duplicate_window: Duration,
    /// Deliveries of one message a consumer makes at most (`MaxDeliver`,
    /// default 20).
    pub max_deliver: i64,
    /// Unacknowledged deliveries per consumer (`MaxAckPending`) and what
    /// one receive takes (default 256).
    pub prefetch: usize,
    /// How long a delivery may stay unacknowledged before it is delivered
    /// again (`AckWait`, default 30 s).
    pub ack_wait: Duration,
    /// How long connecting, an API call or a publish acknowledgement may
    /// take (default 10 s).
    pub timeout: Duration,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            prefix: "sagas".to_owned(),
            stream: "SAGAS".to_owned(),
            max_age: Duration::from_secs(7 * 24 * 3600),
            duplicate_window: Duration::from_secs(120),
            max_deliver: 20,
            prefetch: 256,
            ack_wait: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
        }
    }
}

/// A NATS server with JetStream as a transport
/// ([`EngineBuilder::transport`](crate::EngineBuilder::transport)); see
/// the module docs for what it declares.
pub struct Nats {
    shared: std::sync::Arc<Shared>,
    asked: Topology,
}

pub(super) struct Shared {
    url: String,
    config: NatsConfig,
    /// One client for everything (it reconnects by itself).
    client: Mutex<Option<async_nats::Client>>,
}

impl Nats {
    /// A transport on the server at `url` (`nats://host:port`).
    pub fn new(url: &str) -> Self {
        Self::with_config(url, NatsConfig::default())
    }

    /// A transport with `config`.
    pub fn with_config(url: &str, config: NatsConfig) -> Self {
        Nats {
            shared: std::sync::Arc::new(Shared {
                url: url.to_owned(),
                config,
                client: Mutex::new(None),
            }),
            asked: Topology::default(),
        }
    }

    /// Starts a task of `S` for each command on `<prefix>.start.<name>`,
    /// keyed by its id.
    pub fn starts<S: Saga>(mut self) -> Self {
        self.asked.routes.push(Route {
            kind: RouteKind::Start {
                saga: S::definition().name,
            },
        });
        self
    }

    /// Relays what handlers send to `endpoint` to `<prefix>.send.<endpoint>`.
    pub fn relay(mut self, endpoint: &str) -> Self {
        self.asked
            .relays
            .push(Destination::Endpoint(endpoint.to_owned()));
        self
    }

    /// Relays what handlers publish to `<prefix>.events.<type>`.
    pub fn relay_published(mut self) -> Self {
        self.asked.relays.push(Destination::Published);
        self
    }
}

fn unavailable(e: impl std::fmt::Display) -> TransportError {
    TransportError::Unavailable(e.to_string())
}

/// A subject token must not hold what NATS reads as structure.
fn token(what: &str, name: &str) -> Result<(), TransportError> {
    let bad = name.is_empty() || name.contains(['.', '*', '>', ' ', '\t', '\r', '\n']);
    match bad {
        true => Err(TransportError::Topology(format!(
            "{what} `{name}` cannot be a NATS subject token: it holds `.`, `*`, `>` or a space"
        ))),
        false => Ok(()),
    }
}

impl Shared {
    async fn client(&self) -> Result<async_nats::Client, TransportError> {
        let mut held = self.client.lock().await;
        if let Some(c) = held.as_ref() {
            return Ok(c.clone());
        }
        let connect = async_nats::ConnectOptions::new()
            .name("saga-runtime")
            .connection_timeout(self.config.timeout)
            .request_timeout(Some(self.config.timeout))
            .connect(self.url.as_str());
        let c = tokio::time::timeout(self.config.timeout + Duration::from_secs(1), connect)
            .await
            .map_err(|_| unavailable(format!("no connection within {:?}", self.config.timeout)))?
            .map_err(unavailable)?;
        *held = Some(c.clone());
        Ok(c)
    }

    async fn context(&self) -> Result<jetstream::Context, TransportError> {
        let client = self.client().await?;
        Ok(jetstream::context::ContextBuilder::new()
            .timeout(self.config.timeout)
            .build(client))
    }

    /// The durable consumer of `route` and the subject it reads.
    fn consumer(&self, route: &Route) -> (String, String) {
        let prefix = &self.config.prefix;
        match &route.kind {
            RouteKind::Process { process, .. } => {
                (format!("process-{process}"), format!("{prefix}.events.>"))
            }
            RouteKind::Start { saga } => {
                (format!("start-{saga}"), format!("{prefix}.start.{saga}"))
            }
        }
    }

    fn consumer_config(&self, route: &Route) -> jetstream::consumer::pull::Config {
        let (name, subject) = self.consumer(route);
        jetstream::consumer::pull::Config {
            durable_name: Some(name),
            filter_subject: subject,
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            deliver_policy: jetstream::consumer::DeliverPolicy::All,
            ack_wait: self.config.ack_wait,
            max_deliver: self.config.max_deliver,
            max_ack_pending: i64::try_from(self.config.prefetch).unwrap_or(i64::MAX),
            ..Default::default()
        }
    }
}

#[async_trait]
impl Transport for Nats {
    fn name(&self) -> &str {
        "nats"
    }

    fn asked(&self) -> Topology {
        self.asked.clone()
    }

    /// The stream, then a durable consumer per route (creating one that
    /// exists with the same settings changes nothing; with other settings,
    /// the server refuses, and the error says so).
    async fn declare(&self, topology: &Topology) -> Result<(), TransportError> {
        let shared = &self.shared;
        let config = &shared.config;
        token("the prefix", &config.prefix)?;
        for route in &topology.routes {
            match &route.kind {
                RouteKind::Process {
                    process,
                    message_types,
                } => {
                    token("the process manager", process)?;
                    for t in message_types {
                        token("the message type", t)?;
                    }
                }
                RouteKind::Start { saga } => token("the saga", saga)?,
            }
        }
        for relay in &topology.relays {
            if let Destination::Endpoint(e) = relay {
                token("the endpoint", e)?;
            }
        }
        let js = shared.context().await?;
        let stream = js
            .get_or_create_stream(jetstream::stream::Config {
                name: config.stream.clone(),
                subjects: vec![format!("{}.>", config.prefix)],
                storage: StorageType::File,
                max_age: config.max_age,
                duplicate_window: config.duplicate_window,
                ..Default::default()
            })
            .await
            .map_err(|e| {
                TransportError::Topology(format!("the stream `{}`: {e}", config.stream))
            })?;
        for route in &topology.routes {
            let wanted = shared.consumer_config(route);
            let name = wanted.durable_name.clone().unwrap_or_default();
            stream.create_consumer(wanted).await.map_err(|e| {
                TransportError::Topology(format!(
                    "the consumer `{name}`: {e} (if it exists with other settings, delete it: \
                     its deliveries are redelivered to the new one from its stream)"
                ))
            })?;
        }
        Ok(())
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
