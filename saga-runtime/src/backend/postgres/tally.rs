//! Tallies. (Not yet implemented.)

use async_trait::async_trait;

use super::process::not_yet;
use super::PostgresBackend;
use crate::backend::{BackendError, Tallies};
use crate::model::tally::{TallyCheck, TallyProgress, TallyRef};

#[async_trait]
impl Tallies for PostgresBackend {
    async fn tally_check(&self, _: &TallyRef, _: &str) -> Result<TallyCheck, BackendError> {
        Err(not_yet())
    }
    async fn tally_progress(
        &self,
        _: &TallyRef,
        _: usize,
        _: bool,
    ) -> Result<Option<TallyProgress>, BackendError> {
        Err(not_yet())
    }
}
