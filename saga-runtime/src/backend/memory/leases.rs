//! Named leases.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryBackend;
use crate::backend::{BackendError, Leases};

#[async_trait]
impl Leases for MemoryBackend {
    async fn named_lease(
        &self,
        name: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let mut state = self.state();
        let now = Instant::now();
        match state.leases.get(name) {
            Some((holder, expires)) if *expires > now && holder != token => Ok(false),
            _ => {
                state
                    .leases
                    .insert(name.to_owned(), (token.to_owned(), now + ttl));
                Ok(true)
            }
        }
    }

    async fn release_named_lease(&self, name: &str, token: &str) -> Result<bool, BackendError> {
        let mut state = self.state();
        if matches!(state.leases.get(name), Some((holder, _)) if holder == token) {
            state.leases.remove(name);
            return Ok(true);
        }
        Ok(false)
    }
}
