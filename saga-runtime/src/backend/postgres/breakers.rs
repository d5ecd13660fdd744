//! Shared circuit breakers. (Not yet implemented.)

use std::time::Duration;

use async_trait::async_trait;

use super::process::not_yet;
use super::PostgresBackend;
use crate::backend::{BackendError, BreakerChange, BreakerDecision, Breakers};

#[async_trait]
impl Breakers for PostgresBackend {
    async fn breaker_acquire(
        &self,
        _: &str,
        _: Duration,
        _: &str,
    ) -> Result<BreakerDecision, BackendError> {
        Err(not_yet())
    }
    async fn breaker_report(
        &self,
        _: &str,
        _: Option<&str>,
        _: Option<bool>,
        _: u32,
        _: Duration,
    ) -> Result<Option<BreakerChange>, BackendError> {
        Err(not_yet())
    }
}
