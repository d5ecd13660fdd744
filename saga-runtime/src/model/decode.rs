//! JSON decoded into a type, with an error that names the place and the
//! kind of the mismatch, never the value.
//!
//! serde_json's own messages quote the offending value (`invalid type:
//! string "4111 1111 1111 1111", expected u64`), and they end up where
//! everyone reads them: a task's `error`, a dead letter's reason, an HTTP
//! 422 body, logs. An input is the caller's data (a card number, an
//! address): what an operator needs is where it failed and why
//! (`card.number: invalid type: string, expected u64`).

use serde::de::DeserializeOwned;
use serde_json::Value;

/// `value` as a `T`, or what is wrong with it: its path and the kind of
/// the error, without the value.
pub(crate) fn decode<T: DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| describe(e.path(), e.inner()))
}

/// The text of a decoding error at `path`.
fn describe(path: &serde_path_to_error::Path, error: &serde_json::Error) -> String {
    let kind = without_values(&error.to_string());
    let mut segments: Vec<String> = path.iter().map(segment).collect();
    // An unknown field's path ends at the field, a name the input chose.
    if kind.starts_with("unknown field") {
        segments.pop();
    }
    let mut path = String::new();
    for segment in segments {
        if !segment.starts_with('[') && !path.is_empty() {
            path.push('.');
        }
        path.push_str(&segment);
    }
    match path.as_str() {
        "" => kind,
        path => format!("{path}: {kind}"),
    }
}

/// One step of a path: an index, a field name, or `?` for a map key that
/// does not look like a field name (the keys of a map are the input's
/// data, an email or a card number as well as a name).
fn segment(segment: &serde_path_to_error::Segment) -> String {
    use serde_path_to_error::Segment;
    let name = |key: &str| {
        let named = key.len() <= 64
            && key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if named {
            key.to_owned()
        } else {
            "?".to_owned()
        }
    };
    match segment {
        Segment::Seq { index } => format!("[{index}]"),
        Segment::Map { key } => name(key),
        Segment::Enum { variant } => name(variant),
        Segment::Unknown => "?".to_owned(),
    }
}

/// serde's message with the values it quotes taken out. The messages
/// serde's derive and serde_json produce keep their shape (what was found,
/// what was expected); any other (a type's own `Deserialize` check, which
/// may quote what it refused) is replaced as a whole.
pub(crate) fn without_values(message: &str) -> String {
    // serde_json appends the position in a text; a value has none.
    let message = match message.rfind(" at line ") {
        Some(at) if message[at..].contains(" column ") => &message[..at],
        _ => message,
    };
    // The expected part comes from the type, after the last ", expected "
    // (a quoted value may itself contain the words).
    let split = |rest: &str| -> (String, String) {
        match rest.rfind(", expected ") {
            Some(at) => (rest[..at].to_owned(), rest[at..].to_owned()),
            None => (rest.to_owned(), String::new()),
        }
    };
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            let (found, expected) = split(rest);
            return format!("{prefix}{}{expected}", unexpected_kind(&found));
        }
    }
    if message.starts_with("invalid length ") || message.starts_with("missing field `") {
        return message.to_owned();
    }
    for (prefix, kind) in [
        ("unknown variant `", "unknown variant"),
        ("unknown field `", "unknown field"),
        ("duplicate field `", "duplicate field"),
    ] {
        if let Some(rest) = message.strip_prefix(prefix) {
            let (_, expected) = split(rest);
            return format!("{kind}{expected}");
        }
    }
    // JSON syntax: serde_json's words, which quote nothing.
    const SYNTAX: &[&str] = &[
        "EOF while parsing",
        "expected ",
        "trailing ",
        "key must be",
        "invalid escape",
        "invalid number",
        "number out of range",
        "invalid unicode code point",
        "control character",
        "lone leading surrogate",
        "unexpected end of hex escape",
        "recursion limit exceeded",
    ];
    if SYNTAX.iter().any(|s| message.starts_with(s)) {
        return message.to_owned();
    }
    "invalid value (refused by the type's own check)".to_owned()
}

/// What serde's `Unexpected` says was found, without the value:
/// `string "4111"` is `string`, ``integer `5` `` is `integer`.
fn unexpected_kind(found: &str) -> &str {
    let end = found.find(['"', '`', '\'']).unwrap_or(found.len());
    match found[..end].trim() {
        "" => "value",
        kind => kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Card {
        number: u64,
        holder: Holder,
        kind: Kind,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Holder {
        name: String,
        tags: Vec<u8>,
    }

    #[derive(Debug, Deserialize)]
    enum Kind {
        Visa,
    }

    fn error(value: Value) -> String {
        decode::<Card>(value).unwrap_err()
    }

    const SECRET: &str = "4111 1111 1111 1111";

    #[test]
    fn errors_name_the_place_and_the_kind_not_the_value() {
        let good =
            serde_json::json!({"number": 1, "holder": {"name": "a", "tags": []}, "kind": "Visa"});
        assert!(decode::<Card>(good.clone()).is_ok());
        let with = |path: &[&str], v: Value| {
            let mut value = good.clone();
            let mut at = &mut value;
            for p in &path[..path.len() - 1] {
                at = &mut at[*p];
            }
            at[path[path.len() - 1]] = v;
            value
        };
        let cases = [
            (
                with(&["number"], SECRET.into()),
                "number: invalid type: string, expected u64",
            ),
            (
                with(&["number"], serde_json::json!(-41111111)),
                "number: invalid value: integer, expected u64",
            ),
            (
                with(&["holder", "name"], serde_json::json!(41111111)),
                "holder.name: invalid type: integer, expected a string",
            ),
            (
                with(&["holder", "tags"], serde_json::json!([1, 4111])),
                "holder.tags[1]: invalid value: integer, expected u8",
            ),
            (
                with(&["kind"], SECRET.into()),
                "kind: unknown variant, expected `Visa`",
            ),
            (
                with(&[SECRET], serde_json::json!(1)),
                "unknown field, expected one of `number`, `holder`, `kind`",
            ),
            (
                serde_json::json!(SECRET),
                "invalid type: string, expected struct Card",
            ),
        ];
        for (value, want) in cases {
            let got = error(value);
            assert_eq!(got, want);
            assert!(!got.contains("4111"), "{got}");
        }
        let missing = serde_json::json!({"number": 1});
        assert_eq!(error(missing), "missing field `holder`");
        // A map's keys are data: a key that is no name is not repeated.
        let keyed = serde_json::json!({SECRET: "x", "alice@example.com": 1});
        let got = decode::<std::collections::BTreeMap<String, u32>>(keyed).unwrap_err();
        assert_eq!(got, "?: invalid type: string, expected u32");
    }

    #[test]
    fn a_types_own_check_is_not_quoted() {
        let got = decode::<uuid::Uuid>(Value::from(SECRET)).unwrap_err();
        assert!(!got.contains("4111"), "{got}");
        assert_eq!(got, "invalid value (refused by the type's own check)");
    }
}
