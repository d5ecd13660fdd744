//! Confirmed publishes on a channel of its own.

use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation};

use super::{unavailable, Shared};
use crate::transport::{Destination, Outbound, Outgoing, TransportError};

pub(super) struct Publisher {
    channel: Channel,
    /// Kept open while this uses it (its last handle closes it).
    _connection: std::sync::Arc<lapin::Connection>,
    prefix: String,
    timeout: std::time::Duration,
}

impl Publisher {
    pub(super) async fn open(shared: &Shared) -> Result<Self, TransportError> {
        let conn = shared.connection().await?;
        let channel = conn.create_channel().await.map_err(unavailable)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(unavailable)?;
        Ok(Publisher {
            _connection: conn,
            channel,
            prefix: shared.config.prefix.clone(),
            timeout: shared.config.timeout,
        })
    }
}

impl Publisher {
    /// Where `message` goes for `to`: `(exchange, routing key)`.
    fn route(&self, to: &Destination, message: &Outgoing) -> (String, String) {
        match to {
            Destination::Endpoint(endpoint) => (String::new(), endpoint.clone()),
            Destination::Published => (self.prefix.clone(), message.message_type.clone()),
        }
    }

    /// `message`'s properties: its id, type, content type, persistence and
    /// CloudEvents attributes.
    fn properties(message: &Outgoing) -> BasicProperties {
        let mut headers = FieldTable::default();
        // The CloudEvents AMQP binding's names (`cloudEvents_` works for
        // JMS-style clients too; the content type is the property's).
        for (k, v) in &message.attributes {
            if k == "datacontenttype" {
                continue;
            }
            let name = format!("cloudEvents_{k}");
            headers.insert(
                name.as_str().into(),
                AMQPValue::LongString(LongString::from(v.as_str())),
            );
        }
        BasicProperties::default()
            .with_message_id(message.message_id.as_str().into())
            .with_type(message.message_type.as_str().into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_headers(headers)
    }

    /// Sends `message` (mandatory); the confirmation comes later.
    async fn send(
        &self,
        to: &Destination,
        message: &Outgoing,
    ) -> Result<lapin::PublisherConfirm, TransportError> {
        let (exchange, key) = self.route(to, message);
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let sent = self.channel.basic_publish(
            exchange.as_str().into(),
            key.as_str().into(),
            options,
            &message.body,
            Self::properties(message),
        );
        tokio::time::timeout(self.timeout, sent)
            .await
            .map_err(|_| unavailable(format!("not sent within {:?}", self.timeout)))?
            .map_err(unavailable)
    }

    /// What a confirmation of a publish to `to` means.
    async fn confirmed(
        &self,
        to: &Destination,
        confirm: lapin::PublisherConfirm,
    ) -> Result<(), TransportError> {
        let confirmation = tokio::time::timeout(self.timeout, confirm)
            .await
            .map_err(|_| unavailable(format!("no confirmation within {:?}", self.timeout)))?
            .map_err(unavailable)?;
        match (confirmation, to) {
            (Confirmation::Ack(None), _) => Ok(()),
            // Published events nobody subscribes to go nowhere, as events do.
            (Confirmation::Ack(Some(_)), Destination::Published) => Ok(()),
            (Confirmation::Ack(Some(_)), Destination::Endpoint(e)) => {
                Err(TransportError::Unroutable(format!("the queue `{e}`")))
            }
            (Confirmation::Nack(_), _) => Err(TransportError::Refused(
                "the broker nacked it (a full queue with `x-overflow = reject-publish`?)"
                    .to_owned(),
            )),
            (Confirmation::NotRequested, _) => Err(unavailable("the channel confirms nothing")),
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
        let confirm = self.send(to, message).await?;
        self.confirmed(to, confirm).await
    }

    /// Every message sent, then every confirmation awaited in order (a
    /// channel confirms in order): one broker round trip, and one quorum
    /// commit, for many messages.
    async fn publish_all(
        &mut self,
        to: &Destination,
        messages: &[Outgoing],
    ) -> Result<(), (usize, TransportError)> {
        let mut confirms = Vec::with_capacity(messages.len());
        for message in messages {
            match self.send(to, message).await {
                Ok(confirm) => confirms.push(confirm),
                Err(e) => {
                    return self
                        .first_failure(to, std::mem::take(&mut confirms), e)
                        .await
                }
            }
        }
        for (n, confirm) in confirms.into_iter().enumerate() {
            self.confirmed(to, confirm).await.map_err(|e| (n, e))?;
        }
        Ok(())
    }
}

impl Publisher {
    /// A send failed after `confirms` went out: they are confirmed (or
    /// not) in order, and the failure counts from the first that is not.
    async fn first_failure(
        &self,
        to: &Destination,
        confirms: Vec<lapin::PublisherConfirm>,
        e: TransportError,
    ) -> Result<(), (usize, TransportError)> {
        let sent = confirms.len();
        for (n, confirm) in confirms.into_iter().enumerate() {
            self.confirmed(to, confirm).await.map_err(|e| (n, e))?;
        }
        Err((sent, e))
    }
}
