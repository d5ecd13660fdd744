//! Endpoints on Streams consumer groups: one script takes a message (one
//! whose consumer stopped touching it first, else a new one) without
//! blocking; only when there is none does the consumer block on its own
//! connection. Trimming follows the slowest group.

use std::time::Duration;

use async_trait::async_trait;
use redis::Value;

use super::entry::{self, entries};
use super::{corrupt, ms, scripts as s, unavailable, RedisBackend};
use crate::backend::{truncate_payload, BackendError, DeadLetter, EndpointDelivery, Endpoints};
use crate::model::task::Timestamp;
use crate::util::Unpoisoned;

/// The envelope of an entry: the `envelope` field (the `payload` field of
/// entries written before it had that name).
pub(super) fn envelope(fields: &Value) -> String {
    let fields = entry::fields(fields);
    let find = |name: &[u8]| {
        fields
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| entry::text(v))
    };
    find(b"envelope")
        .or_else(|| find(b"payload"))
        .unwrap_or_default()
}

/// The id after `id` (`ms-seq` + 1): `XTRIM MINID` of it removes `id`.
fn after(id: &str) -> Option<String> {
    let (ms, seq) = id.split_once('-')?;
    Some(format!("{ms}-{}", seq.parse::<u64>().ok()?.checked_add(1)?))
}

fn order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

impl RedisBackend {
    fn reader_name(endpoint: &str, group: &str, consumer: &str) -> String {
        format!("endpoint|{endpoint}|{group}|{consumer}")
    }
}

#[async_trait]
impl Endpoints for RedisBackend {
    async fn endpoint_receive(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
        claim_idle: Duration,
        block: Duration,
    ) -> Result<Option<EndpointDelivery>, BackendError> {
        let key = self.keys().endpoint(endpoint);
        let taken = self
            .call(&s::EndpointTake {
                stream: key.clone(),
                group,
                consumer,
                claim_idle_ms: ms(claim_idle),
            })
            .await?;
        if let Some(taken) = taken {
            return Ok(Some(EndpointDelivery {
                id: taken.id,
                raw: envelope(&taken.fields),
                deliveries: taken.deliveries,
            }));
        }
        // Nothing waiting: block for a new one on this consumer's own
        // connection (a blocked command holds up its connection).
        let block = block.min(self.shared.config.block);
        let mut conn = self
            .reader_conn(&Self::reader_name(endpoint, group, consumer))
            .await?;
        let reader = Self::reader_name(endpoint, group, consumer);
        let read: Value = match redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(group)
            .arg(consumer)
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(ms(block).max(1))
            .arg("STREAMS")
            .arg(&key)
            .arg(">")
            .query_async(&mut conn)
            .await
        {
            Ok(read) => read,
            Err(e) => {
                // The next read connects afresh (a restarted server left
                // this connection dead).
                self.reader(&reader, |r| r.conn = None);
                self.shared.server.failed(&e);
                return Err(unavailable(e));
            }
        };
        let stream = entry::items(&read).into_iter().next();
        let first = stream
            .and_then(|s| entry::items(s).get(1).copied())
            .map(entries)
            .and_then(|e| e.into_iter().next());
        Ok(first.map(|(id, fields)| EndpointDelivery {
            id,
            raw: envelope(fields),
            deliveries: 1,
        }))
    }

