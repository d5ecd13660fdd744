//! Benchmark: messages per second through a process manager fed by a
//! broker, next to a plain consume-and-acknowledge loop on the same broker
//! in the same run (the broker's own ceiling for one consumer), and the
//! relay's publish rate next to a plain confirmed-publish loop.
//!
//! ```text
//! cargo run --features redis,postgres,rabbitmq,nats --release --example bench_transport -- \
//!   --rabbitmq amqp://guest:guest@127.0.0.1:PORT/%2f --nats nats://127.0.0.1:PORT \
//!   --redis redis://127.0.0.1:PORT --postgres postgres://postgres@127.0.0.1:PORT/postgres \
//!   [--messages 20000]
//! ```
//!
//! Point it at private instances (it creates queues, streams, keys and
//! schemas under names of its own, `bench...`, and deletes none of them).
//! Any broker or store left out is skipped. For each broker and store it
//! prints: the plain loop's messages/s; the engine's with 1 and 4 workers
//! (200 instances, each message a `Counted` increment; measured from the
//! first publish to the last message applied, publishes included: the
//! shop publishes as fast as the broker confirms); the plain confirmed
//! publish loop's messages/s; the relay's (messages handlers sent while
//! the relay was stopped, drained by one relay).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::Backend;
use saga_runtime::prelude::*;
use saga_runtime::transport::nats::{Nats, NatsConfig};
use saga_runtime::transport::rabbitmq::{RabbitMq, RabbitMqConfig};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Message, Serialize, Deserialize)]
struct Counted {
    #[correlation_id]
    id: String,
    n: u64,
}

#[derive(Message, Serialize, Deserialize)]
struct Noted {
    #[correlation_id]
    id: String,
}

#[derive(Default, Serialize, Deserialize)]
struct Count {
    n: u64,
}

struct Counter;

#[process_manager(name = "counter", state = Count)]
impl Counter {
    #[starts]
    async fn counted(
        &self,
        _m: Counted,
        s: &mut Count,
        _c: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.n += 1;
        Ok(())
    }

    /// Sends one message to `outbox` per call: the relay's load.
    #[starts]
    async fn noted(
        &self,
        m: Noted,
        _s: &mut Count,
        c: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        c.send("outbox", Noted { id: m.id });
        Ok(())
    }
}

const INSTANCES: u64 = 200;

#[derive(Clone)]
enum Broker {
    Rabbit(String),
    Nats(String),
}

impl Broker {
    fn name(&self) -> &'static str {
        match self {
            Broker::Rabbit(_) => "rabbitmq",
            Broker::Nats(_) => "nats",
        }
    }
}

/// A plain publisher of the broker, waiting for each confirmation in
/// windows of 256 (what a shop would do to go fast).
enum Plain {
    // The connection is kept open while its channel is used.
    Rabbit(lapin::Channel, #[allow(dead_code)] lapin::Connection),
    Nats(async_nats::jetstream::Context),
}

impl Plain {
    async fn connect(b: &Broker) -> Plain {
        match b {
            Broker::Rabbit(url) => {
                let conn = lapin::Connection::connect(url, Default::default())
                    .await
                    .unwrap();
                let ch = conn.create_channel().await.unwrap();
                ch.confirm_select(Default::default()).await.unwrap();
                Plain::Rabbit(ch, conn)
            }
            Broker::Nats(url) => Plain::Nats(async_nats::jetstream::new(
                async_nats::connect(url).await.unwrap(),
            )),
        }
    }

