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

#[async_trait]
impl Outbound for Publisher {
    async fn publish(
        &mut self,
        to: &Destination,
        message: &Outgoing,
    ) -> Result<(), TransportError> {
        let (exchange, key) = match to {
            Destination::Endpoint(endpoint) => (String::new(), endpoint.clone()),
            Destination::Published => (self.prefix.clone(), message.message_type.clone()),
        };
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
        let props = BasicProperties::default()
            .with_message_id(message.message_id.as_str().into())
            .with_type(message.message_type.as_str().into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_headers(headers);
        let publish = async {
            self.channel
                .basic_publish(
                    exchange.as_str().into(),
                    key.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    &message.body,
                    props,
                )
                .await?
                .await
        };
        let confirmation = tokio::time::timeout(self.timeout, publish)
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
