//! What a broker message says, read and written once for every broker.
//!
//! In, a message for a process manager is one of (first match wins):
//!
//! 1. **CloudEvents binary mode**: a `type` attribute (`ce-type` on NATS
//!    and HTTP, `cloudEvents:type` or `cloudEvents_type` on AMQP) names the
//!    message type (`Message::TYPE`), `id` its id, and the body is the
//!    message as JSON;
//! 2. **the envelope v1** (what this library sends: `message_id`,
//!    `message_type`, `payload`; see [`crate::endpoint`]);
//! 3. **a plain JSON body** whose type is the broker's own property (AMQP
//!    `type`) or the last part of the subject it was published to, and
//!    whose id is the broker's (`message_id`, `Nats-Msg-Id`).
//!
//! A saga-starting command's body is the saga's input (or an envelope
//! whose payload is). Every message needs an id: it is what a redelivery
//! is recognised by.
//!
//! Out, the body is the envelope v1 as the handler's save stored it, and
//! the CloudEvents attributes go along as headers ([`attributes`]), so a
//! service that speaks only CloudEvents reads the type, id, source and
//! time without parsing the body.

use serde_json::Value;

use super::{Incoming, Outgoing, RouteKind};
use crate::model::endpoint::EndpointMessage;

/// The CloudEvents spec version written.
pub(crate) const SPEC_VERSION: &str = "1.0";

/// What a delivery is, for the route it came on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Read {
    /// A message for the route's process manager.
    Message {
        message_id: String,
        message_type: String,
        payload: Value,
        traceparent: Option<String>,
    },
    /// A command starting a task of the route's saga.
    Start { key: String, input: Value },
    /// A message of a type (this one) the route's process manager does
    /// not handle, delivered because the broker cannot filter finer (a
    /// NATS consumer of every event): for another process manager, or for
    /// none (then dead-lettered by one route: see the bridge).
    NotOurs(String),
    /// Not something the route can take, and why: dead-lettered.
    Bad(String),
}

/// The CloudEvents attribute `name` among `headers`, under any of the
/// bindings' prefixes (`ce-`, `ce_`, `cloudEvents:`, `cloudEvents_`;
/// case-insensitive).
pub(crate) fn attribute<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find_map(|(key, value)| {
        let key = key.to_ascii_lowercase();
        let bare = ["ce-", "ce_", "cloudevents:", "cloudevents_"]
            .iter()
            .find_map(|p| key.strip_prefix(p))?;
        (bare == name).then_some(value.as_str())
    })
}

/// A header by name, case-insensitive.
fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// The body as JSON, or why not (without quoting it: this is a dead
/// letter's reason).
fn json(body: &[u8]) -> Result<Value, String> {
    serde_json::from_slice(body).map_err(|e| {
        let e = crate::model::decode::without_values(&e.to_string());
        format!("the body is not JSON: {e}")
    })
}

/// The envelope v1 in `body`, if it is one.
fn envelope(body: &Value) -> Option<EndpointMessage> {
    let looks = body.get("message_type").is_some() && body.get("payload").is_some();
    looks
        .then(|| serde_json::from_value::<EndpointMessage>(body.clone()).ok())
        .flatten()
}

const NO_ID: &str = "the message has no id (set the AMQP `message_id`, the `Nats-Msg-Id` header \
                     or the CloudEvents `id`): without one a redelivery could not be recognised";

/// What `incoming` is on a route of `kind`.
pub(crate) fn read(kind: &RouteKind, incoming: &Incoming) -> Read {
    let headers = &incoming.headers;
    let body = match json(&incoming.body) {
        Ok(body) => body,
        Err(why) => return Read::Bad(why),
    };
    let ce_id = attribute(headers, "id");
    let traceparent = header(headers, "traceparent").map(str::to_owned);
    match kind {
        RouteKind::Start { .. } => {
            let (input, id) = match envelope(&body) {
                Some(e) => (e.payload, Some(e.message_id)),
                None => (body, None),
            };
            let key = ce_id
                .map(str::to_owned)
                .or(id)
                .or_else(|| incoming.message_id.clone());
            match key {
                Some(key) if !key.is_empty() => Read::Start { key, input },
                _ => Read::Bad(NO_ID.to_owned()),
            }
        }
        RouteKind::Process { message_types, .. } => {
            let (message_type, id, payload) = match (attribute(headers, "type"), envelope(&body)) {
                (Some(t), _) => (Some(t.to_owned()), ce_id.map(str::to_owned), body),
                (None, Some(e)) => (Some(e.message_type), Some(e.message_id), e.payload),
                (None, None) => {
                    let from_subject = incoming.subject.rsplit('.').next().map(str::to_owned);
                    (incoming.message_type.clone().or(from_subject), None, body)
                }
            };
            let Some(message_type) = message_type.filter(|t| !t.is_empty()) else {
                return Read::Bad(
                    "the message names no type (a CloudEvents `type`, the envelope's \
                     `message_type` or the AMQP `type`)"
                        .to_owned(),
                );
            };
            if !message_types.contains(&message_type.as_str()) {
                // Bound by type, a queue receives only what it handles;
                // what is left came because the broker filters coarser.
                return Read::NotOurs(message_type);
            }
            let message_id = id.or_else(|| incoming.message_id.clone());
            match message_id {
                Some(message_id) if !message_id.is_empty() => Read::Message {
                    message_id,
                    message_type,
                    payload,
                    traceparent,
                },
                _ => Read::Bad(NO_ID.to_owned()),
            }
        }
    }
}

