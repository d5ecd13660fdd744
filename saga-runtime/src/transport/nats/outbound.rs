//! Publishes JetStream acknowledges, with `Nats-Msg-Id`.

use async_nats::jetstream::{self, context::PublishErrorKind, message::PublishMessage};
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
}

#[async_trait]
impl Outbound for Publisher {
    async fn publish(
        &mut self,
        to: &Destination,
        message: &Outgoing,
    ) -> Result<(), TransportError> {
        let subject = match to {
            Destination::Endpoint(e) => format!("{}.send.{e}", self.prefix),
            Destination::Published => format!("{}.events.{}", self.prefix, message.message_type),
        };
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
