//! Flow control declared on a step or a handler: `#[limit(..)]`.
//!
//! A step usually calls someone else's service, and that service has a
//! budget: so many requests per second, so many connections at once,
//! often per merchant or per account. A limit spends that budget across the
//! whole deployment (every worker of every engine on the backend), so that
//! a burst of tasks waits its turn instead of being throttled, burning its
//! retries and compensating orders that would have gone through a second
//! later.
//!
//! An attempt that cannot start now is *parked*: the task is handed back as
//! a durable scheduled message (no worker, lease or retry is held while it
//! waits, and the wait counts against neither its retries nor its timeout)
//! and comes back when a slot or token is due. A concurrency slot is a lease
//! of the attempt's: renewed with the task's lease while the attempt runs,
//! freed when it ends, and freed by expiry when its worker is killed.
//!
//! These are the declarations `#[limit]` generates; the engine applies them
//! (`worker`), the backend keeps their state ([`Limits`](crate::backend::Limits)),
//! and [`machine`] decides what each request gets.

pub mod decision;
pub mod machine;

use std::fmt;
use std::time::Duration;

use serde_json::Value;

/// One `#[limit(..)]` as declared on a step or a handler.
#[derive(Debug, Clone, Copy)]
pub struct LimitSpec {
    /// `name = ".."`, shared by every step and handler that names it; by
    /// default `{saga}.{step}` (or `{process}.{handler}`).
    pub name: &'static str,
    /// `concurrency = N`: at most N attempts run at once.
    pub concurrency: Option<u32>,
    /// `rate = N, per = "..", burst = B`: at most N attempts start per period.
    pub rate: Option<Rate>,
    /// `key = input.field`: the limit applies per value of that field.
    pub key: Option<LimitKey>,
}

impl LimitSpec {
    /// The configuration engines must agree on for this name (the key is
    /// not part of it: steps with different inputs may share a budget).
    pub fn config(&self) -> LimitConfig {
        LimitConfig {
            concurrency: self.concurrency,
            rate: self.rate,
        }
    }
}

/// What a limit allows, the same for every engine of a deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitConfig {
    /// At most this many attempts at once.
    pub concurrency: Option<u32>,
    /// At most this many starts per period.
    pub rate: Option<Rate>,
}

impl fmt::Display for LimitConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(n) = self.concurrency {
            parts.push(format!("concurrency = {n}"));
        }
        if let Some(rate) = self.rate {
            parts.push(rate.to_string());
        }
        f.write_str(&parts.join(", "))
    }
}

/// A start rate: `count` per `per`, of which up to `burst` may start at
/// once (a token bucket of `burst` tokens refilled at `count / per`). Over
/// any window of length `T`, at most `burst + count * T / per` attempts
/// start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// How many starts per period.
    pub count: u32,
    /// The period.
    pub per: Duration,
    /// How many may start at once (default 1: evenly paced).
    pub burst: u32,
}

impl Rate {
    /// The steady gap between two starts: `per / count`.
    pub fn interval(&self) -> Duration {
        self.per / self.count.max(1)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rate = {} per {}, burst = {}",
            self.count,
            humantime::format_duration(self.per),
            self.burst
        )
    }
}

/// `key = input.field`: how the key is read from the step's (or the
/// handler's message's) JSON.
#[derive(Clone, Copy)]
pub struct LimitKey {
    /// The expression as written, for messages.
    pub expr: &'static str,
    /// Reads the key from the input; the error says why it could not.
    pub of: fn(&Value) -> Result<String, String>,
}

impl fmt::Debug for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitKey")
            .field("expr", &self.expr)
            .finish()
    }
}

/// A value a limit can be keyed by: anything with a `Display` (numbers,
/// strings, ids).
#[diagnostic::on_unimplemented(
    message = "a limit cannot be keyed by `{Self}`: the key must implement `Display`",
    label = "this field's type has no `Display`",
    note = "key by a field that is a number, a string or an id (`key = input.merchant_id`), or implement `Display` for `{Self}`"
)]
pub trait LimitKeyValue {
    /// The key as the backend stores it.
    fn limit_key(&self) -> String;
}