    /// Publishes `n` messages of `t` to `prefix`'s events, confirmed.
    async fn publish(
        &self,
        prefix: &str,
        t: &str,
        n: u64,
        body: impl Fn(u64) -> serde_json::Value,
    ) {
        for window in (0..n).collect::<Vec<_>>().chunks(256) {
            match self {
                Plain::Rabbit(ch, _) => {
                    let mut confirms = Vec::new();
                    for &i in window {
                        use lapin::types::{AMQPValue, FieldTable, LongString};
                        let mut h = FieldTable::default();
                        h.insert(
                            "cloudEvents_type".into(),
                            AMQPValue::LongString(LongString::from(t)),
                        );
                        h.insert(
                            "cloudEvents_id".into(),
                            AMQPValue::LongString(LongString::from(format!("{t}-{i}"))),
                        );
                        let props = lapin::BasicProperties::default().with_headers(h);
                        let bytes = serde_json::to_vec(&body(i)).unwrap();
                        confirms.push(
                            ch.basic_publish(
                                prefix.into(),
                                t.into(),
                                Default::default(),
                                &bytes,
                                props,
                            )
                            .await
                            .unwrap(),
                        );
                    }
                    for c in confirms {
                        c.await.unwrap();
                    }
                }
                Plain::Nats(js) => {
                    let mut acks = Vec::new();
                    for &i in window {
                        let mut h = async_nats::HeaderMap::new();
                        h.insert("ce-type", t);
                        h.insert("ce-id", format!("{t}-{i}").as_str());
                        let bytes = serde_json::to_vec(&body(i)).unwrap();
                        acks.push(
                            js.publish_with_headers(
                                format!("{prefix}.events.{t}"),
                                h,
                                bytes.into(),
                            )
                            .await
                            .unwrap(),
                        );
                    }
                    for a in acks {
                        a.await.unwrap();
                    }
                }
            }
        }
    }
}

/// The broker's ceiling: `n` messages published to a queue (stream) of
/// their own, then consumed and acknowledged by one plain consumer.
async fn plain_loop(b: &Broker, n: u64, tag: &str) -> (f64, f64) {
    let plain = Plain::connect(b).await;
    let prefix = format!("benchplain{tag}");
    let start;
    match (&plain, b) {
        (Plain::Rabbit(ch, _), _) => {
            ch.exchange_declare(
                prefix.as_str().into(),
                lapin::ExchangeKind::Topic,
                lapin::options::ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await
            .unwrap();
            let q = format!("{prefix}.q");
            let mut args = lapin::types::FieldTable::default();
            args.insert(
                "x-queue-type".into(),
                lapin::types::AMQPValue::LongString("quorum".into()),
            );
            ch.queue_declare(
                q.as_str().into(),
                lapin::options::QueueDeclareOptions::durable(),
                args,
            )
            .await
            .unwrap();
            ch.queue_bind(
                q.as_str().into(),
                prefix.as_str().into(),
                "#".into(),
                Default::default(),
                Default::default(),
            )
            .await
            .unwrap();
            start = Instant::now();
            plain
                .publish(
                    &prefix,
                    "Counted",
                    n,
                    |i| json!({"id": format!("i-{}", i % INSTANCES), "n": i}),
                )
                .await;
            let published = start.elapsed();
            let consume = Instant::now();
            ch.basic_qos(256, Default::default()).await.unwrap();
            let mut c = ch
                .basic_consume(
                    q.as_str().into(),
                    "".into(),
                    Default::default(),
                    Default::default(),
                )
                .await
                .unwrap();
            for _ in 0..n {
                let d = c.next().await.unwrap().unwrap();
                d.ack(Default::default()).await.unwrap();
            }
            (
                n as f64 / published.as_secs_f64(),
                n as f64 / consume.elapsed().as_secs_f64(),
            )
        }
        (Plain::Nats(js), _) => {
            let stream = js
                .get_or_create_stream(async_nats::jetstream::stream::Config {
                    name: prefix.to_uppercase(),
                    subjects: vec![format!("{prefix}.>")],
                    storage: async_nats::jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .unwrap();
            start = Instant::now();
            plain
                .publish(
                    &prefix,
                    "Counted",
                    n,
                    |i| json!({"id": format!("i-{}", i % INSTANCES), "n": i}),
                )
                .await;
            let published = start.elapsed();
            let consumer: async_nats::jetstream::consumer::PullConsumer = stream
                .create_consumer(async_nats::jetstream::consumer::pull::Config {
                    durable_name: Some("plain".into()),
                    max_ack_pending: 256,
                    ..Default::default()
                })
                .await
                .unwrap();
            let consume = Instant::now();
            let mut got = 0;
            while got < n {
                let mut batch = consumer
                    .batch()
                    .max_messages(256)
                    .expires(Duration::from_secs(1))
                    .messages()
                    .await
                    .unwrap();
                let mut acks = Vec::new();
                while let Some(Ok(m)) = batch.next().await {
                    acks.push(m);
                    got += 1;
                }
                futures::future::join_all(acks.iter().map(|m| m.double_ack())).await;
            }
            (
                n as f64 / published.as_secs_f64(),
                n as f64 / consume.elapsed().as_secs_f64(),
            )
        }
    }
}

async fn store(url: &str, tag: &str) -> Arc<dyn Backend> {
    if url.starts_with("postgres") {
        let config = PostgresConfig {
            schema: format!("bench{tag}"),
            ..PostgresConfig::default()
        };
        return Arc::new(PostgresBackend::connect_url(url, config).await.unwrap());
    }
    let config = RedisConfig {
        prefix: format!("bench{tag}"),
        ..RedisConfig::default()
    };
    Arc::new(RedisBackend::connect_with(url, config).await.unwrap())
}

fn transport(
    builder: saga_runtime::EngineBuilder,
    b: &Broker,
    prefix: &str,
) -> saga_runtime::EngineBuilder {
    match b {
        Broker::Rabbit(url) => builder.transport(
            RabbitMq::with_config(
                url,
                RabbitMqConfig {
                    prefix: prefix.to_owned(),
                    ..Default::default()
                },
            )
            .relay("outbox"),
        ),
        Broker::Nats(url) => builder.transport(
            Nats::with_config(
                url,
                NatsConfig {
                    prefix: prefix.to_owned(),
                    stream: prefix.to_uppercase(),
                    ..Default::default()
                },
            )
            .relay("outbox"),
        ),
    }
}

/// Messages per second through the process manager with `workers`.
async fn through_engine(b: &Broker, store_url: &str, n: u64, workers: usize, tag: &str) -> f64 {
    let prefix = format!("bench{tag}");
    let builder = Engine::builder()
        .backend_arc(store(store_url, tag).await)
        .process_manager(Counter)
        .worker_concurrency(16)
        .workers(workers);
    let engine = transport(builder, b, &prefix).build().await.unwrap();
    let plain = Plain::connect(b).await;
    let start = Instant::now();
    plain
        .publish(
            &prefix,
            "Counted",
            n,
            |i| json!({"id": format!("i-{}", i % INSTANCES), "n": i}),
        )
        .await;
    counted(&engine, n).await;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    engine.shutdown().await;
    rate
}

/// Until the counters of the instances add up to `n` (a run that loses
/// messages ends with an error after 10 minutes rather than wait on).
async fn counted(engine: &Engine, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        assert!(
            Instant::now() < deadline,
            "fewer than {n} messages were handled in 10 minutes"
        );
        let mut total = 0;
        for i in 0..INSTANCES {
            total += engine
                .process_state::<Counter>(&format!("i-{i}"))
                .await
                .ok()
                .flatten()
                .map_or(0, |c| c.n);
        }
        if total >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The store's own ceiling for the same work: the messages published
/// in-process (64 at a time), no broker.
async fn in_process(store_url: &str, n: u64, workers: usize, tag: &str) -> f64 {
    let engine = Engine::builder()
        .backend_arc(store(store_url, tag).await)
        .process_manager(Counter)
        .worker_concurrency(16)
        .workers(workers)
        .build()
        .await
        .unwrap();
    let start = Instant::now();
    let ids: Vec<u64> = (0..n).collect();
    for chunk in ids.chunks(64) {
        let sends = chunk.iter().map(|i| {
            let m = Counted {
                id: format!("i-{}", i % INSTANCES),
                n: *i,
            };
            let engine = engine.clone();
            async move { engine.publish(m).await.unwrap() }
        });
        futures::future::join_all(sends).await;
    }
    counted(&engine, n).await;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    engine.shutdown().await;
    rate
}

/// The relay: `n` messages sent by handlers (each `Noted` sends one to
/// `outbox`) drained to the broker by one relay; the time from the first
/// publish to the last message on the broker.
async fn relay_rate(b: &Broker, store_url: &str, n: u64, tag: &str) -> f64 {
    let prefix = format!("bench{tag}");
    let plain = Plain::connect(b).await;
    if let Plain::Rabbit(ch, _) = &plain {
        ch.queue_declare(
            "outbox".into(),
            lapin::options::QueueDeclareOptions::durable(),
            Default::default(),
        )
        .await
        .unwrap();
        ch.queue_purge("outbox".into(), Default::default())
            .await
            .unwrap();
    }
    let builder = Engine::builder()
        .backend_arc(store(store_url, tag).await)
        .process_manager(Counter)
        .worker_concurrency(16)
        .workers(4);
    let engine = transport(builder, b, &prefix).build().await.unwrap();
    let start = Instant::now();
    plain
        .publish(&prefix, "Noted", n, |i| json!({"id": format!("n-{i}")}))
        .await;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let sent = match &plain {
            Plain::Rabbit(ch, _) => {
                let q = ch
                    .queue_declare(
                        "outbox".into(),
                        lapin::options::QueueDeclareOptions {
                            passive: true,
                            ..Default::default()
                        },
                        Default::default(),
                    )
                    .await
                    .unwrap();
                u64::from(q.message_count())
            }
            Plain::Nats(js) => {
                let mut s = js.get_stream(prefix.to_uppercase()).await.unwrap();
                let info = s.info().await.unwrap();
                // Counted and Noted events, then what the relay sent.
                info.state.messages.saturating_sub(n)
            }
        };
        if sent >= n || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    engine.shutdown().await;
    rate
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let n: u64 = arg("--messages")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let mut brokers = Vec::new();
    if let Some(url) = arg("--rabbitmq") {
        brokers.push(Broker::Rabbit(url));
    }
    if let Some(url) = arg("--nats") {
        brokers.push(Broker::Nats(url));
    }
    let stores: Vec<(&str, String)> = [("redis", arg("--redis")), ("postgres", arg("--postgres"))]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
    let run = std::process::id();
    for (store_name, url) in &stores {
        for workers in [1, 4] {
            let rate = in_process(
                url,
                n,
                workers,
                &format!("inproc{store_name}{workers}w{run}"),
            )
            .await;
            println!("{store_name}, {workers} workers x 16, published in-process (no broker): {rate:.0} msg/s");
        }
    }
    for b in &brokers {
        let (published, consumed) = plain_loop(b, n, &format!("{}{run}", b.name())).await;
        println!("{}: plain confirmed publish {published:.0} msg/s, plain consume+ack {consumed:.0} msg/s", b.name());
        for (store_name, url) in &stores {
            for workers in [1, 4] {
                let tag = format!("{}{store_name}{workers}w{run}", b.name());
                let rate = through_engine(b, url, n, workers, &tag).await;
                println!(
                    "{} + {store_name}, {workers} workers x 16: {rate:.0} msg/s through the process manager ({:.2} of the plain consume loop)",
                    b.name(),
                    rate / consumed
                );
            }
            let tag = format!("{}{store_name}relay{run}", b.name());
            let rate = relay_rate(b, url, n / 4, &tag).await;
            println!(
                "{} + {store_name}: relay {rate:.0} msg/s ({:.2} of the plain confirmed publish loop)",
                b.name(),
                rate / published
            );
        }
    }
}
