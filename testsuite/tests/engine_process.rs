//! Process managers on every store with a server
//! (`tests/scenarios/process.rs`): the same scenarios, the same
//! assertions, on Redis and on PostgreSQL.

mod common;
#[macro_use]
mod scenarios;

use common::postgres_server::TestPostgres;
use common::redis_server::TestRedis;

engine_scenarios!(process; redis: TestRedis, postgres: TestPostgres);
