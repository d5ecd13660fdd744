//! The engine scenarios (`tests/scenarios/`), generated for every store
//! with a server: the same faults, the same assertions, on Redis and on
//! PostgreSQL. Each scenario starts private servers of its own (a store,
//! and a Redis recording what the steps did), so that it can kill, cut
//! and restart them. Chaos is in `tests/engine_chaos.rs`.
//!
//! `cargo test -p sagas-tests --test engine_scenarios postgres` runs one
//! store's; `process::` one suite's.

mod common;
#[macro_use]
mod scenarios;

use common::postgres_server::TestPostgres;
use common::redis_server::TestRedis;

engine_scenarios!(faults; redis: TestRedis, postgres: TestPostgres);
engine_scenarios!(crash_isolation; redis: TestRedis, postgres: TestPostgres);
engine_scenarios!(process; redis: TestRedis, postgres: TestPostgres);
engine_scenarios!(breakers; redis: TestRedis, postgres: TestPostgres);
engine_scenarios!(runners; redis: TestRedis, postgres: TestPostgres);
engine_scenarios!(limits; redis: TestRedis, postgres: TestPostgres);
engine_scenarios!(leases; redis: TestRedis, postgres: TestPostgres);
engine_scenarios!(outcomes; redis: TestRedis, postgres: TestPostgres);
engine_scenarios!(tally; redis: TestRedis, postgres: TestPostgres);
engine_scenarios!(endpoints; redis: TestRedis, postgres: TestPostgres);
