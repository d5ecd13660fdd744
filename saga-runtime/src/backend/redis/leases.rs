//! Named leases: `SET NX PX` with a token, renewed and released only by
//! their holder (one script each).

use std::time::Duration;

use async_trait::async_trait;

use super::{ms, scripts as s, RedisBackend};
use crate::backend::{BackendError, Leases};

#[async_trait]
impl Leases for RedisBackend {
    async fn named_lease(
        &self,
        name: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.call(&s::NamedLease {
            lease: self.keys().lease(name),
            token,
            ttl_ms: ms(ttl),
        })
        .await
    }

    async fn release_named_lease(&self, name: &str, token: &str) -> Result<bool, BackendError> {
        self.call(&s::Unlock {
            lock: self.keys().lease(name),
            token,
        })
        .await
    }
}
