//! The saga the benchmarks and the structural counts run: three steps that
//! do nothing, so that what is measured is the engine and its store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use saga_runtime::prelude::*;

/// Three no-op steps; the last counts the tasks that got there. One
/// definition for every benchmark (`bench_redis`, `bench_postgres`,
/// `bench_cluster`, `retention`) and for the tests that count round trips
/// and transactions per step, so the figures they report are of the same
/// saga.
pub struct NoOp {
    /// How many tasks ran their last step.
    pub done: Arc<AtomicU64>,
}

#[saga(name = "noop")]
impl NoOp {
    #[saga_step(1)]
    async fn one(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(2)]
    async fn two(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(3)]
    async fn three(&self, n: u64) -> Result<u64, StepError> {
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(n)
    }
}
