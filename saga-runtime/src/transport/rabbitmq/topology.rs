//! Declaring what the engine needs, idempotently (see the module docs for
//! the names).

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, ExchangeKind};

use super::{unavailable, Shared};
use crate::transport::{RouteKind, Topology, TransportError};

fn text(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

/// A declaration the broker refused as asked (a queue that exists with
/// other arguments: 406) is a topology error, not an outage.
fn refused(what: &str, e: lapin::Error) -> TransportError {
    match e.is_amqp_soft_error() {
        true => TransportError::Topology(format!(
            "declaring {what} failed: {e} (it exists with other settings: delete it, or give \
             this engine another `RabbitMqConfig::prefix`)"
        )),
        false => unavailable(e),
    }
}

/// The exchanges, the dead-letter queue and every route's queue with its
/// bindings.
pub(super) async fn declare(shared: &Shared, topology: &Topology) -> Result<(), TransportError> {
    let conn = shared.connection().await?;
    let ch = conn.create_channel().await.map_err(unavailable)?;
    let prefix = &shared.config.prefix;
    let dead = format!("{prefix}.dead");
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let exchanges = [
        (prefix.clone(), ExchangeKind::Topic),
        (dead.clone(), ExchangeKind::Fanout),
    ];
    for (name, kind) in exchanges {
        ch.exchange_declare(name.as_str().into(), kind, durable, FieldTable::default())
            .await
            .map_err(|e| refused(&format!("exchange `{name}`"), e))?;
    }
    queue(&ch, &dead, FieldTable::default()).await?;
    bind(&ch, &dead, &dead, "").await?;
    for route in &topology.routes {
        let name = shared.queue(route);
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), text("quorum"));
        args.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongInt(i32::try_from(shared.config.delivery_limit).unwrap_or(i32::MAX)),
        );
        args.insert("x-dead-letter-exchange".into(), text(&dead));
        args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
        args.insert("x-overflow".into(), text("reject-publish"));
        queue(&ch, &name, args).await?;
        match &route.kind {
            RouteKind::Process { message_types, .. } => {
                for t in message_types {
                    bind(&ch, &name, prefix, t).await?;
                }
            }
            RouteKind::Start { saga } => bind(&ch, &name, prefix, &format!("start.{saga}")).await?,
        }
    }
    let _ = ch.close(200, "declared".into()).await;
    Ok(())
}

async fn queue(ch: &Channel, name: &str, args: FieldTable) -> Result<(), TransportError> {
    ch.queue_declare(name.into(), QueueDeclareOptions::durable(), args)
        .await
        .map_err(|e| refused(&format!("queue `{name}`"), e))?;
    Ok(())
}

async fn bind(ch: &Channel, queue: &str, exchange: &str, key: &str) -> Result<(), TransportError> {
    ch.queue_bind(
        queue.into(),
        exchange.into(),
        key.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .map_err(|e| refused(&format!("binding `{queue}` to `{exchange}` by `{key}`"), e))
}
