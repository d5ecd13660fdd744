//! The brokers the transport tests run against, and a plain client for
//! each (lapin, async-nats: not this library) that plays the other
//! services: it publishes what a shop would, and reads what the engine
//! relays.

use std::time::Duration;

use futures::StreamExt;
use saga_runtime::transport::nats::{Nats, NatsConfig};
use saga_runtime::transport::rabbitmq::{RabbitMq, RabbitMqConfig};
use serde_json::Value;

use super::nats_server::TestNats;
use super::rabbitmq_server::TestRabbit;

/// A private broker.
pub enum TestBroker {
    Rabbit(TestRabbit),
    Nats(TestNats),
}

/// A message the plain client read.
#[derive(Debug, Clone)]
pub struct Read {
    pub body: Value,
    /// Its CloudEvents `id` and `type`, as the headers carried them.
    pub ce_id: Option<String>,
    pub ce_type: Option<String>,
}

/// One test's corner of a shared broker: its own names.
#[derive(Clone)]
pub struct Corner {
    pub prefix: String,
}

impl Corner {
    pub fn new(test: &str) -> Self {
        Corner {
            prefix: format!("t{}", test.replace(['_', '-'], "")),
        }
    }

    /// The NATS stream of this corner.
    fn stream(&self) -> String {
        self.prefix.to_uppercase()
    }
}

impl TestBroker {
    pub fn rabbit() -> Self {
        TestBroker::Rabbit(TestRabbit::start())
    }

    pub fn nats() -> Self {
        TestBroker::Nats(TestNats::start())
    }

    pub fn name(&self) -> &'static str {
        match self {
            TestBroker::Rabbit(_) => "rabbitmq",
            TestBroker::Nats(_) => "nats",
        }
    }

    pub fn url(&self) -> String {
        match self {
            TestBroker::Rabbit(r) => r.url(),
            TestBroker::Nats(n) => n.url(),
        }
    }

    /// The transport for an engine of `corner`, relaying `relay`.
    pub fn rabbitmq(&self, corner: &Corner) -> RabbitMq {
        RabbitMq::with_config(
            &self.url(),
            RabbitMqConfig {
                prefix: corner.prefix.clone(),
                timeout: Duration::from_secs(3),
                ..RabbitMqConfig::default()
            },
        )
    }

    pub fn nats_transport(&self, corner: &Corner) -> Nats {
        Nats::with_config(
            &self.url(),
            NatsConfig {
                prefix: corner.prefix.clone(),
                stream: corner.stream(),
                timeout: Duration::from_secs(3),
                ack_wait: Duration::from_secs(5),
                ..NatsConfig::default()
            },
        )
    }

    /// Stops the broker (RabbitMQ: the node; NATS: SIGKILL).
    pub fn stop(&mut self) {
        match self {
            TestBroker::Rabbit(r) => r.stop(),
            TestBroker::Nats(n) => n.kill(),
        }
    }

    /// Starts it again on its data.
    pub fn start_again(&mut self) {
        match self {
            TestBroker::Rabbit(r) => r.restart(),
            TestBroker::Nats(n) => n.restart(),
        }
    }

    /// Cuts every client connection (NATS: a restart, which is what a
    /// client sees of it).
    pub fn cut_connections(&mut self) {
        match self {
            TestBroker::Rabbit(r) => r.close_all_connections(),
            TestBroker::Nats(n) => n.restart(),
        }
    }

    /// A plain client of this broker.
    pub async fn client(&self, corner: &Corner) -> Plain {
        match self {
            TestBroker::Rabbit(_) => {
                let conn = lapin::Connection::connect(&self.url(), Default::default())
                    .await
                    .expect("connect the plain AMQP client");
                let ch = conn.create_channel().await.unwrap();
                ch.confirm_select(Default::default()).await.unwrap();
                Plain::Rabbit {
                    _conn: conn,
                    ch,
                    corner: corner.clone(),
                }
            }
            TestBroker::Nats(_) => {
                let client = async_nats::connect(self.url()).await.expect("connect NATS");
                Plain::Nats {
                    js: async_nats::jetstream::new(client),
                    corner: corner.clone(),
                }
            }
        }
    }
}

/// A client that is not this library.
pub enum Plain {
    Rabbit {
        _conn: lapin::Connection,
        ch: lapin::Channel,
        corner: Corner,
    },
    Nats {
        js: async_nats::jetstream::Context,
        corner: Corner,
    },
}

impl Plain {
    /// Publishes `body` as a CloudEvent of `message_type` with `id`, as a
    /// service with only its broker client would (RabbitMQ: to the
    /// events exchange by type; NATS: to the events subject), and waits
    /// for the broker's confirmation.
    pub async fn publish_event(&self, message_type: &str, id: &str, body: &Value) {
        let bytes = serde_json::to_vec(body).unwrap();
        self.publish_raw(message_type, Some(id), &bytes, true).await;
    }

