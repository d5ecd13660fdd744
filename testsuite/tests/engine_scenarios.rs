//! The engine's fault scenarios (`tests/scenarios/faults.rs`), generated
//! for every store with a server: the same faults, the same assertions,
//! on Redis and on PostgreSQL. Each scenario starts private servers of its
//! own (a store, and a Redis recording what the steps did), so that it can
//! kill, cut and restart them.

mod common;
#[macro_use]
mod scenarios;

use common::postgres_server::TestPostgres;
use common::redis_server::TestRedis;

engine_scenarios!(faults; redis: TestRedis, postgres: TestPostgres);
