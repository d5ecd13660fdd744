//! A script call built once, straight into the command that is sent.
//!
//! redis-rs's `ScriptInvocation` copies every key and argument into a
//! `Vec<u8>` of its own, copies them all again into the `EVALSHA` command
//! when it is sent, then frees them: on the engine's hot path (a step runs
//! several scripts, some with the task's record as an argument) that was
//! 17k of the 121k instructions of a step (`bench_redis --instructions`,
//! 103.5k without). Here the arguments, the bulk of the bytes, are
//! written once, into the final [`Cmd`]; only the keys (a few short
//! names) are copied once more, because `EVALSHA` takes their count
//! before them.

use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, ErrorKind, FromRedisValue, RedisResult, RedisWrite, Script, ToRedisArgs};

/// Bytes reserved for the arguments at first. Measured with `bench_redis`:
/// a step's calls carry up to 1.3 KB of arguments (the task's record
/// among them), and a buffer that grows copies what it holds each time
/// (with 512 that was 4k instructions a step). A larger record grows it
/// once or twice, as any `Vec` grows.
const ARGS_BYTES: usize = 2048;

/// Arguments reserved for at first: a step's calls have up to 30 (then a
/// push past the capacity moves them all).
const ARGS_COUNT: usize = 40;

/// Room for the keys, held apart until the first argument: up to 12 in a
/// step's calls, of about 30 bytes each.
const KEYS: (usize, usize) = (16, 512);

/// A script call being filled ([`Call::fill`](super::Call::fill)): keys
/// first, then arguments, as every script's header lists them.
pub(in crate::backend::redis) struct Invocation {
    script: &'static Script,
    /// The keys, until the first argument comes: `EVALSHA` takes their
    /// count before them, so they are held here (names, flat in one
    /// buffer) until it is known.
    keys: Cmd,
    /// `EVALSHA <sha> <numkeys> <keys..> <args..>`, begun at the first
    /// argument (or when the call is ready, for a call without any).
    cmd: Option<Cmd>,
}

impl Invocation {
    /// An empty call of `script`.
    pub(super) fn new(script: &'static Script) -> Self {
        Invocation {
            script,
            keys: Cmd::with_capacity(KEYS.0, KEYS.1),
            cmd: None,
        }
    }

    /// Adds a key (`KEYS[i]` in the script; a value that writes several
    /// adds several).
    pub(in crate::backend::redis) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        match self.cmd.take() {
            None => key.write_redis_args(&mut self.keys),
            // A key after an argument: no script's `fill` does this, but
            // if one did, the command is begun again with the key among
            // the keys and the arguments after them, so what the script
            // receives is still right.
            Some(begun) => {
                let before = self.keys.args_iter().len();
                key.write_redis_args(&mut self.keys);
                let mut cmd = begin(self.script, &self.keys);
                for arg in begun.args_iter().skip(3 + before) {
                    if let Arg::Simple(bytes) = arg {
                        cmd.write_arg(bytes);
                    }
                }
                self.cmd = Some(cmd);
            }
        }
        self
    }

    /// Adds an argument (`ARGV[i]` in the script; a value that writes
    /// several adds several), written straight into the command sent.
    pub(in crate::backend::redis) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        let cmd = match &mut self.cmd {
            Some(cmd) => cmd,
            None => self.cmd.insert(begin(self.script, &self.keys)),
        };
        arg.write_redis_args(cmd);
        self
    }

    /// The call, ready to send.
    pub(super) fn ready(self) -> ScriptCmd {
        let cmd = match self.cmd {
            Some(cmd) => cmd,
            None => begin(self.script, &self.keys),
        };
        ScriptCmd {
            script: self.script,
            cmd,
        }
    }
}

/// `EVALSHA <sha> <numkeys> <keys..>`, with room for the arguments.
fn begin(script: &Script, keys: &Cmd) -> Cmd {
    let count = keys.args_iter().len();
    let bytes: usize = keys
        .args_iter()
        .map(|arg| match arg {
            Arg::Simple(bytes) => bytes.len(),
            _ => 0,
        })
        .sum();
    let mut cmd = Cmd::with_capacity(
        3 + count + ARGS_COUNT,
        "EVALSHA".len() + script.get_hash().len() + 4 + bytes + ARGS_BYTES,
    );
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(count);
    for arg in keys.args_iter() {
        if let Arg::Simple(bytes) = arg {
            cmd.write_arg(bytes);
        }
    }
    cmd
}

/// A script call ready to send: the `EVALSHA` command, and the script,
/// loaded into the server if it does not have it (`NOSCRIPT`: restarted,
/// failed over, or its script cache flushed).
pub(in crate::backend::redis) struct ScriptCmd {
    pub script: &'static Script,
    pub cmd: Cmd,
}

impl ScriptCmd {
    /// Runs the call on `conn`; on `NOSCRIPT`, loads the script and runs
    /// it once more (as redis-rs's `ScriptInvocation::invoke_async`).
    pub(in crate::backend::redis) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            other => other,
        }
    }
}
