//! Named leases: a row per lease, taken over in place once expired,
//! renewed and released only by its holder (`named_lease`,
//! `release_named_lease` in `migrations/0003_coordination.sql`), with the
//! server's clock deciding expiry.

use std::time::Duration;

use async_trait::async_trait;

use super::tasks::ms;
use super::{failure, PostgresBackend};
use crate::backend::{BackendError, Leases};

#[async_trait]
impl Leases for PostgresBackend {
    async fn named_lease(
        &self,
        name: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        run!(
            self,
            sqlx::query_scalar(sql!("SELECT {}($1, $2, $3)", self.q("named_lease")))
                .bind(name)
                .bind(token)
                .bind(ms(ttl)),
            fetch_one
        )
        .map_err(failure)
    }

    async fn release_named_lease(&self, name: &str, token: &str) -> Result<bool, BackendError> {
        run!(
            self,
            sqlx::query_scalar(sql!("SELECT {}($1, $2)", self.q("release_named_lease")))
                .bind(name)
                .bind(token),
            fetch_one
        )
        .map_err(failure)
    }
}
