//! One queue's deliveries.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Consumer};

use super::{unavailable, Shared};
use crate::transport::{Inbound, Incoming, Route, TransportError};

/// How long a receive waits, once, for more deliveries behind the first.
const LINGER: Duration = Duration::from_millis(2);

/// A consumer of one route's queue on a channel of its own.
pub(super) struct Receiver {
    channel: Channel,
    /// Kept open while this uses it (its last handle closes it).
    _connection: std::sync::Arc<lapin::Connection>,
    consumer: Consumer,
    /// The deliveries handed out and not settled yet, by tag: at most the
    /// prefetch.
    held: HashMap<u64, Delivery>,
}

impl Receiver {
    pub(super) async fn open(shared: &Shared, route: &Route) -> Result<Self, TransportError> {
        let conn = shared.connection().await?;
        let channel = conn.create_channel().await.map_err(unavailable)?;
        channel
            .basic_qos(shared.config.prefetch, BasicQosOptions::default())
            .await
            .map_err(unavailable)?;
        let queue = shared.queue(route);
        let consumer = channel
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(unavailable)?;
        Ok(Receiver {
            _connection: conn,
            channel,
            consumer,
            held: HashMap::new(),
        })
    }

    fn incoming(&mut self, mut d: Delivery) -> Incoming {
        let props = &d.properties;
        let mut headers = Vec::new();
        let mut earlier = 0u32;
        if let Some(table) = props.headers() {
            for (k, v) in table.inner() {
                let value = match v {
                    AMQPValue::LongString(s) => s.to_string(),
                    AMQPValue::ShortString(s) => s.to_string(),
                    AMQPValue::LongLongInt(n) => n.to_string(),
                    AMQPValue::LongInt(n) => n.to_string(),
                    _ => continue,
                };
                if k.as_str() == "x-delivery-count" {
                    earlier = value.parse().unwrap_or(0);
                }
                headers.push((k.to_string(), value));
            }
        }
        // Quorum queues count earlier deliveries; elsewhere only whether
        // there was one.
        let deliveries = match (earlier, d.redelivered) {
            (0, true) => 2,
            (n, _) => n.saturating_add(1),
        };
        let incoming = Incoming {
            body: std::mem::take(&mut d.data),
            headers,
            message_id: props.message_id().as_ref().map(|v| v.to_string()),
            message_type: props.kind().as_ref().map(|v| v.to_string()),
            subject: d.routing_key.to_string(),
            deliveries,
            tag: d.delivery_tag,
        };
        self.held.insert(d.delivery_tag, d);
        incoming
    }

    fn settled(&mut self, taken: &[Incoming]) -> Vec<Delivery> {
        taken
            .iter()
            .filter_map(|i| self.held.remove(&i.tag))
            .collect()
    }
}

/// A settle that sent nothing: the delivery's channel is gone (the broker
/// delivers it again).
fn sent(done: Result<bool, lapin::Error>) -> Result<(), TransportError> {
    match done {
        Ok(true) => Ok(()),
        Ok(false) => Err(unavailable("the delivery's channel is gone")),
        Err(e) => Err(unavailable(e)),
    }
}

#[async_trait]
impl Inbound for Receiver {
    async fn receive(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Incoming>, TransportError> {
        let mut out = Vec::new();
        let first = match tokio::time::timeout(wait, self.consumer.next()).await {
            Err(_) => return Ok(out),
            Ok(first) => first,
        };
        let mut next = first;
        let mut lingered = false;
        loop {
            match next {
                Some(Ok(d)) => out.push(self.incoming(d)),
                Some(Err(e)) => return Err(unavailable(e)),
                None => return Err(unavailable("the consumer was cancelled")),
            }
            if out.len() >= max {
                break;
            }
            // What has arrived already, without waiting; then, once, a
            // moment for more (a batch is one store write: a few more in
            // it cost nothing, a batch of one costs a write each).
            match self.consumer.next().now_or_never() {
                Some(more) => next = more,
                None if !lingered => {
                    lingered = true;
                    match tokio::time::timeout(LINGER, self.consumer.next()).await {
                        Ok(more) => next = more,
                        Err(_) => break,
                    }
                }
                None => break,
            }
        }
        Ok(out)
    }

    /// Everything handed out up to the batch's last delivery settled at
    /// once (`multiple`: one frame), when the batch is all of it (a
    /// bridge settles its batches whole and in order); one by one
    /// otherwise.
    async fn ack(&mut self, taken: &[Incoming]) -> Result<(), TransportError> {
        let last = taken.iter().map(|i| i.tag).max();
        let whole = last
            .is_some_and(|last| self.held.keys().filter(|t| **t <= last).count() == taken.len());
        let mut settled = self.settled(taken);
        if whole {
            settled.sort_by_key(|d| d.delivery_tag);
            if let Some(d) = settled.pop() {
                return sent(d.ack(BasicAckOptions { multiple: true }).await);
            }
        }
        for d in settled {
            sent(d.ack(BasicAckOptions::default()).await)?;
        }
        Ok(())
    }

    async fn release(&mut self, taken: &[Incoming]) -> Result<(), TransportError> {
        for d in self.settled(taken) {
            // A reject counts toward the queue's delivery limit (a nack
            // no longer does from RabbitMQ 4.3).
            sent(d.reject(BasicRejectOptions { requeue: true }).await)?;
        }
        Ok(())
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // Unsettled deliveries go back to the queue once the channel
        // closes (dropping the last handle closes it).
        let _ = &self.channel;
    }
}
