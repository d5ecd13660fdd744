//! One durable consumer's deliveries.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use async_trait::async_trait;
use futures::StreamExt;

use super::{unavailable, Shared};
use crate::transport::{Inbound, Incoming, Route, TransportError};

pub(super) struct Receiver {
    consumer: jetstream::consumer::PullConsumer,
    /// What was handed out and not settled yet, by tag.
    held: HashMap<u64, jetstream::Message>,
    next_tag: u64,
}

impl Receiver {
    pub(super) async fn open(shared: &Shared, route: &Route) -> Result<Self, TransportError> {
        let js = shared.context().await?;
        let stream = js
            .get_stream(&shared.config.stream)
            .await
            .map_err(unavailable)?;
        let (name, _) = shared.consumer(route);
        let consumer = stream.get_consumer(&name).await.map_err(unavailable)?;
        Ok(Receiver {
            consumer,
            held: HashMap::new(),
            next_tag: 0,
        })
    }

    fn incoming(&mut self, m: jetstream::Message) -> Incoming {
        let deliveries = m
            .info()
            .map(|i| u32::try_from(i.delivered.max(1)).unwrap_or(u32::MAX))
            .unwrap_or(1);
        let mut headers = Vec::new();
        let mut message_id = None;
        if let Some(h) = &m.headers {
            for (k, values) in h.iter() {
                let Some(v) = values.first() else { continue };
                let (k, v) = (k.to_string(), v.as_str().to_owned());
                if k.eq_ignore_ascii_case(async_nats::header::NATS_MESSAGE_ID.as_ref()) {
                    message_id = Some(v.clone());
                }
                headers.push((k, v));
            }
        }
        self.next_tag += 1;
        let incoming = Incoming {
            body: m.payload.to_vec(),
            headers,
            message_id,
            message_type: None,
            subject: m.subject.to_string(),
            deliveries,
            tag: self.next_tag,
        };
        self.held.insert(self.next_tag, m);
        incoming
    }

    /// Settles each of `taken` with `kind` (sent, not confirmed: one
    /// request and reply per message cost more than the rest of the
    /// bridge; a lost acknowledgement is a redelivery, which the engine
    /// recognises by the message's id).
    async fn settle(&mut self, taken: &[Incoming], kind: AckKind) -> Result<(), TransportError> {
        let messages: Vec<jetstream::Message> = taken
            .iter()
            .filter_map(|i| self.held.remove(&i.tag))
            .collect();
        for m in &messages {
            m.ack_with(kind).await.map_err(unavailable)?;
        }
        Ok(())
    }
}

#[async_trait]
impl Inbound for Receiver {
    async fn receive(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Incoming>, TransportError> {
        // A pull that waits at most `wait` for the first (`expires`), and
        // then takes what is there.
        let batch = self
            .consumer
            .batch()
            .max_messages(max.max(1))
            .expires(wait.max(Duration::from_millis(10)))
            .messages()
            .await
            .map_err(unavailable)?;
        tokio::pin!(batch);
        let mut out = Vec::new();
        let limit = wait + Duration::from_secs(6);
        while let Ok(Some(next)) = tokio::time::timeout(limit, batch.next()).await {
            match next {
                Ok(m) => out.push(self.incoming(m)),
                Err(e) if out.is_empty() => return Err(unavailable(e)),
                Err(_) => break,
            }
        }
        Ok(out)
    }

    async fn ack(&mut self, taken: &[Incoming]) -> Result<(), TransportError> {
        self.settle(taken, AckKind::Ack).await
    }

    async fn release(&mut self, taken: &[Incoming]) -> Result<(), TransportError> {
        self.settle(taken, AckKind::Nak(None)).await
    }

    async fn keep(&mut self, taken: &[Incoming]) -> Result<(), TransportError> {
        for i in taken {
            if let Some(m) = self.held.get(&i.tag) {
                m.ack_with(AckKind::Progress).await.map_err(unavailable)?;
            }
        }
        Ok(())
    }
}