    /// Publishes `bytes` by `key` (RabbitMQ: the routing key on the events
    /// exchange; NATS: the subject under `<prefix>.`), with the CloudEvents
    /// type `key` and id `id` if `ce`.
    pub async fn publish_raw(&self, key: &str, id: Option<&str>, bytes: &[u8], ce: bool) {
        match self {
            Plain::Rabbit { ch, corner, .. } => {
                use lapin::types::{AMQPValue, FieldTable, LongString};
                let mut headers = FieldTable::default();
                if ce {
                    headers.insert(
                        "cloudEvents_type".into(),
                        AMQPValue::LongString(LongString::from(key)),
                    );
                    headers.insert(
                        "cloudEvents_specversion".into(),
                        AMQPValue::LongString(LongString::from("1.0")),
                    );
                    if let Some(id) = id {
                        headers.insert(
                            "cloudEvents_id".into(),
                            AMQPValue::LongString(LongString::from(id)),
                        );
                    }
                }
                let props = lapin::BasicProperties::default().with_headers(headers);
                let confirm = ch
                    .basic_publish(
                        corner.prefix.as_str().into(),
                        key.into(),
                        Default::default(),
                        bytes,
                        props,
                    )
                    .await
                    .unwrap()
                    .await
                    .unwrap();
                assert!(confirm.is_ack(), "the broker took it");
            }
            Plain::Nats { js, corner } => {
                let subject = match key.starts_with("start.") {
                    true => format!("{}.{key}", corner.prefix),
                    false => format!("{}.events.{key}", corner.prefix),
                };
                let mut headers = async_nats::HeaderMap::new();
                if ce {
                    headers.insert("ce-type", key);
                    headers.insert("ce-specversion", "1.0");
                    if let Some(id) = id {
                        headers.insert("ce-id", id);
                    }
                }
                js.publish_with_headers(subject, headers, bytes.to_vec().into())
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
        }
    }

    /// Publishes `body` straight to queue `queue` (RabbitMQ's default
    /// exchange) as a CloudEvent of `message_type`; NATS: to the events
    /// subject of that type.
    pub async fn publish_direct(&self, queue: &str, message_type: &str, id: &str, body: &Value) {
        let bytes = serde_json::to_vec(body).unwrap();
        match self {
            Plain::Rabbit { ch, .. } => {
                use lapin::types::{AMQPValue, FieldTable, LongString};
                let mut headers = FieldTable::default();
                headers.insert(
                    "cloudEvents_type".into(),
                    AMQPValue::LongString(LongString::from(message_type)),
                );
                headers.insert(
                    "cloudEvents_id".into(),
                    AMQPValue::LongString(LongString::from(id)),
                );
                let props = lapin::BasicProperties::default().with_headers(headers);
                ch.basic_publish("".into(), queue.into(), Default::default(), &bytes, props)
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
            Plain::Nats { .. } => self.publish_raw(message_type, Some(id), &bytes, true).await,
        }
    }

    /// Publishes a command starting saga `saga`, with `id`.
    pub async fn publish_start(&self, saga: &str, id: &str, input: &Value) {
        let bytes = serde_json::to_vec(input).unwrap();
        self.publish_raw(&format!("start.{saga}"), Some(id), &bytes, true)
            .await;
    }

    /// Makes sure `endpoint`'s messages are kept for [`read`](Self::read)
    /// (RabbitMQ: declares the queue; NATS: the stream keeps them).
    pub async fn receive_endpoint(&self, endpoint: &str) {
        if let Plain::Rabbit { ch, .. } = self {
            ch.queue_declare(
                endpoint.into(),
                lapin::options::QueueDeclareOptions::durable(),
                Default::default(),
            )
            .await
            .unwrap();
        }
    }

    /// Reads `n` messages the engine relayed to `endpoint` (waiting up to
    /// `within`), acknowledging them.
    pub async fn read(&self, endpoint: &str, n: usize, within: Duration) -> Vec<Read> {
        let deadline = tokio::time::Instant::now() + within;
        let mut out = Vec::new();
        match self {
            Plain::Rabbit { ch, .. } => {
                let mut consumer = ch
                    .basic_consume(
                        endpoint.into(),
                        "".into(),
                        Default::default(),
                        Default::default(),
                    )
                    .await
                    .unwrap();
                while out.len() < n {
                    let next = tokio::time::timeout_at(deadline, consumer.next()).await;
                    let Ok(Some(Ok(d))) = next else { break };
                    let header = |k: &str| {
                        d.properties
                            .headers()
                            .as_ref()
                            .and_then(|h| h.inner().get(k))
                            .and_then(|v| v.as_long_string())
                            .map(|v| v.to_string())
                    };
                    out.push(Read {
                        body: serde_json::from_slice(&d.data).unwrap_or(Value::Null),
                        ce_id: header("cloudEvents_id"),
                        ce_type: header("cloudEvents_type"),
                    });
                    d.ack(Default::default()).await.unwrap();
                }
            }
            Plain::Nats { js, corner } => {
                let stream = js.get_stream(corner.stream()).await.unwrap();
                let name = format!("reader-{endpoint}");
                let consumer: async_nats::jetstream::consumer::PullConsumer = stream
                    .get_or_create_consumer(
                        &name,
                        async_nats::jetstream::consumer::pull::Config {
                            durable_name: Some(name.clone()),
                            filter_subject: format!("{}.send.{endpoint}", corner.prefix),
                            ..Default::default()
                        },
                    )
                    .await
                    .unwrap();
                while out.len() < n && tokio::time::Instant::now() < deadline {
                    let mut batch = consumer
                        .batch()
                        .max_messages(n - out.len())
                        .expires(Duration::from_millis(500))
                        .messages()
                        .await
                        .unwrap();
                    while let Some(Ok(m)) = batch.next().await {
                        let header = |k: &str| {
                            m.headers
                                .as_ref()
                                .and_then(|h| h.get(k))
                                .map(|v| v.as_str().to_owned())
                        };
                        out.push(Read {
                            body: serde_json::from_slice(&m.payload).unwrap_or(Value::Null),
                            ce_id: header("ce-id"),
                            ce_type: header("ce-type"),
                        });
                        m.double_ack().await.unwrap();
                    }
                }
            }
        }
        out
    }
}
