//! Named leases. (Not yet implemented.)

use std::time::Duration;

use async_trait::async_trait;

use super::process::not_yet;
use super::PostgresBackend;
use crate::backend::{BackendError, Leases};

#[async_trait]
impl Leases for PostgresBackend {
    async fn named_lease(&self, _: &str, _: &str, _: Duration) -> Result<bool, BackendError> {
        Err(not_yet())
    }
    async fn release_named_lease(&self, _: &str, _: &str) -> Result<bool, BackendError> {
        Err(not_yet())
    }
}
