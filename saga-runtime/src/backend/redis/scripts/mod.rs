//! The Lua scripts. Each one is a single atomic step of the protocol; each
//! touches only the keys it is given, all of one partition (see `keys.rs`).
//!
//! Two rules every script follows:
//!
//! - **Refuse before writing.** A script that fails half-way keeps the
//!   writes it made (Redis has no rollback), so every check (fence, version,
//!   cancellation) comes before the first write.
//! - **Settle with `pcall`.** Acknowledging a message whose consumer group
//!   is gone (Redis restarted empty, failed over) must not fail the write it
//!   settles: with no group there is nothing pending to acknowledge.
//!
//! Time is the server's (`TIME`): delays and expiries do not depend on the
//! clocks of the machines the workers run on.
//!
//! The scripts are files under `lua/`, one per script, each opening with
//! what it takes (`KEYS`, `ARGV`) and what it returns, and binding every
//! key and argument to a named local. What several share is a `local
//! function` under `lua/lib/`, which takes its inputs as arguments and
//! returns its results (no fragment leaves globals for its includer); a
//! script is its libraries' text followed by its own, concatenated at
//! compile time. Refusals have named codes (`lua/lib/refusals.lua`), the
//! same table as [`RefusalCode`].
//!
//! On the Rust side each script has one typed call (a struct per script,
//! see [`Call`]): callers fill named fields, the order of the keys and
//! arguments lives in the call's `fill` alone, next to the script's header,
//! and the reply is decoded in the call's `decode`. Refusals come back as
//! values ([`Refused`]); each caller maps them to the errors it returns in
//! one small function.

mod coordination;
mod housekeeping;
mod invocation;
mod limits;
mod process;
mod queue;
mod refusal;
mod task;

use std::sync::LazyLock;

use redis::{FromRedisValue, Script, Value};

use super::{unavailable, RedisBackend};
use crate::backend::BackendError;
pub(super) use coordination::*;
pub(super) use housekeeping::*;
pub(super) use invocation::{Invocation, ScriptCmd};
pub(super) use limits::*;
pub(super) use process::*;
pub(super) use queue::*;
pub(super) use refusal::RefusalCode;
pub(super) use task::*;

/// One call of a script: its keys and arguments as named fields, and its
/// reply decoded.
pub(super) trait Call {
    /// The reply, decoded.
    type Reply;

    /// The script called.
    fn script() -> &'static Script;

    /// Adds the keys and the arguments, in the order the script's header
    /// gives them: the one place that order is written down in Rust.
    fn fill(&self, invocation: &mut Invocation);

    /// Reads the script's reply.
    fn decode(reply: Value) -> Result<Self::Reply, BackendError>;

    /// The call, ready to run: `EVALSHA` with the keys and arguments,
    /// built once (see `invocation.rs`).
    fn invocation(&self) -> ScriptCmd {
        let mut invocation = Invocation::new(Self::script());
        self.fill(&mut invocation);
        invocation.ready()
    }
}

impl RedisBackend {
    /// Runs a script call (recreating lost consumer groups, as
    /// [`run`](RedisBackend::run) does) and decodes its reply.
    pub(super) async fn call<C: Call>(&self, call: &C) -> Result<C::Reply, BackendError> {
        let invocation = call.invocation();
        let reply: Value = match durable(C::script()) {
            true => self.run_durable(invocation).await?,
            false => self.run(&invocation).await?,
        };
        C::decode(reply)
    }
}

/// Whether `script` records what the engine reports or builds on (a start,
/// a step's outcome, a cancellation, a dead letter, a process manager's
/// commit, a published message, a tally): at a `RedisConfig::durability`
/// level above the default it waits for the level (`durability.rs`).
/// Leases, reads, acknowledgements and housekeeping do not: a failover
/// that loses one of those redelivers or redoes it. A limit's grant does
/// (an attempt starts on it: lost, its slot or token would be given
/// again); its release and renewal do not (lost, a slot is held until its
/// hold runs out, or renewed by the next renewal).
fn durable(script: &Script) -> bool {
    [
        &LIMIT_ACQUIRE,
        &CREATE,
        &APPLY,
        &CANCEL,
        &DEAD_LETTER,
        &PARK,
        &REQUEUE,
        &ENQUEUE_PM,
        &PROCESS_COMMIT,
        &PROCESS_HOLD,
        &ENDPOINT_APPEND,
        &TALLY_FINISH,
        &TALLY_PROGRESS,
    ]
    .iter()
    .any(|durable| std::ptr::eq(&***durable, script))
}

/// A refused write: why, and what came with the refusal (the stored fence,
/// version or cancellation flag, the owner of an entry, a tally's number),
/// as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refused {
    pub refusal: RefusalCode,
    pub detail: Option<String>,
}

