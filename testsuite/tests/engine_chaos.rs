//! Invariants 1-3, 6 and 10 under fire, on every store with a server
//! (`tests/scenarios/chaos.rs`). One store at a time: each run loads both
//! cores with three worker processes.
//!
//! Each run prints its seed; `CHAOS_SEED=<seed> cargo test -p sagas-tests
//! --test engine_chaos postgres -- --nocapture` replays the same schedule
//! of faults on PostgreSQL (`redis` on Redis).

mod common;
#[macro_use]
mod scenarios;

use common::postgres_server::TestPostgres;
use common::redis_server::TestRedis;

engine_scenarios!(chaos; redis: TestRedis, postgres: TestPostgres);
