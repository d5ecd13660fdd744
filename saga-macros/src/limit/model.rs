//! What one valid `#[limit(..)]` declares, independent of how it was
//! written: the IR that `check.rs` relates across methods and `expand.rs`
//! turns into a `LimitSpec`. Values keep the span of their token, so that
//! an error about one setting points at it.

use darling::util::SpannedValue;
use proc_macro2::{Span, TokenStream};
use syn::{Ident, Member};

/// Where a `#[limit]` is written: a step of a `#[saga]`, or a handler of a
/// `#[process_manager]`. Decides the key's base word and the wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    Step,
    Handler,
}

impl Site {
    /// What a key's path starts with: `input.<field>` or `msg.<field>`.
    pub fn base(self) -> &'static str {
        match self {
            Site::Step => "input",
            Site::Handler => "msg",
        }
    }

    /// A field to key by, for examples.
    pub fn example_field(self) -> &'static str {
        match self {
            Site::Step => "merchant_id",
            Site::Handler => "customer_id",
        }
    }

    /// What the key is read from, for messages.
    pub fn read_from(self) -> &'static str {
        match self {
            Site::Step => "the step's input",
            Site::Handler => "the handler's message",
        }
    }

    /// What the parameter the key may also start with is, for messages.
    pub fn param(self) -> &'static str {
        match self {
            Site::Step => "the input parameter",
            Site::Handler => "the message parameter",
        }
    }
}

/// One `#[limit(..)]`, every setting valid.
#[derive(Clone)]
pub struct Limit {
    /// The whole attribute, for errors about it as a whole.
    pub attr: TokenStream,
    /// `name = ".."`; `None` for the default, `{owner}.{method}`.
    pub name: Option<SpannedValue<String>>,
    /// `concurrency = N`.
    pub concurrency: Option<SpannedValue<u32>>,
    /// `rate = N, per = "..", burst = B`.
    pub rate: Option<RateDef>,
    /// `key = input.field`.
    pub key: Option<KeyDef>,
}

#[derive(Clone)]
pub struct RateDef {
    /// `rate = N`.
    pub count: SpannedValue<u32>,
    /// `per = ".."` in milliseconds; `None` for the default.
    pub per_ms: Option<SpannedValue<u64>>,
    /// `burst = B`; `None` for the default.
    pub burst: Option<SpannedValue<u32>>,
}

/// The period of a rate that does not give one: "100 per second" is how
/// providers state their quotas.
pub const DEFAULT_PER_MS: u64 = 1000;

/// The burst of a rate that does not give one: starts evenly paced, so a
/// quota stated per second is never spent in its first millisecond.
pub const DEFAULT_BURST: u32 = 1;

impl RateDef {
    pub fn per_ms(&self) -> u64 {
        self.per_ms.as_ref().map_or(DEFAULT_PER_MS, |p| **p)
    }

    pub fn burst(&self) -> u32 {
        self.burst.as_ref().map_or(DEFAULT_BURST, |b| **b)
    }
}

/// `key = input.a.b`: the base as written and the fields, each token
/// keeping the user's span (rustc's "no field" and the `LimitKeyValue`
/// diagnostic point there).
#[derive(Clone)]
pub struct KeyDef {
    pub base: Ident,
    pub fields: Vec<Member>,
}

impl KeyDef {
    /// The key as written, `input.merchant_id`: what the engine's messages
    /// say it is keyed by.
    pub fn text(&self) -> String {
        let mut text = self.base.to_string();
        for field in &self.fields {
            text.push('.');
            text.push_str(&member_text(field));
        }
        text
    }

    pub fn base_span(&self) -> Span {
        self.base.span()
    }
}

pub fn member_text(member: &Member) -> String {
    match member {
        Member::Named(ident) => syn::ext::IdentExt::unraw(ident).to_string(),
        Member::Unnamed(index) => index.index.to_string(),
    }
}

/// What all uses of one name must agree on (the key excepted: steps with
/// different inputs may share one budget): `LimitSpec::config` at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub concurrency: Option<u32>,
    /// `(count, per in ms, burst)`.
    pub rate: Option<(u32, u64, u32)>,
}

impl Limit {
    /// `name = ".."`, or `{owner}.{method}` (`owner` is the saga's or the
    /// process manager's name).
    pub fn name_in(&self, owner: &str, method: &Ident) -> String {
        match &self.name {
            Some(name) => (**name).clone(),
            None => format!("{owner}.{}", syn::ext::IdentExt::unraw(method)),
        }
    }

    pub fn config(&self) -> Config {
        Config {
            concurrency: self.concurrency.as_ref().map(|c| **c),
            rate: self
                .rate
                .as_ref()
                .map(|r| (*r.count, r.per_ms(), r.burst())),
        }
    }
}

impl std::fmt::Display for Config {
    /// `concurrency = 10, rate = 100, per = "1s", burst = 20`: as a user
    /// would write it, defaults spelled out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(n) = self.concurrency {
            parts.push(format!("concurrency = {n}"));
        }
        if let Some((count, per_ms, burst)) = self.rate {
            parts.push(format!(
                "rate = {count}, per = \"{}\", burst = {burst}",
                period_text(per_ms)
            ));
        }
        f.write_str(&parts.join(", "))
    }
}

/// A period in the largest unit that divides it: `1s`, `500ms`, `2m`.
pub fn period_text(ms: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("h", 3_600_000), ("m", 60_000), ("s", 1000)];
    for (unit, size) in UNITS {
        if ms / size * size == ms {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_read_back_in_their_largest_unit() {
        assert_eq!(period_text(1000), "1s");
        assert_eq!(period_text(500), "500ms");
        assert_eq!(period_text(120_000), "2m");
        assert_eq!(period_text(7_200_000), "2h");
        assert_eq!(period_text(1500), "1500ms");
        let config = Config {
            concurrency: Some(3),
            rate: Some((100, 1000, 20)),
        };
        assert_eq!(
            config.to_string(),
            "concurrency = 3, rate = 100, per = \"1s\", burst = 20"
        );
    }
}