    async fn endpoint_touch(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
        id: &str,
    ) -> Result<(), BackendError> {
        let _: Value = redis::cmd("XCLAIM")
            .arg(self.keys().endpoint(endpoint))
            .arg(group)
            .arg(consumer)
            .arg(0)
            .arg(id)
            .arg("JUSTID")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn endpoint_settle(
        &self,
        endpoint: &str,
        group: &str,
        delivery: &EndpointDelivery,
        dead: Option<&str>,
    ) -> Result<(), BackendError> {
        let k = self.keys();
        let limit = self.shared.config.dead_letter_payload_limit;
        let (payload, size) = truncate_payload(&delivery.raw, limit);
        self.call(&s::EndpointSettle {
            stream: k.endpoint(endpoint),
            dead: k.endpoint_dead(endpoint),
            group,
            entry: &delivery.id,
            park: dead.is_some(),
            payload,
            reason: dead.unwrap_or_default(),
            size,
            dead_cap: self.dead_letters_ceiling(),
        })
        .await?;
        Ok(())
    }

    async fn endpoint_leave(
        &self,
        endpoint: &str,
        group: &str,
        consumer: &str,
    ) -> Result<(), BackendError> {
        self.call(&s::LeaveGroup {
            stream: self.keys().endpoint(endpoint),
            group,
            consumer,
        })
        .await?;
        self.shared
            .readers
            .locked()
            .remove(&Self::reader_name(endpoint, group, consumer));
        Ok(())
    }

    async fn endpoint_trim(
        &self,
        endpoint: &str,
        idle_consumers: Duration,
    ) -> Result<usize, BackendError> {
        let key = self.keys().endpoint(endpoint);
        let mut conn = self.conn();
        let groups: Value = match redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&key)
            .query_async(&mut conn)
            .await
        {
            Ok(groups) => groups,
            // No stream yet.
            Err(e) if e.code() == Some("ERR") => return Ok(0),
            Err(e) => return Err(unavailable(e)),
        };
        // For each group, the oldest message it still needs: its oldest
        // unsettled one, else the one after the last it was given.
        let mut floor: Option<String> = None;
        for group in entry::items(&groups) {
            let info = entry::fields(group);
            let field = |name: &[u8]| {
                info.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| entry::text(v))
            };
            let (Some(name), Some(last)) = (field(b"name"), field(b"last-delivered-id")) else {
                return Err(corrupt("XINFO GROUPS answered a group without a name"));
            };
            self.call(&s::ReapConsumers {
                stream: key.clone(),
                group: &name,
                idle_ms: ms(idle_consumers),
            })
            .await?;
            let pending: u64 = field(b"pending").and_then(|p| p.parse().ok()).unwrap_or(0);
            let needs = if pending > 0 {
                let oldest: Value = redis::cmd("XPENDING")
                    .arg(&key)
                    .arg(&name)
                    .arg("-")
                    .arg("+")
                    .arg(1)
                    .query_async(&mut conn)
                    .await
                    .map_err(unavailable)?;
                entry::items(&oldest)
                    .first()
                    .and_then(|p| entry::items(p).first().map(|id| entry::text(id)))
            } else {
                after(&last)
            };
            let Some(needs) = needs else { return Ok(0) };
            if floor.as_deref().is_none_or(|f| order(&needs) < order(f)) {
                floor = Some(needs);
            }
        }
        let Some(floor) = floor else { return Ok(0) };
        redis::cmd("XTRIM")
            .arg(&key)
            .arg("MINID")
            .arg(floor)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)
    }

    async fn endpoint_dead_letters(&self, endpoint: &str) -> Result<Vec<DeadLetter>, BackendError> {
        let reply: Value = redis::cmd("XRANGE")
            .arg(self.keys().endpoint_dead(endpoint))
            .arg("-")
            .arg("+")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(entries(&reply)
            .into_iter()
            .map(|(id, fields)| {
                let fields = entry::fields(fields);
                let field = |name: &[u8]| {
                    fields
                        .iter()
                        .find(|(k, _)| *k == name)
                        .map(|(_, v)| entry::text(v))
                        .unwrap_or_default()
                };
                DeadLetter {
                    id,
                    payload: field(b"payload"),
                    reason: field(b"reason"),
                    task_id: None,
                    at: Timestamp(field(b"at").parse().unwrap_or(0)),
                    truncated: field(b"size").parse().ok(),
                }
            })
            .collect())
    }

    async fn endpoint_messages(&self, endpoint: &str) -> Result<Vec<String>, BackendError> {
        let reply: Value = redis::cmd("XRANGE")
            .arg(self.keys().endpoint(endpoint))
            .arg("-")
            .arg("+")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(super::entry::entries(&reply)
            .into_iter()
            .map(|(_, fields)| super::endpoint::envelope(fields))
            .collect())
    }
}
