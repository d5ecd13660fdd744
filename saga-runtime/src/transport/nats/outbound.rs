//! Publishes JetStream acknowledges, with `Nats-Msg-Id`.

use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use async_nats::jetstream::{self, message::PublishMessage};
use async_trait::async_trait;

use super::{unavailable, Shared};
use crate::transport::{Destination, Outbound, Outgoing, TransportError};

pub(super) struct Publisher {
    js: jetstream::Context,
    prefix: String,
}

impl Publisher {
    pub(super) async fn open(shared: &Shared) -> Result<Self, TransportError> {
        Ok(Publisher {
            js: shared.context().await?,
            prefix: shared.config.prefix.clone(),
        })
    }

    fn subject(&self, to: &Destination, message: &Outgoing) -> String {
        match to {
            Destination::Endpoint(e) => format!("{}.send.{e}", self.prefix),
            Destination::Published => format!("{}.events.{}", self.prefix, message.message_type),
        }
    }

    /// Sends `message`; its acknowledgement comes later.
    async fn send(
        &self,
        to: &Destination,
        message: &Outgoing,
    ) -> Result<(String, PublishAckFuture), TransportError> {
        let subject = self.subject(to, message);
        let mut build = PublishMessage::build()
            .message_id(message.message_id.as_str())
            .payload(message.body.clone().into());
        // The CloudEvents NATS binding's names (`ce-` and the attribute).
        for (k, v) in &message.attributes {
            build = build.header(format!("ce-{k}").as_str(), v.as_str());
        }
        let sent = self
            .js
            .send_publish(subject.clone(), build)
            .await
            .map_err(unavailable)?;
        Ok((subject, sent))
    }

    /// What the acknowledgement of a publish to `subject` means.
    async fn acknowledged(subject: String, sent: PublishAckFuture) -> Result<(), TransportError> {
        // A duplicate (`duplicate: true`) is a publish the stream has: as
        // good as a first one.
        match sent.await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == PublishErrorKind::StreamNotFound => Err(
                TransportError::Unroutable(format!("the subject `{subject}`")),
            ),
            // A timed-out publish may still be stored: the relay sends it
            // again with the same id, which the stream then drops.
            Err(e) => Err(unavailable(e)),
        }
    }
}

#[async_trait]
impl Outbound for Publisher {
    async fn publish(
        &mut self,
        to: &Destination,
        message: &Outgoing,
    ) -> Result<(), TransportError> {
        let (subject, sent) = self.send(to, message).await?;
        Self::acknowledged(subject, sent).await
    }

    /// Every message sent, then every acknowledgement awaited in order.
    async fn publish_all(
        &mut self,
        to: &Destination,
        messages: &[Outgoing],
    ) -> Result<(), (usize, TransportError)> {
        let mut sent = Vec::with_capacity(messages.len());
        let mut failed = None;
        for message in messages {
            match self.send(to, message).await {
                Ok(s) => sent.push(s),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let n = sent.len();
        for (k, (subject, ack)) in sent.into_iter().enumerate() {
            Self::acknowledged(subject, ack).await.map_err(|e| (k, e))?;
        }
        match failed {
            Some(e) => Err((n, e)),
            None => Ok(()),
        }
    }
}
