//! Flow-control limits shared by the deployment (`#[limit]`): one script
//! call (one round trip) per method, on the keys of one `(limit, key)`
//! under one hash tag (`keys.limit`), on the server's clock. The scripts
//! mirror the limit machine (`limit/machine.rs`) step by step; the
//! conformance case `limits_decide_as_the_machine_does` holds them to it.

use std::time::Duration;

use async_trait::async_trait;

use super::{scripts as s, RedisBackend};
use crate::backend::{Acquired, BackendError, LimitRequest, LimitUsage, Limits, Released};
use crate::limit::LimitConfig;

impl RedisBackend {
    fn limit_keys(&self, limit: &str, key: Option<&str>) -> s::LimitKeys {
        s::LimitKeys::new(self.keys(), limit, key)
    }
}

#[async_trait]
impl Limits for RedisBackend {
    async fn limit_acquire(&self, request: &LimitRequest<'_>) -> Result<Acquired, BackendError> {
        self.call(&s::LimitAcquire {
            keys: self.limit_keys(request.limit, request.key),
            config: request.config,
            holder: request.holder,
            waiter: request.waiter,
            hold_for: request.hold_for,
            wake: request.wake,
        })
        .await
    }

    async fn limit_release(
        &self,
        limit: &str,
        key: Option<&str>,
        holder: &str,
        config: LimitConfig,
    ) -> Result<Released, BackendError> {
        self.call(&s::LimitRelease {
            keys: self.limit_keys(limit, key),
            holder,
            concurrency: config.concurrency,
        })
        .await
    }

    async fn limit_leave(
        &self,
        limit: &str,
        key: Option<&str>,
        waiter: &str,
        config: LimitConfig,
    ) -> Result<Released, BackendError> {
        self.call(&s::LimitLeave {
            keys: self.limit_keys(limit, key),
            waiter,
            concurrency: config.concurrency,
        })
        .await
    }

    async fn limit_renew(
        &self,
        limit: &str,
        key: Option<&str>,
        holder: &str,
        hold_for: Duration,
    ) -> Result<bool, BackendError> {
        self.call(&s::LimitRenew {
            keys: self.limit_keys(limit, key),
            holder,
            hold_for,
        })
        .await
    }

    async fn limit_usage(
        &self,
        limit: &str,
        key: Option<&str>,
        _config: LimitConfig,
    ) -> Result<LimitUsage, BackendError> {
        self.call(&s::LimitUse {
            keys: self.limit_keys(limit, key),
        })
        .await
    }
}
