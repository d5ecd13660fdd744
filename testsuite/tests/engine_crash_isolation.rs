//! A message that aborts its worker process costs the messages beside it
//! nothing, on every store with a server
//! (`tests/scenarios/crash_isolation.rs`).

mod common;
#[macro_use]
mod scenarios;

use common::postgres_server::TestPostgres;
use common::redis_server::TestRedis;

engine_scenarios!(crash_isolation; redis: TestRedis, postgres: TestPostgres);
