//! Endpoints: streams written by process-manager commits, read by
//! consumer groups of other services.

use std::time::Duration;

use super::{BackendError, DeadLetter};
use async_trait::async_trait;

/// One message of an endpoint, delivered to a consumer of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointDelivery {
    /// Its id in the endpoint.
    pub id: String,
    /// The envelope as stored.
    pub raw: String,
    /// Deliveries to the group so far, this one included.
    pub deliveries: u32,
}

/// Endpoints ([`crate::endpoint`]): streams written by process-manager
/// commits, read by consumer groups.
#[async_trait]
pub trait Endpoints: Send + Sync + 'static {
    /// The next message of `endpoint` for `consumer` of `group` (a group
    /// that does not exist yet is created, reading from the oldest message
    /// kept): one that another consumer has held unsettled for longer than
    /// `claim_idle` first (its delivery count goes up), else a new one,
    /// waiting up to `block` for one.
    async fn endpoint_receive(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
        claim_idle: Duration,
        block: Duration,
    ) -> Result<Option<EndpointDelivery>, BackendError>;

    /// Keeps message `id` with `consumer`: restarts its idle time (not its
    /// delivery count), so that a long handler keeps its message.
    async fn endpoint_touch(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
        id: &str,
    ) -> Result<(), BackendError>;

    /// Acknowledges a delivery; with `dead: Some(reason)`, parks it on the
    /// endpoint's dead letters in the same step.
    async fn endpoint_settle(
        &self,
        endpoint: &str,
        group: &str,
        delivery: &EndpointDelivery,
        dead: Option<&str>,
    ) -> Result<(), BackendError>;

    /// Removes the messages every group has settled, and the consumers
    /// that hold none and have been idle for `idle_consumers` (their
    /// processes died); returns how many messages went. Nothing goes while
    /// the endpoint has no group.
    async fn endpoint_trim(
        &self,
        endpoint: &str,
        idle_consumers: Duration,
    ) -> Result<usize, BackendError>;

    /// `consumer` leaves `group`, if it holds no message (one it holds
    /// stays, for another consumer to take over).
    async fn endpoint_leave(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
    ) -> Result<(), BackendError>;

    /// The endpoint's dead letters, oldest first (capped).
    async fn endpoint_dead_letters(&self, endpoint: &str) -> Result<Vec<DeadLetter>, BackendError>;

    /// The messages sent to an endpoint, oldest first (for consumers that
    /// read it, and tests).
    async fn endpoint_messages(&self, endpoint: &str) -> Result<Vec<String>, BackendError>;
}
