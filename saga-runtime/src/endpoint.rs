//! Endpoints: where process managers send messages for other services
//! (`ctx.send("invoicing", msg)`), and how those services receive them.
//!
//! An endpoint is a stream of messages written in the same atomic save as
//! the state of the instance that sent them (an outbox: nothing is sent by
//! a handler whose save failed, nothing saved is left unsent). Everything
//! published (`ctx.publish`) also goes to the endpoint `published`.
//!
//! # Receiving in Rust
//!
//! [`Engine::consumer`](crate::Engine::consumer) runs a handler per
//! message, in a consumer group: each message goes to one consumer of the
//! group; it is acknowledged when the handler returns `Ok`, retried with
//! backoff on a transient error, and dead-lettered after its retries, on a
//! permanent error, when it is not an envelope at all, or when it has been
//! delivered more than the cap without being settled (a message whose
//! handler kills its worker, or never returns). A message whose consumer
//! died goes to another one after the visibility timeout. Consumed
//! messages are trimmed from the stream once every group has them.
//!
//! # The envelope (version 1)
//!
//! On Redis an endpoint is the stream `<prefix>:{<prefix>:pm}:endpoint:<name>`
//! (`saga:{saga:pm}:endpoint:invoicing` with the default prefix); each entry
//! has one field, `envelope`, holding this JSON:
//!
//! ```json
//! {
//!   "v": 1,
//!   "message_id": "0b5c6a9e-...",
//!   "message_type": "SendInvoice",
//!   "from": "fulfillment",
//!   "correlation_id": "order-17",
//!   "headers": { "instance": "order-17" },
//!   "sent_at": 1764000000000,
//!   "payload": { "order": "order-17", "amount": 250 }
//! }
//! ```
//!
//! - `message_id` is stable: a handler re-run after a conflict, or a
//!   redelivered message, sends the same id. Consumers drop duplicates by
//!   it (the library's own consumer does not do it for you: the handler's
//!   side effects are yours).
//! - `message_type` is the sender's `Message::TYPE`; `payload` the message
//!   as JSON.
//! - `correlation_id` is the message's `#[correlation_id]`, if it has one;
//!   `headers.instance` the sending instance. Unknown fields may be added
//!   in later versions of the same `v`: ignore what you do not know.
//!
//! Any Redis client can consume an endpoint with a consumer group:
//!
//! ```text
//! XGROUP CREATE saga:{saga:pm}:endpoint:invoicing billing 0 MKSTREAM
//! XREADGROUP GROUP billing worker-1 COUNT 10 BLOCK 5000 STREAMS saga:{saga:pm}:endpoint:invoicing >
//! XACK saga:{saga:pm}:endpoint:invoicing billing <entry id>
//! ```
//!
//! (and `XAUTOCLAIM` for the messages of consumers that died). The stream
//! keeps about `RedisConfig::endpoint_max_len` messages: once a consumer
//! group reads it, it refuses new ones at that cap (the sending handler's
//! message waits) rather than trim what a group has not acknowledged; one
//! that no group reads keeps its newest.

pub use crate::engine::Consumer;
pub use crate::model::endpoint::{EndpointMessage, ENVELOPE_VERSION, PUBLISHED};

use crate::error::StepError;
use crate::model::message::Message;

impl EndpointMessage {
    /// The payload as an `M`. Another type, or a payload that does not
    /// deserialize as one, is a permanent error (it would never decode):
    /// `?` in a handler dead-letters the message.
    pub fn decode<M: Message>(&self) -> Result<M, StepError> {
        if !self.is::<M>() {
            return Err(StepError::permanent(format!(
                "`{}` is not a `{}`",
                self.message_type,
                M::TYPE
            )));
        }
        serde_json::from_value(self.payload.clone())
            .map_err(|e| StepError::permanent(format!("`{}` does not deserialize: {e}", M::TYPE)))
    }
}
