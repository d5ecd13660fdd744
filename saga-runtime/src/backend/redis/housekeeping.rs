//! Named leases and retention: expired tasks, trimmed dead letters, and
//! consumers that left.

use async_trait::async_trait;

use super::{ms, scripts as s, RedisBackend};
use crate::backend::{BackendError, Housekeeping, Housekept, Retention};
use crate::model::task::{TaskId, TaskStatus};

/// Tasks purged per script call.
const PURGE_BATCH: usize = 100;

/// Reads an expiring member `<id>|<status>|<saga>`.
fn parse_member(member: &str) -> Option<(TaskId, TaskStatus, &str)> {
    let mut parts = member.splitn(3, '|');
    let id = parts.next()?.parse().ok()?;
    let name = parts.next()?;
    let status = TaskStatus::ALL.into_iter().find(|s| s.as_str() == name)?;
    Some((id, status, parts.next()?))
}

impl RedisBackend {
    /// Removes the expired tasks of one partition; returns how many.
    async fn purge(&self, partition: u16, limit: usize) -> Result<usize, BackendError> {
        let k = self.keys();
        let members = self
            .call(&s::Expired {
                expiring: k.expiring(partition),
                limit: limit.min(PURGE_BATCH * 10),
            })
            .await?;
        let mut purged = 0;
        for chunk in members.chunks(PURGE_BATCH) {
            let mut purge = s::Purge {
                expiring: k.expiring(partition),
                tasks: Vec::new(),
            };
            for member in chunk {
                let Some((id, status, saga)) = parse_member(member) else {
                    // Not ours to read: drop it so it does not come back.
                    let _: i64 = redis::cmd("ZREM")
                        .arg(k.expiring(partition))
                        .arg(member)
                        .query_async(&mut self.conn())
                        .await
                        .map_err(super::unavailable)?;
                    continue;
                };
                purge.tasks.push(s::PurgedTask {
                    task: k.task(id),
                    fence: k.fence(id),
                    cancel: k.cancel(id),
                    claims: k.claims(id),
                    lock: k.lock(id),
                    index_all: k.index(partition, saga, None),
                    index_status: k.index(partition, saga, Some(status)),
                    audit: k.audit(id),
                    member: member.clone(),
                    id: id.to_string(),
                    status,
                });
            }
            if !purge.tasks.is_empty() {
                purged += self.call(&purge).await?;
            }
        }
        Ok(purged)
    }
}

impl RedisBackend {
    /// Trims a dead-letter stream to `max` entries, oldest first, but keeps
    /// the letter of a task still parked `DeadLettered`: it is what an
    /// operator requeues the task by, and a flood of garbage must not take
    /// it away. Those go with their task's retention.
    async fn cap_dead_letters(&self, stream: u16, max: usize) -> Result<usize, BackendError> {
        let dead = self.keys().dead(stream);
        let mut conn = self.conn();
        let len: usize = redis::cmd("XLEN")
            .arg(&dead)
            .query_async(&mut conn)
            .await
            .map_err(super::unavailable)?;
        let mut excess = len.saturating_sub(max);
        let mut removed = 0;
        let mut start = "-".to_owned();
        while excess > 0 {
            let reply: redis::Value = redis::cmd("XRANGE")
                .arg(&dead)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(500)
                .query_async(&mut conn)
                .await
                .map_err(super::unavailable)?;
            let entries = super::entry::entries(&reply);
            let Some((last, _)) = entries.last() else {
                break;
            };
            start = format!("({last}");
            let tasks: Vec<Option<TaskId>> = entries
                .iter()
                .map(|(_, fields)| {
                    super::entry::fields(fields)
                        .iter()
                        .find(|(k, _)| *k == b"task")
                        .and_then(|(_, v)| super::entry::text(v).parse().ok())
                })
                .collect();
            let cmds = tasks
                .iter()
                .map(|task| match task {
                    Some(id) => redis::cmd("HGET")
                        .arg(self.keys().task(*id))
                        .arg("status")
                        .clone(),
                    None => redis::cmd("ECHO").arg("").clone(),
                })
                .collect();
            let statuses: Vec<Option<String>> = self
                .query_each(cmds)
                .await?
                .iter()
                .map(|v| redis::from_redis_value_ref(v).map_err(super::corrupt))
                .collect::<Result<_, _>>()?;
            let mut doomed = Vec::new();
            for (((id, _), task), status) in entries.iter().zip(&tasks).zip(statuses) {
                let parked =
                    task.is_some() && status.as_deref() == Some(TaskStatus::DeadLettered.as_str());
                if !parked && doomed.len() < excess {
                    doomed.push(id.clone());
                }
            }
            if !doomed.is_empty() {
                let n: usize = redis::cmd("XDEL")
                    .arg(&dead)
                    .arg(&doomed)
                    .query_async(&mut conn)
                    .await
                    .map_err(super::unavailable)?;
                removed += n;
                excess = excess.saturating_sub(doomed.len());
            }
        }
        Ok(removed)
    }
}

