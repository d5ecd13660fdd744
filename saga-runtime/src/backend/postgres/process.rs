//! Process-manager instances, correlation entries, tombstones, the outbox
//! and timeouts. (Not yet implemented.)

use async_trait::async_trait;

use super::PostgresBackend;
use crate::backend::{
    BackendError, Page, ProcessCommit, ProcessInstance, ProcessStore, ProcessWrite,
};
use crate::model::envelope::Envelope;

pub(super) fn not_yet() -> BackendError {
    BackendError::Misconfigured("the PostgreSQL backend does not store process managers yet".into())
}

#[async_trait]
impl ProcessStore for PostgresBackend {
    async fn process_load(
        &self,
        _: &str,
        _: &str,
    ) -> Result<Option<ProcessInstance>, BackendError> {
        Err(not_yet())
    }
    async fn process_find(
        &self,
        _: &str,
        _: &str,
        _: &str,
    ) -> Result<Option<ProcessInstance>, BackendError> {
        Err(not_yet())
    }
    async fn process_find_shared(
        &self,
        _: &str,
        _: &str,
        _: &str,
    ) -> Result<Vec<String>, BackendError> {
        Err(not_yet())
    }
    async fn process_list(&self, _: &str) -> Result<Vec<ProcessInstance>, BackendError> {
        Err(not_yet())
    }
    async fn process_page(
        &self,
        _: &str,
        _: Option<&str>,
        _: usize,
    ) -> Result<Page<ProcessInstance>, BackendError> {
        Err(not_yet())
    }
    async fn process_commit(
        &self,
        _: &str,
        _: ProcessCommit<'_>,
    ) -> Result<ProcessWrite, BackendError> {
        Err(not_yet())
    }
    async fn process_release_due(&self, _: u64, _: usize) -> Result<usize, BackendError> {
        Ok(0)
    }
    async fn process_scheduled(&self) -> Result<Vec<(u64, Envelope)>, BackendError> {
        Err(not_yet())
    }
}
