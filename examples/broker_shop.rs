//! The shop side of `examples/broker_fulfillment.rs`, with nothing but
//! its broker's client (lapin, async-nats: not this library): it
//! publishes three orders' events as CloudEvents (one order's backwards),
//! then reads the `Ship` commands the process manager sends back.
//!
//! ```text
//! cargo run --features rabbitmq,nats --example broker_shop -- amqp://guest:guest@127.0.0.1:5672/%2f
//! cargo run --features rabbitmq,nats --example broker_shop -- nats://127.0.0.1:4222
//! ```

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

/// The three events of order `n`, in the order the shop publishes them.
fn events(n: u32) -> Vec<(&'static str, String, Value)> {
    let (id, number) = (format!("order-{n}"), format!("N-{n}"));
    let mut events = vec![
        (
            "OrderSubmitted",
            format!("submitted-{n}"),
            json!({"order_id": id, "order_number": number}),
        ),
        (
            "InventoryReserved",
            format!("reserved-{n}"),
            json!({"order_number": number}),
        ),
        (
            "PaymentCaptured",
            format!("paid-{n}"),
            json!({"order_id": id}),
        ),
    ];
    if n == 2 {
        events.reverse(); // the warehouse and the bank answered first
    }
    events
}

async fn rabbitmq(url: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use lapin::types::{AMQPValue, FieldTable, LongString};
    let conn = lapin::Connection::connect(url, Default::default()).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    // The queue the process manager sends `Ship` to is the shop's.
    ch.queue_declare(
        "shipping".into(),
        lapin::options::QueueDeclareOptions::durable(),
        Default::default(),
    )
    .await?;
    for n in 1..=3 {
        for (t, id, body) in events(n) {
            let mut headers = FieldTable::default();
            for (k, v) in [
                ("cloudEvents_type", t),
                ("cloudEvents_id", id.as_str()),
                ("cloudEvents_specversion", "1.0"),
            ] {
                headers.insert(k.into(), AMQPValue::LongString(LongString::from(v)));
            }
            let props = lapin::BasicProperties::default().with_headers(headers);
            let payload = serde_json::to_vec(&body)?;
            // The engine's exchange, by message type.
            ch.basic_publish(
                "sagas".into(),
                t.into(),
                Default::default(),
                &payload,
                props,
            )
            .await?
            .await?;
            println!("published {t} ({id})");
        }
    }
    let mut shipping = ch
        .basic_consume(
            "shipping".into(),
            "shop".into(),
            Default::default(),
            Default::default(),
        )
        .await?;
    for _ in 1..=3 {
        let Ok(Some(d)) = tokio::time::timeout(Duration::from_secs(30), shipping.next()).await
        else {
            return Err("no Ship command within 30 s: is broker_fulfillment running?".into());
        };
        let d = d?;
        let ship: Value = serde_json::from_slice(&d.data)?;
        println!("to ship: {}", ship["payload"]);
        d.ack(Default::default()).await?;
    }
    Ok(())
}

async fn nats(url: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let client = async_nats::connect(url).await?;
    let js = async_nats::jetstream::new(client);
    for n in 1..=3 {
        for (t, id, body) in events(n) {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("ce-type", t);
            headers.insert("ce-id", id.as_str());
            headers.insert("ce-specversion", "1.0");
            let payload = serde_json::to_vec(&body)?;
            js.publish_with_headers(format!("sagas.events.{t}"), headers, payload.into())
                .await?
                .await?;
            println!("published {t} ({id})");
        }
    }
    let stream = js.get_stream("SAGAS").await?;
    let shipping: async_nats::jetstream::consumer::PullConsumer = stream
        .get_or_create_consumer(
            "shop-shipping",
            async_nats::jetstream::consumer::pull::Config {
                durable_name: Some("shop-shipping".into()),
                filter_subject: "sagas.send.shipping".into(),
                ..Default::default()
            },
        )
        .await?;
    let mut seen = 0;
    while seen < 3 {
        let mut batch = shipping
            .batch()
            .max_messages(3)
            .expires(Duration::from_secs(30))
            .messages()
            .await?;
        while let Some(m) = batch.next().await {
            let m = m?;
            let ship: Value = serde_json::from_slice(&m.payload)?;
            println!("to ship: {}", ship["payload"]);
            m.double_ack().await?;
            seen += 1;
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    match url.starts_with("nats") {
        true => nats(&url).await,
        false => rabbitmq(&url).await,
    }
}