impl<T: fmt::Display + ?Sized> LimitKeyValue for T {
    fn limit_key(&self) -> String {
        self.to_string()
    }
}

/// Asked of a key whose type is an `Option`, and implemented by nothing:
/// an attempt spends from the budget of its key's value, and `None` names
/// no budget. Without it such a key would fail as "not `Display`", where
/// rustc suggests an `.unwrap()` that the key syntax (a path to a field)
/// does not take; the macro can't tell an `Option` itself, the input type
/// being declared elsewhere.
#[diagnostic::on_unimplemented(
    message = "a limit cannot be keyed by `{Self}`: a key cannot go through an `Option`",
    label = "this field may be `None`, which names no budget",
    note = "key by a field that is always set (`merchant_id: u64`, not `Option<u64>`); if the value may be missing, add such a field to the input, filled in where the input is made (the value, or e.g. \"none\" for the inputs without one, which then share one budget), and key by it"
)]
pub trait KeyIsNotAnOption {}

/// How generated code reads a key: `LimitKeyValue::limit_key(LimitKey::probe(&key).value())`.
/// `value` is an inherent method of [`KeyProbe`] for an `Option` (which asks
/// for [`KeyIsNotAnOption`], and so is one error that says why) and, for
/// any other type, the method of [`KeyValue`] that `KeyProbe` derefs to (the
/// key itself, for `LimitKeyValue` to judge with its own message).
impl LimitKey {
    #[doc(hidden)]
    pub fn probe<T: ?Sized>(key: &T) -> KeyProbe<'_, T> {
        KeyProbe(KeyValue(key))
    }
}

/// See [`LimitKey::probe`].
#[doc(hidden)]
pub struct KeyProbe<'a, T: ?Sized>(KeyValue<'a, T>);

/// See [`LimitKey::probe`].
#[doc(hidden)]
pub struct KeyValue<'a, T: ?Sized>(&'a T);

/// Which types [`KeyProbe`]'s own `value` applies to: `Option`s (and, as
/// for every bound, a key whose type is already an error, such as a field
/// the input lacks, so that rustc's "no field" stays the one error; written
/// as `impl<T> KeyProbe<'_, Option<T>>` instead, the error type would match
/// `Option<_>` and be reported again as an `Option`).
#[doc(hidden)]
pub trait IsOption {}

impl<T> IsOption for Option<T> {}

impl<T: IsOption> KeyProbe<'_, T> {
    /// Never compiles for an `Option`, which does not implement
    /// `KeyIsNotAnOption`. Returns a `Display` type so that the key's own
    /// call adds no error.
    pub fn value(&self) -> &'static str
    where
        T: KeyIsNotAnOption,
    {
        ""
    }
}

impl<'a, T: ?Sized> std::ops::Deref for KeyProbe<'a, T> {
    type Target = KeyValue<'a, T>;

    fn deref(&self) -> &KeyValue<'a, T> {
        &self.0
    }
}

impl<'a, T: ?Sized> KeyValue<'a, T> {
    /// The key, for any type but an `Option`.
    pub fn value(&self) -> &'a T {
        self.0
    }
}

/// What generated code calls with the input decoded the way the rest of
/// the generated code decodes it (a saga's `Codec`, a message's
/// `message_ops`): a type that does not decode is then reported once, by
/// the check that names it, rather than again by a bound of its own.
#[doc(hidden)]
pub fn limit_key_from<T, E: fmt::Display>(
    decoded: Result<T, E>,
    read: fn(&T) -> String,
) -> Result<String, String> {
    decoded
        .map(|input| read(&input))
        .map_err(|error| format!("the input does not decode: {error}"))
}