/// A reply read as `T`, failing as a typed invocation fails (a reply of
/// another shape is the same error as before the calls were typed).
fn typed<T: FromRedisValue>(reply: Value) -> Result<T, BackendError> {
    redis::from_redis_value(reply).map_err(|e| unavailable(e.into()))
}

/// A flag argument: `'1'` or `'0'`.
fn flag(on: bool) -> &'static str {
    match on {
        true => "1",
        false => "0",
    }
}

/// An optional argument: its text, or `''` for none.
fn or_empty<T: ToString>(value: Option<T>) -> String {
    value.map(|v| v.to_string()).unwrap_or_default()
}

/// A script: the text of the libraries it names (`lua/lib/<name>.lua`, in
/// that order: a library comes after those it uses), then its own
/// (`lua/<file>.lua`). Plain concatenation: the Lua is as written, no
/// braces doubled for `format!`.
macro_rules! lua {
    ($file:literal $(, $lib:literal)*) => {
        concat!(
            $(include_str!(concat!("../lua/lib/", $lib, ".lua")),)*
            include_str!(concat!("../lua/", $file, ".lua"))
        )
    };
}

/// Declares each script's source (`<NAME>_LUA`) and its [`Script`], and
/// [`ALL`], every script by file name (what the tests load into a server).
macro_rules! scripts {
    ($($name:ident = $file:literal $(with $($lib:literal),+)?;)*) => {
        $(
            #[doc = concat!("`lua/", $file, ".lua`.")]
            static $name: LazyLock<Script> =
                LazyLock::new(|| Script::new(lua!($file $($(, $lib)+)?)));
        )*

        /// Every script, by file name, with the libraries it is built from.
        #[cfg_attr(not(test), allow(dead_code))]
        static ALL: &[(&str, &[&str], &LazyLock<Script>)] = &[
            $(($file, &[$($($lib),+)?], &$name),)*
        ];
    };
}

scripts! {
    CREATE = "create" with "audit", "record";
    LOCK = "lock" with "record";
    APPLY = "apply" with "refusals", "time", "settle", "audit", "guard_task", "record",
        "effect_put", "effect_claim", "effect_renew", "effect_enqueue", "effect_settle",
        "effect_retain", "effect_lease";
    HEARTBEAT = "heartbeat";
    UNLOCK = "unlock";
    CANCEL = "cancel" with "audit";
    ACK = "ack" with "settle";
    RELEASE = "release" with "time";
    TAKE = "take" with "route", "record";
    CLAIM = "claim";
    DEAD_LETTER = "dead_letter" with "time", "settle";
    PARK = "park" with "time";
    REQUEUE = "requeue";
    RELEASE_DELAYED = "release_delayed" with "time", "move_due";
    SHARE = "share";
    ENQUEUE_PM = "enqueue_pm" with "time", "pm_queue";
    EXPIRED = "expired" with "time";
    PURGE = "purge" with "time";
    TRIM_DEAD = "trim_dead" with "time";
    REAP_CONSUMERS = "reap_consumers";
    LEAVE_GROUP = "leave_group";
    PROCESS_COMMIT = "process_commit" with "refusals", "time", "settle", "pm_queue", "held", "endpoint_room";
    ENDPOINT_APPEND = "endpoint_append" with "refusals", "endpoint_room";
    PROCESS_HOLD = "process_hold" with "refusals", "time", "settle", "pm_queue", "held";
    RELEASE_HELD = "release_held" with "pm_queue", "held";
    RELEASE_DUE = "release_due" with "time", "pm_queue", "route";
    CLAIM_ENTRY = "claim_entry" with "refusals";
    SWAP_ENTRY = "swap_entry";
    REMEMBER = "remember";
    NAMED_LEASE = "named_lease";
    BREAKER_ACQUIRE = "breaker_acquire" with "time";
    BREAKER_REPORT = "breaker_report" with "time";
    TALLY_FINISH = "tally_finish" with "time", "pm_queue";
    TALLY_PROGRESS = "tally_progress";
    ENDPOINT_TAKE = "endpoint_take";
    ENDPOINT_SETTLE = "endpoint_settle" with "time";
    BALANCE = "balance" with "time", "move_due";
    ANNOUNCE = "announce" with "time";
    RUNNERS = "runners" with "time";
    READERS = "readers" with "time";
    LIMIT_ACQUIRE = "limit_acquire" with "limit_state";
    LIMIT_RELEASE = "limit_release" with "limit_state";
    LIMIT_LEAVE = "limit_leave" with "limit_state";
    LIMIT_RENEW = "limit_renew" with "limit_state";
    LIMIT_USAGE = "limit_usage" with "limit_state";
    WAKE = "wake";
}

#[cfg(test)]
mod tests;
