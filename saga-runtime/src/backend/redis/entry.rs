//! Decoding stream entries one by one, from raw replies.
//!
//! Replies are read as raw [`Value`]s rather than through the `redis`
//! crate's typed stream replies, because one entry a typed reply cannot
//! represent (a field name that is not UTF-8) would fail the whole reply
//! after the server had already handed every entry in it to this consumer:
//! they would all be stranded. Here each entry stands alone; one that does
//! not decode becomes a delivery with an error, which the engine
//! dead-letters on its own.

use redis::Value;

use crate::backend::{Delivery, WorkItem};

/// The bytes of a string-like value.
pub(super) fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes()),
        _ => None,
    }
}

/// A string-like value as text (lossy).
pub(super) fn text(value: &Value) -> String {
    match value {
        Value::Int(n) => n.to_string(),
        other => bytes(other).map(lossy).unwrap_or_default(),
    }
}

/// Bytes as text, invalid UTF-8 replaced: `String::from_utf8_lossy`, with
/// valid text (every reply the engine writes) checked by `str::from_utf8`,
/// whose ASCII fast path is several times cheaper than the lossy decoder
/// on a whole task record.
fn lossy(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(b).into_owned(),
    }
}

/// The elements of an array (or a map, flattened).
/// Element `i` of a script's reply list as text; `None` when it is missing
/// or nil (Lua's `false`).
pub(super) fn text_at<V: std::borrow::Borrow<Value>>(items: &[V], i: usize) -> Option<String> {
    items
        .get(i)
        .map(|v| v.borrow())
        .filter(|v| !matches!(v, Value::Nil))
        .map(text)
}

pub(super) fn items(value: &Value) -> Vec<&Value> {
    match value {
        Value::Array(items) | Value::Set(items) => items.iter().collect(),
        Value::Map(pairs) => pairs.iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => Vec::new(),
    }
}

/// An entry's fields as `(name, value)` pairs, bytes as they are.
pub(super) fn fields(value: &Value) -> Vec<(&[u8], &Value)> {
    items(value)
        .chunks(2)
        .filter_map(|kv| match kv {
            [k, v] => Some((bytes(k).unwrap_or_default(), *v)),
            _ => None,
        })
        .collect()
}

/// The stream entries of an `XREADGROUP`/`XRANGE`-shaped list:
/// `(entry id, fields)`.
pub(super) fn entries(value: &Value) -> Vec<(String, &Value)> {
    items(value)
        .into_iter()
        .filter_map(|entry| match items(entry).as_slice() {
            [id, fields, ..] => Some((text(id), *fields)),
            _ => None,
        })
        .collect()
}

/// Turns one raw entry into a delivery. `redis_count` is the delivery count
/// Redis keeps (1 for a first read); a message handed back carries its
/// earlier unanswered deliveries in its `unanswered` field.
pub(super) fn delivery(
    stream: u16,
    id: &str,
    raw_fields: &Value,
    redis_count: u64,
    consumer: &str,
) -> Delivery {
    let fields = fields(raw_fields);
    let payload = fields
        .iter()
        .find(|(name, _)| *name == b"payload")
        .and_then(|(_, v)| bytes(v));
    let carried: u64 = fields
        .iter()
        .find(|(name, _)| *name == b"unanswered")
        .map(|(_, v)| text(v).parse().unwrap_or(0))
        .unwrap_or(0);
    let raw = match payload {
        Some(p) => lossy(p),
        None => fields
            .iter()
            .map(|(k, v)| format!("{}={}", String::from_utf8_lossy(k), text(v)))
            .collect::<Vec<_>>()
            .join(" "),
    };
    let item = match payload {
        Some(p) => WorkItem::decode(p),
        None => Err(format!(
            "malformed message (a stream entry with no `payload` field; fields: {})",
            if raw.is_empty() { "none" } else { &raw }
        )),
    };
    // `format!` costs as much as the rest of this function.
    let mut full_id = String::with_capacity(6 + id.len());
    push_number(&mut full_id, stream);
    full_id.push('/');
    full_id.push_str(id);
    Delivery {
        id: full_id,
        item,
        raw,
        deliveries: (carried + redis_count.max(1)).min(u32::MAX as u64) as u32,
        consumer: consumer.to_owned(),
        lease: None,
        instance: None,
    }
}

/// Appends `n` in decimal.
fn push_number(out: &mut String, n: u16) {
    if n >= 10 {
        push_number(out, n / 10);
    }
    out.push(char::from(b'0' + (n % 10) as u8));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(b: &[u8]) -> Value {
        Value::BulkString(b.to_vec())
    }

    #[test]
    fn an_entry_without_a_readable_payload_is_an_error_of_its_own() {
        let good = Value::Array(vec![bulk(b"payload"), bulk(b"{not json")]);
        let d = delivery(0, "1-0", &good, 3, "c");
        assert_eq!(d.id, "0/1-0");
        assert_eq!(delivery(65535, "7-2", &good, 1, "c").id, "65535/7-2");
        assert_eq!(delivery(10, "7-2", &good, 1, "c").id, "10/7-2");
        assert_eq!(d.deliveries, 3);
        assert!(d.item.unwrap_err().starts_with("malformed message"));

        let bad = Value::Array(vec![bulk(&[0xff, 0xfe]), bulk(b"x")]);
        let d = delivery(2, "5-1", &bad, 1, "c");
        let error = d.item.unwrap_err();
        assert!(
            error.starts_with("malformed message") && error.contains("no `payload` field"),
            "{error}"
        );
        assert!(d.raw.contains('x'), "{}", d.raw);

        let carried = Value::Array(vec![
            bulk(b"payload"),
            bulk(b"{}"),
            bulk(b"unanswered"),
            bulk(b"4"),
        ]);
        assert_eq!(delivery(0, "1-0", &carried, 2, "c").deliveries, 6);
    }
}