/// How old a message left for relaying must be before housekeeping relays
/// it: the commit that left it relays it itself a moment later, unless its
/// process died.
const RELAY_GRACE_MS: u64 = 10_000;

impl RedisBackend {
    /// Relays the messages partition `part`'s commits left for endpoints
    /// and did not relay themselves (their process died in between);
    /// returns how many.
    async fn relay_left(&self, part: u16) -> Result<usize, BackendError> {
        let relays = self.keys().relays(part);
        let mut conn = self.conn();
        let (secs, _): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(super::unavailable)?;
        let before = (secs * 1000).saturating_sub(RELAY_GRACE_MS);
        let mut relayed = 0;
        loop {
            let reply: redis::Value = redis::cmd("XRANGE")
                .arg(&relays)
                .arg("-")
                .arg(before)
                .arg("COUNT")
                .arg(200)
                .query_async(&mut conn)
                .await
                .map_err(super::unavailable)?;
            let entries = super::entry::entries(&reply);
            if entries.is_empty() {
                return Ok(relayed);
            }
            for (id, fields) in &entries {
                let fields = super::entry::fields(fields);
                let field = |name: &[u8]| {
                    fields
                        .iter()
                        .find(|(k, _)| *k == name)
                        .map(|(_, v)| super::entry::text(v))
                };
                match (field(b"relay"), field(b"envelope")) {
                    (Some(endpoint), Some(envelope)) => {
                        if !self.relay_now(&relays, &endpoint, &envelope, id).await {
                            // The endpoint's shard is out of reach: the
                            // next pass tries again.
                            return Ok(relayed);
                        }
                        relayed += 1;
                    }
                    _ => {
                        tracing::warn!(entry = %id, "unreadable relay entry dropped");
                        let _: i64 = redis::cmd("XDEL")
                            .arg(&relays)
                            .arg(id)
                            .query_async(&mut conn)
                            .await
                            .map_err(super::unavailable)?;
                    }
                }
            }
            if entries.len() < 200 {
                if relayed > 0 {
                    tracing::warn!(
                        relayed,
                        "relayed endpoint messages whose process stopped before relaying them"
                    );
                }
                return Ok(relayed);
            }
        }
    }
}

#[async_trait]
impl Housekeeping for RedisBackend {
    async fn housekeep(&self, retention: &Retention) -> Result<Housekept, BackendError> {
        self.shared.dead_letters_max.store(
            retention.dead_letters_max,
            std::sync::atomic::Ordering::Relaxed,
        );
        let k = self.keys();
        let mut done = Housekept::default();
        for p in 0..k.partitions() {
            done.tasks += self
                .purge(p, retention.batch.saturating_sub(done.tasks))
                .await?;
        }
        for stream in 0..k.streams() {
            let trimmed = self
                .call(&s::TrimDead {
                    dead: k.dead(stream),
                    keep_ms: retention.dead_letters.map(ms),
                })
                .await?;
            done.dead_letters += trimmed;
            done.dead_letters += self
                .cap_dead_letters(stream, retention.dead_letters_max)
                .await?;
            let reaped = self
                .call(&s::ReapConsumers {
                    stream: k.queue(stream),
                    group: self.group(),
                    idle_ms: ms(retention.idle_consumers),
                })
                .await?;
            done.consumers += reaped;
        }
        done.tallies = self.finish_open_tallies().await?;
        if k.spread() {
            for part in k.pm_parts() {
                done.relayed += self.relay_left(part).await?;
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::super::keys::Keys;
    use super::*;

    #[test]
    fn expiring_members_round_trip_even_with_bars_in_the_saga_name() {
        let id = TaskId::new();
        let member = Keys::expiring_member(id, TaskStatus::CompensationFailed, "a|b");
        assert_eq!(
            parse_member(&member),
            Some((id, TaskStatus::CompensationFailed, "a|b"))
        );
        assert_eq!(parse_member("nonsense"), None);
    }
}
