//! The alphabet of saga and process-manager names.
//!
//! A name becomes part of Redis keys (where `:` separates parts and `{..}`
//! is a hash tag) and of HTTP routes (where `/` and `{..}` have meaning).
//! `acct:x` would read the records of `acct`, and `create{zip}` would make
//! the router panic at startup, so the alphabet is checked here, on the
//! token, instead of failing far away at run time.

use proc_macro2::Span;

use crate::ctxt::Ctxt;

/// The longest name accepted: long enough for any real name, short enough
/// that keys built from it stay small.
const MAX_LEN: usize = 100;

/// Reports `name` (written at `span`) if it is empty, too long or uses a
/// character outside `A-Z a-z 0-9 - _ .` (first character a letter or
/// digit). `what` is "saga" or "process manager"; `example` a good name.
/// Returns whether the name is acceptable.
pub fn check(cx: &Ctxt, what: &str, name: &str, span: Span, example: &str) -> bool {
    let problem = if name.trim().is_empty() {
        format!(
            "the {what} name must not be empty: it identifies its records in the store; \
             write e.g. `name = \"{example}\"` or leave `name` out"
        )
    } else if name.len() > MAX_LEN {
        format!(
            "the {what} name is {} characters long; keep it to {MAX_LEN} (it is part of \
             every key and route of the {what})",
            name.len()
        )
    } else if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        format!(
            "the {what} name `{name}` contains `{}`: use only letters, digits, `-`, `_` and \
             `.` (the name is part of store keys and HTTP routes), e.g. `name = \"{}\"`",
            bad.escape_default(),
            suggestion(name, example)
        )
    } else if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        format!(
            "the {what} name `{name}` must start with a letter or a digit, e.g. \
             `name = \"{}\"`",
            suggestion(name, example)
        )
    } else {
        return true;
    };
    cx.error_at(span, problem);
    false
}

/// `name` with every run of unaccepted characters turned into one `-`.
fn suggestion(name: &str, example: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '_' | '.') {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned();
    if out.is_empty() {
        example.to_owned()
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::suggestion;

    #[test]
    fn suggestions_keep_the_readable_part() {
        assert_eq!(suggestion("create{zip}", "x"), "create-zip");
        assert_eq!(suggestion("acct:x", "x"), "acct-x");
        assert_eq!(suggestion("-a b-", "x"), "a-b");
        assert_eq!(suggestion("{}", "fulfillment"), "fulfillment");
    }
}
