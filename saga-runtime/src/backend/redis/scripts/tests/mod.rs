//! The scripts on their own: their text (libraries included where used,
//! keys and arguments named at the top), and each loaded into a real
//! redis-server.

mod coordination;
mod invocation;
mod limits;
mod process;
mod queue;
mod server;
mod task;

use std::collections::BTreeSet;
use std::path::PathBuf;

use redis::aio::MultiplexedConnection;
use redis::Value;

use super::{Call, ALL};

const GROUP: &str = "workers";
use crate::backend::redis::keys::{Keys, PROCESS_PARTITIONS};
use crate::backend::redis::unavailable;
use crate::backend::BackendError;
use server::TestServer;

/// A private server, a connection to it, and the key layout of a
/// single-server deployment (prefix `saga`, one partition).
struct Fixture {
    _server: TestServer,
    conn: MultiplexedConnection,
    keys: Keys,
}

impl Fixture {
    async fn new() -> Self {
        let server = TestServer::start();
        let conn = server.conn().await;
        Fixture {
            _server: server,
            conn,
            keys: Keys::new("saga", 1, PROCESS_PARTITIONS, false),
        }
    }

    /// Runs a call as the backend does (without its retry on a lost
    /// consumer group).
    async fn call<C: Call>(&mut self, call: &C) -> Result<C::Reply, BackendError> {
        let reply: Value = call
            .invocation()
            .invoke(&mut self.conn)
            .await
            .map_err(unavailable)?;
        C::decode(reply)
    }

    async fn group(&mut self, queue: &str) {
        let _: () = self
            .cmd(&["XGROUP", "CREATE", queue, GROUP, "0", "MKSTREAM"])
            .await;
    }

    async fn add(&mut self, queue: &str, payload: &str) -> String {
        self.cmd(&["XADD", queue, "*", "payload", payload]).await
    }

    /// Reads every new message of `queue` for `consumer`.
    async fn read(&mut self, queue: &str, consumer: &str) {
        let _: Value = self
            .cmd(&[
                "XREADGROUP",
                "GROUP",
                GROUP,
                consumer,
                "STREAMS",
                queue,
                ">",
            ])
            .await;
    }

    async fn entries(&mut self, stream: &str) -> Vec<(String, Vec<String>)> {
        self.cmd(&["XRANGE", stream, "-", "+"]).await
    }

    /// A plain command, for setting up and looking at the data.
    async fn cmd<T: redis::FromRedisValue>(&mut self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query_async(&mut self.conn)
            .await
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }
}

fn lua_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/backend/redis/lua")
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The identifiers of Lua code, comments left out.
fn words(lua: &str) -> BTreeSet<String> {
    lua.lines()
        .map(|line| line.split("--").next().unwrap_or(""))
        .flat_map(|code| code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

/// What a library defines: its `local function NAME` and `local NAME =`.
fn defined(lua: &str) -> BTreeSet<String> {
    lua.lines()
        .filter_map(|line| line.strip_prefix("local "))
        .map(|rest| rest.strip_prefix("function ").unwrap_or(rest))
        .filter_map(|rest| rest.split(['(', ' ']).next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_lua_file_is_a_script() {
    let listed: BTreeSet<String> = ALL.iter().map(|(f, _, _)| format!("{f}.lua")).collect();
    let files: BTreeSet<String> = std::fs::read_dir(lua_dir())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files, listed);
    assert_eq!(listed.len(), 46);
}

/// Every library under `lua/lib/`: its name, its text, and what it
/// defines.
fn libraries() -> Vec<(String, String, BTreeSet<String>)> {
    let mut libs: Vec<_> = std::fs::read_dir(lua_dir().join("lib"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let text = read(path);
            let defines = defined(&text);
            (name, text, defines)
        })
        .collect();
    libs.sort();
    libs
}

/// The libraries `lua` uses directly (`except` its own).
fn uses(lua: &str, except: &str) -> BTreeSet<String> {
    let words = words(lua);
    libraries()
        .into_iter()
        .filter(|(name, _, defines)| name != except && !words.is_disjoint(defines))
        .map(|(name, _, _)| name)
        .collect()
}

/// A script includes the libraries whose functions and constants it uses,
/// and those they use in turn (a missing one would fail only when Lua
/// reached the call), each after those it uses, and nothing else.
#[test]
fn scripts_include_exactly_the_libraries_they_use() {
    let libs = libraries();
    let text = |name: &str| libs.iter().find(|l| l.0 == name).unwrap().1.clone();
    for (file, included, _) in ALL {
        let mut needed = uses(&read(lua_dir().join(format!("{file}.lua"))), "");
        loop {
            let more: BTreeSet<String> = needed
                .iter()
                .flat_map(|lib| uses(&text(lib), lib))
                .collect();
            if more.is_subset(&needed) {
                break;
            }
            needed.extend(more);
        }
        let listed: BTreeSet<String> = included.iter().map(|l| (*l).to_owned()).collect();
        assert_eq!(listed, needed, "{file}.lua");
        for (i, lib) in included.iter().enumerate() {
            for dep in uses(&text(lib), lib) {
                assert!(
                    included[..i].contains(&dep.as_str()),
                    "{file}.lua: lib/{dep}.lua must come before lib/{lib}.lua"
                );
            }
        }
    }
}

/// Each script opens with its header (what it takes and returns) and
/// binds every key and argument it reads at a fixed place to a named local,
/// documented in the header: `KEYS[n]` and `ARGV[n]` appear nowhere else.
#[test]
fn scripts_name_their_keys_and_arguments() {
    for (file, _, _) in ALL {
        let lua = read(lua_dir().join(format!("{file}.lua")));
        assert!(lua.starts_with("-- "), "{file}.lua: no header");
        assert!(lua.contains("\n-- Returns: "), "{file}.lua: no `Returns:`");
        for (n, line) in lua.lines().enumerate() {
            let code = line.split("--").next().unwrap_or("");
            for table in ["KEYS[", "ARGV["] {
                for (at, _) in code.match_indices(table) {
                    let rest = &code[at + table.len()..];
                    let index = &rest[..rest.find(']').unwrap_or(0)];
                    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
                        continue;
                    }
                    assert!(
                        code.starts_with("local "),
                        "{file}.lua:{}: {table}{index}] outside the bindings at the top",
                        n + 1
                    );
                    assert!(
                        lua.contains(&format!("-- {table}{index}]: ")),
                        "{file}.lua: {table}{index}] is not in the header"
                    );
                }
            }
        }
    }
}

/// Every script compiles: `SCRIPT LOAD` into a real server succeeds (and
/// answers the hash the client calls it by).
#[tokio::test]
async fn every_script_loads_into_redis() {
    let server = TestServer::start();
    let mut conn = server.conn().await;
    for (file, _, script) in ALL {
        let hash = script
            .load_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{file}.lua does not load: {e}"));
        assert_eq!(hash, script.get_hash(), "{file}.lua");
    }
}
