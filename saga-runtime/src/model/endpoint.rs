//! What a process manager sends to an endpoint, as other services read it:
//! the documented envelope (see [`crate::endpoint`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::message::Message;

/// The version of the envelope this library writes.
pub const ENVELOPE_VERSION: u32 = 1;

/// The endpoint everything published also goes to.
pub const PUBLISHED: &str = "published";

/// A message sent to an endpoint: the documented envelope, plus how many
/// times it has been delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointMessage {
    /// The envelope's version.
    #[serde(default = "version_one")]
    pub v: u32,
    /// Unique per message; duplicates of it share it.
    pub message_id: String,
    /// The sender's `Message::TYPE`.
    pub message_type: String,
    /// The process manager that sent it.
    pub from: String,
    /// The message's `#[correlation_id]`, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// `instance`: the sending instance.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// When it was sent, in ms since the epoch (0 if unknown).
    #[serde(default)]
    pub sent_at: u64,
    /// The message as JSON.
    pub payload: Value,
    /// How many times it has been delivered to the group (1 the first
    /// time). Not part of the envelope.
    #[serde(skip)]
    pub deliveries: u32,
}

fn version_one() -> u32 {
    1
}

impl EndpointMessage {
    /// Whether it is an `M`.
    pub fn is<M: Message>(&self) -> bool {
        self.message_type == M::TYPE
    }

    /// The envelope as stored.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// An envelope as stored; `Err` with the reason if it is not one.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let message: EndpointMessage = serde_json::from_str(raw).map_err(|e| {
            // Not the values it quotes: this is a dead letter's reason.
            let e = super::decode::without_values(&e.to_string());
            format!("not an envelope: {e}")
        })?;
        if message.v != ENVELOPE_VERSION {
            return Err(format!(
                "envelope version {} (this library reads {ENVELOPE_VERSION})",
                message.v
            ));
        }
        Ok(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_envelope_parses_and_round_trips() {
        let doc = r#"{
          "v": 1,
          "message_id": "0b5c6a9e",
          "message_type": "SendInvoice",
          "from": "fulfillment",
          "correlation_id": "order-17",
          "headers": { "instance": "order-17" },
          "sent_at": 1764000000000,
          "payload": { "order": "order-17", "amount": 250 },
          "added_later": true
        }"#;
        let m = EndpointMessage::parse(doc).unwrap();
        assert_eq!(m.message_type, "SendInvoice");
        assert_eq!(m.headers["instance"], "order-17");
        assert_eq!(m.payload["amount"], 250);
        assert_eq!(EndpointMessage::parse(&m.encode()).unwrap(), m);
        assert!(EndpointMessage::parse(
            r#"{"v": 2, "message_id": "x", "message_type": "t", "from": "f", "payload": null}"#
        )
        .unwrap_err()
        .contains("version 2"));
        assert!(EndpointMessage::parse("garbage").is_err());
    }
}