/// The CloudEvents attributes of `message`, bare (`id`, `type`, `source`,
/// `time`, `specversion`, `datacontenttype`): each broker adds its
/// binding's prefix.
pub(crate) fn attributes(message: &EndpointMessage) -> Vec<(&'static str, String)> {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(message.sent_at);
    vec![
        ("specversion", SPEC_VERSION.to_owned()),
        ("id", message.message_id.clone()),
        ("type", message.message_type.clone()),
        ("source", format!("/sagas/{}", message.from)),
        ("time", humantime::format_rfc3339_millis(time).to_string()),
        ("datacontenttype", "application/json".to_owned()),
    ]
}

/// The message to publish for an endpoint's `raw` entry (the envelope as
/// stored); `Err` with why it cannot be (an entry that is not an
/// envelope: dead-lettered on the endpoint).
pub(crate) fn outgoing(raw: &str) -> Result<Outgoing, String> {
    let message = EndpointMessage::parse(raw)?;
    Ok(Outgoing {
        attributes: attributes(&message)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        message_id: message.message_id,
        message_type: message.message_type,
        body: raw.as_bytes().to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incoming(body: &str, headers: &[(&str, &str)]) -> Incoming {
        Incoming {
            body: body.as_bytes().to_vec(),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            message_id: None,
            message_type: None,
            subject: "sagas.events.OrderSubmitted".to_owned(),
            deliveries: 1,
            tag: 0,
        }
    }

    const ORDERS: fn() -> RouteKind = || RouteKind::Process {
        process: "orders",
        message_types: vec!["OrderSubmitted"],
    };

    #[test]
    fn cloudevents_headers_under_any_binding_name_a_message() {
        for (t, i) in [
            ("ce-type", "ce-id"),
            ("cloudEvents:type", "cloudEvents:id"),
            ("cloudEvents_type", "cloudEvents_id"),
            ("CE-TYPE", "Ce-Id"),
        ] {
            let read = read(
                &ORDERS(),
                &incoming(
                    r#"{"order_id":"o-1"}"#,
                    &[(t, "OrderSubmitted"), (i, "e-1")],
                ),
            );
            assert_eq!(
                read,
                Read::Message {
                    message_id: "e-1".into(),
                    message_type: "OrderSubmitted".into(),
                    payload: serde_json::json!({"order_id": "o-1"}),
                    traceparent: None,
                },
                "{t}"
            );
        }
    }

    #[test]
    fn the_envelope_and_a_plain_body_are_read_too() {
        let env = r#"{"v":1,"message_id":"m-1","message_type":"OrderSubmitted","from":"shop","payload":{"order_id":"o-1"}}"#;
        assert!(matches!(read(&ORDERS(), &incoming(env, &[])),
            Read::Message { message_id, payload, .. } if message_id == "m-1" && payload["order_id"] == "o-1"));
        // A plain body: the type from the subject, the id from the broker.
        let mut plain = incoming(r#"{"order_id":"o-2"}"#, &[]);
        plain.message_id = Some("b-2".into());
        assert!(matches!(read(&ORDERS(), &plain),
            Read::Message { message_id, message_type, .. } if message_id == "b-2" && message_type == "OrderSubmitted"));
    }

    #[test]
    fn garbage_no_id_and_other_types_are_told_apart() {
        assert!(
            matches!(read(&ORDERS(), &incoming("not json", &[])), Read::Bad(why) if why.contains("not JSON"))
        );
        assert!(
            matches!(read(&ORDERS(), &incoming("{}", &[])), Read::Bad(why) if why.contains("no id"))
        );
        let other = incoming("{}", &[("ce-type", "Shipped"), ("ce-id", "x")]);
        assert_eq!(read(&ORDERS(), &other), Read::NotOurs("Shipped".into()));
        let start = RouteKind::Start { saga: "zip" };
        assert!(matches!(
            read(&start, &incoming(r#"{"n":1}"#, &[])),
            Read::Bad(_)
        ));
        assert!(
            matches!(read(&start, &incoming(r#"{"n":1}"#, &[("ce-id", "k-1")])),
            Read::Start { key, input } if key == "k-1" && input["n"] == 1)
        );
    }

    #[test]
    fn what_is_sent_carries_its_cloudevents_attributes() {
        let raw = r#"{"v":1,"message_id":"m-9","message_type":"SendInvoice","from":"fulfillment","sent_at":1764000000000,"payload":{}}"#;
        let out = outgoing(raw).unwrap();
        assert_eq!(out.message_id, "m-9");
        let h = |k: &str| {
            out.attributes
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(h("type").as_deref(), Some("SendInvoice"));
        assert_eq!(h("source").as_deref(), Some("/sagas/fulfillment"));
        assert_eq!(h("time").as_deref(), Some("2025-11-24T16:00:00.000Z"));
        assert_eq!(h("specversion").as_deref(), Some("1.0"));
        assert_eq!(out.body, raw.as_bytes());
        assert!(outgoing("garbage").is_err());
    }
}
