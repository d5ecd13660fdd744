//! Endpoints: streams with consumer groups; an outbox while a group reads
//! one (nothing unsettled is trimmed: a full one refuses writes), a
//! capped log while none does.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryBackend;
use crate::backend::{truncate_payload, BackendError, DeadLetter, EndpointDelivery, Endpoints};
use crate::model::task::Timestamp;

/// Messages an endpoint keeps at most, as Redis's default
/// `endpoint_max_len`: one no group reads drops its oldest past it, one a
/// group reads refuses more (see `ProcessCommit::endpoints`).
pub(super) const ENDPOINT_CAP: usize = 100_000;

/// Dead letters an endpoint keeps at most.
const ENDPOINT_DEAD_CAP: usize = 10_000;

/// An endpoint: its messages (by id) and consumer groups.
#[derive(Default)]
pub(super) struct MemEndpoint {
    pub(super) entries: VecDeque<(u64, String)>,
    pub(super) next: u64,
    pub(super) groups: HashMap<String, MemGroup>,
    pub(super) dead: VecDeque<DeadLetter>,
}

/// A consumer group: the last message it was given, and those given but
/// not settled: `id -> (consumer, deliveries, since)`.
#[derive(Default)]
pub(super) struct MemGroup {
    pub(super) last: u64,
    pub(super) pending: std::collections::BTreeMap<u64, (String, u32, Instant)>,
}

impl MemEndpoint {
    pub(super) fn push(&mut self, envelope: String, cap: Option<usize>) {
        self.next += 1;
        self.entries.push_back((self.next, envelope));
        if self.groups.is_empty() && self.entries.len() > cap.unwrap_or(ENDPOINT_CAP) {
            self.entries.pop_front();
        }
    }

    /// Whether it cannot take `n` more: read by a group, and it would hold
    /// more than its cap.
    pub(super) fn full(&self, cap: Option<usize>, n: usize) -> bool {
        !self.groups.is_empty() && self.entries.len() + n > cap.unwrap_or(ENDPOINT_CAP)
    }

    pub(super) fn get(&self, id: u64) -> Option<&String> {
        let i = self.entries.binary_search_by_key(&id, |(k, _)| *k).ok()?;
        Some(&self.entries[i].1)
    }

    /// A message held too long by someone, else the next new one.
    pub(super) fn take(
        &mut self,
        group: &str,
        consumer: &str,
        claim_idle: Duration,
    ) -> Option<EndpointDelivery> {
        let now = Instant::now();
        let entries = std::mem::take(&mut self.entries);
        let g = self.groups.entry(group.to_owned()).or_default();
        let exists = |id: u64| entries.binary_search_by_key(&id, |(k, _)| *k).ok();
        // Trimmed (capped) messages leave the pending list.
        g.pending.retain(|id, _| exists(*id).is_some());
        let stale = g
            .pending
            .iter_mut()
            .find(|(_, (_, _, since))| *since + claim_idle <= now);
        let taken = match stale {
            Some((id, p)) => {
                *p = (consumer.to_owned(), p.1 + 1, now);
                Some((*id, p.1))
            }
            None => entries
                .iter()
                .find(|(id, _)| *id > g.last)
                .map(|(id, _)| *id)
                .map(|id| {
                    g.last = id;
                    g.pending.insert(id, (consumer.to_owned(), 1, now));
                    (id, 1)
                }),
        };
        self.entries = entries;
        taken.map(|(id, deliveries)| EndpointDelivery {
            id: id.to_string(),
            raw: self.get(id).cloned().unwrap_or_default(),
            deliveries,
        })
    }
}

#[async_trait]
impl Endpoints for MemoryBackend {
    async fn endpoint_receive(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
        claim_idle: Duration,
        block: Duration,
    ) -> Result<Option<EndpointDelivery>, BackendError> {
        Ok(self
            .wait_for(block, |state, _| {
                let e = state.endpoints.entry(endpoint.to_owned()).or_default();
                if let Some(d) = e.take(group, consumer, claim_idle) {
                    return Ok(d);
                }
                // A held message becomes claimable at `since + claim_idle`.
                Err(e.groups[group]
                    .pending
                    .values()
                    .map(|(_, _, since)| *since + claim_idle)
                    .min())
            })
            .await)
    }

    async fn endpoint_touch(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
        id: &str,
    ) -> Result<(), BackendError> {
        let mut state = self.state();
        let pending = state
            .endpoints
            .get_mut(endpoint)
            .and_then(|e| e.groups.get_mut(group))
            .and_then(|g| g.pending.get_mut(&id.parse().unwrap_or(0)));
        if let Some(p) = pending {
            p.0 = consumer.to_owned();
            p.2 = Instant::now();
        }
        Ok(())
    }

    async fn endpoint_settle(
        &self,
        endpoint: &str,
        group: &str,
        delivery: &EndpointDelivery,
        dead: Option<&str>,
    ) -> Result<(), BackendError> {
        let limit = self.shared.payload_limit;
        let mut state = self.state();
        let e = state.endpoints.entry(endpoint.to_owned()).or_default();
        if let Some(g) = e.groups.get_mut(group) {
            g.pending.remove(&delivery.id.parse().unwrap_or(0));
        }
        if let Some(reason) = dead {
            let (payload, truncated) = truncate_payload(&delivery.raw, limit);
            e.dead.push_back(DeadLetter {
                id: delivery.id.clone(),
                payload: payload.to_owned(),
                reason: reason.to_owned(),
                task_id: None,
                at: Timestamp::now(),
                truncated,
            });
            if e.dead.len() > ENDPOINT_DEAD_CAP {
                e.dead.pop_front();
            }
        }
        Ok(())
    }

    async fn endpoint_leave(
        &self,
        _endpoint: &str,
        _group: &str,
        _consumer: &str,
    ) -> Result<(), BackendError> {
        // Consumers are not registered here: what one holds is in the
        // group's pending list, under its name.
        Ok(())
    }

    async fn endpoint_trim(
        &self,
        endpoint: &str,
        _idle_consumers: Duration,
    ) -> Result<usize, BackendError> {
        let mut state = self.state();
        let Some(e) = state.endpoints.get_mut(endpoint) else {
            return Ok(0);
        };
        let Some(floor) = e
            .groups
            .values()
            .map(|g| g.pending.keys().next().copied().unwrap_or(g.last + 1))
            .min()
        else {
            return Ok(0);
        };
        let before = e.entries.len();
        e.entries.retain(|(id, _)| *id >= floor);
        Ok(before - e.entries.len())
    }

    async fn endpoint_dead_letters(&self, endpoint: &str) -> Result<Vec<DeadLetter>, BackendError> {
        Ok(self
            .state()
            .endpoints
            .get(endpoint)
            .map(|e| e.dead.iter().cloned().collect())
            .unwrap_or_default())
    }

    async fn endpoint_messages(&self, endpoint: &str) -> Result<Vec<String>, BackendError> {
        Ok(self
            .state()
            .endpoints
            .get(endpoint)
            .map(|e| e.entries.iter().map(|(_, m)| m.clone()).collect())
            .unwrap_or_default())
    }
}
