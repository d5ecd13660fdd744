//! Endpoints. (Not yet implemented.)

use std::time::Duration;

use async_trait::async_trait;

use super::process::not_yet;
use super::PostgresBackend;
use crate::backend::{BackendError, DeadLetter, EndpointDelivery, Endpoints};

#[async_trait]
impl Endpoints for PostgresBackend {
    async fn endpoint_receive(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Duration,
        _: Duration,
    ) -> Result<Option<EndpointDelivery>, BackendError> {
        Err(not_yet())
    }
    async fn endpoint_touch(&self, _: &str, _: &str, _: &str, _: &str) -> Result<(), BackendError> {
        Err(not_yet())
    }
    async fn endpoint_settle(
        &self,
        _: &str,
        _: &str,
        _: &EndpointDelivery,
        _: Option<&str>,
    ) -> Result<(), BackendError> {
        Err(not_yet())
    }
    async fn endpoint_trim(&self, _: &str, _: Duration) -> Result<usize, BackendError> {
        Err(not_yet())
    }
    async fn endpoint_leave(&self, _: &str, _: &str, _: &str) -> Result<(), BackendError> {
        Err(not_yet())
    }
    async fn endpoint_dead_letters(&self, _: &str) -> Result<Vec<DeadLetter>, BackendError> {
        Err(not_yet())
    }
    async fn endpoint_messages(&self, _: &str) -> Result<Vec<String>, BackendError> {
        Err(not_yet())
    }
}
