//! Task records, leases, attempt claims, commits and cancellation flags.

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use redis::Value;
use uuid::Uuid;

use super::keys::Keys;
use super::{corrupt, ms, scripts as s, unavailable, RedisBackend};
use crate::backend::{
    truncate_payload, BackendError, Created, Delivery, Heartbeat, Lease, Locked, NextAttempt,
    QueueMessage, Settle, TaskCommit, TaskCursor, TaskQuery, TaskStore, WorkItem,
};
use crate::model::task::{StepRecord, TaskId, TaskInstance, TaskStatus, Timestamp, AUDIT_LOG_CAP};

/// A stored cancellation flag (`<ms>|<token>`; plain `<ms>` is accepted).
pub(super) fn cancel_time(stored: Option<String>) -> Option<Timestamp> {
    let stored = stored?;
    let ms = stored.split('|').next()?;
    ms.parse().ok().map(Timestamp)
}

/// A task from its record alone, without the audit log: what a worker
/// needs (it only appends to the log). A record written before the log had
/// its own list carries its entries inline; they count as not stored yet,
/// so the next write moves them to the list.
pub(super) fn parse_doc(
    doc: Option<String>,
    version: Option<String>,
) -> Result<Option<TaskInstance>, BackendError> {
    let Some(doc) = doc else { return Ok(None) };
    let mut task: TaskInstance = serde_json::from_str(&doc).map_err(corrupt)?;
    task.version = version.and_then(|v| v.parse().ok()).unwrap_or(task.version);
    Ok(Some(task))
}

/// A whole task: its record and its audit log.
fn parse_full(
    doc: Option<String>,
    version: Option<String>,
    audit: Vec<String>,
) -> Result<Option<TaskInstance>, BackendError> {
    let Some(mut task) = parse_doc(doc, version)? else {
        return Ok(None);
    };
    let inline = !task.audit_log.is_empty();
    for entry in &audit {
        task.audit_log
            .push(serde_json::from_str(entry).map_err(corrupt)?);
    }
    if !inline {
        task.audit_saved();
    }
    Ok(Some(task))
}

/// The task's record as stored: everything but the audit log, which lives
/// in its own list so that a write carries only the entries it adds.
/// Borrowed, field for field, from [`TaskInstance`] (a test checks that the
/// two read the same).
#[derive(serde::Serialize)]
struct Record<'a> {
    id: &'a TaskId,
    saga: &'a str,
    saga_version: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    fingerprint: &'a Option<String>,
    status: TaskStatus,
    input: &'a serde_json::Value,
    output: &'a Option<serde_json::Value>,
    steps: &'a [StepRecord],
    audit_log: [(); 0],
    trace_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: &'a Option<String>,
    created_at: Timestamp,
    updated_at: Timestamp,
    finished_at: Option<Timestamp>,
    cancelled_at: Option<Timestamp>,
    error: &'a Option<String>,
    version: u64,
    seq: u64,
}

fn doc(task: &TaskInstance) -> Result<String, BackendError> {
    doc_updated(task, task.updated_at)
}

/// The record of a write: stamped with when it was written (the store's
/// `updated_at`, as the in-memory backend keeps it).
fn written(task: &TaskInstance) -> Result<String, BackendError> {
    doc_updated(task, Timestamp::now())
}

fn doc_updated(task: &TaskInstance, updated: Timestamp) -> Result<String, BackendError> {
    let TaskInstance {
        id,
        saga,
        saga_version,
        fingerprint,
        status,
        input,
        output,
        steps,
        audit_log: _,
        trace_id,
        traceparent,
        created_at,
        updated_at: _,
        finished_at,
        cancelled_at,
        error,
        version,
        seq,
        audit_stored: _,
    } = task;
    serde_json::to_string(&Record {
        id,
        saga,
        saga_version: *saga_version,
        fingerprint,
        status: *status,
        input,
        output,
        steps,
        audit_log: [],
        trace_id,
        traceparent,
        created_at: *created_at,
        updated_at: updated,
        finished_at: *finished_at,
        cancelled_at: *cancelled_at,
        error,
        version: *version,
        seq: *seq,
    })
    .map_err(corrupt)
}

/// The audit entries a write appends: those the store does not hold yet,
/// at most the last `AUDIT_LOG_CAP` (older ones would be trimmed anyway).
fn audit_entries(task: &TaskInstance) -> Result<Vec<String>, BackendError> {
    let unstored = task.unstored_audit();
    unstored[unstored.len().saturating_sub(AUDIT_LOG_CAP)..]
        .iter()
        .map(|e| serde_json::to_string(e).map_err(corrupt))
        .collect()
}

impl RedisBackend {
    /// Reads a write script's `{code, stored}` reply.
    fn check_write(
        reply: &[Value],
        task: &TaskInstance,
        lease: &Lease,
    ) -> Result<u64, BackendError> {
        let code = match reply.first() {
            Some(Value::Int(code)) => *code,
            _ => return Err(corrupt("unexpected reply from a write script")),
        };
        let stored = reply.get(1).map(super::entry::text);
        match code {
            v if v > 0 => Ok(v as u64),
            -1 => Err(BackendError::LockLost {
                task: task.id,
                fence: lease.fence,
            }),
            -2 => Err(BackendError::Conflict {
                task: task.id,
                expected: task.version,
                actual: stored.and_then(|s| s.parse().ok()).unwrap_or(0),
            }),
            -3 => Err(BackendError::NotFound(task.id)),
            -5 => Err(BackendError::CancelRequested {
                task: task.id,
                at: cancel_time(stored).unwrap_or_else(Timestamp::now),
            }),
            _ => Err(corrupt("unexpected reply from a write script")),
        }
    }

    /// One partition's page of a saga's tasks, newest first. Index entries
    /// whose task just expired (the janitor has not removed them yet) are
    /// skipped, and reading goes on past them: a short page would read as
    /// the last one and hide every older task.
    async fn list_partition(
        &self,
        partition: u16,
        query: &TaskQuery,
    ) -> Result<Vec<TaskInstance>, BackendError> {
        let limit = query.limit.max(1);
        let mut after = query.after;
        let mut tasks = Vec::new();
        loop {
            let ids = self.index_page(partition, query, after, limit).await?;
            let Some((last_id, last_ms)) = ids.last().cloned() else {
                break;
            };
            let full = ids.len() == limit;
            let ids: Vec<String> = ids.into_iter().map(|(id, _)| id).collect();
            tasks.extend(self.load_many(&ids, query).await?);
            if tasks.len() >= limit || !full {
                break;
            }
            after = Some(TaskCursor {
                created_at: Timestamp(last_ms),
                id: last_id.parse().map_err(corrupt)?,
            });
        }
        tasks.truncate(limit);
        Ok(tasks)
    }

    /// Up to `limit` entries `(id, created ms)` of one partition's index,
    /// newest first, strictly after `after`.
    async fn index_page(
        &self,
        partition: u16,
        query: &TaskQuery,
        after: Option<TaskCursor>,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, BackendError> {
        let index = self.keys().index(partition, &query.saga, query.status);
        // The page ends (exclusive) at the cursor or `created_to`,
        // whichever is earlier; tasks created in the cursor's millisecond
        // are compared by id.
        let cursor_ms = after.map(|c| c.created_at.0);
        let to_ms = query.created_to.map(|t| t.0);
        let upper = match (cursor_ms, to_ms) {
            (Some(c), Some(t)) => Some(c.min(t)),
            (c, t) => c.or(t),
        };
        let upper = upper.map_or("+inf".to_owned(), |u| format!("({u}"));
        let lower = query
            .created_from
            .map_or("-inf".to_owned(), |f| f.0.to_string());
        let ties = after.filter(|c| {
            to_ms.is_none_or(|t| c.created_at.0 < t)
                && query.created_from.is_none_or(|f| c.created_at >= f)
        });
        let mut pipe = redis::pipe();
        match ties {
            Some(c) => pipe
                .cmd("ZRANGE")
                .arg(&index)
                .arg(c.created_at.0)
                .arg(c.created_at.0)
                .arg("BYSCORE"),
            None => pipe.cmd("ECHO").arg(""),
        };
        pipe.cmd("ZRANGE")
            .arg(&index)
            .arg(&upper)
            .arg(&lower)
            .arg("BYSCORE")
            .arg("REV")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .arg("WITHSCORES");
        let (same, older): (Value, Vec<(String, f64)>) = pipe
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let mut ids: Vec<(String, u64)> = match ties {
            Some(c) => {
                let cursor = c.id.to_string();
                let mut same: Vec<(String, u64)> = super::entry::items(&same)
                    .into_iter()
                    .map(super::entry::text)
                    .filter(|id| *id < cursor)
                    .map(|id| (id, c.created_at.0))
                    .collect();
                same.sort_unstable_by(|a, b| b.0.cmp(&a.0));
                same
            }
            None => Vec::new(),
        };
        ids.extend(older.into_iter().map(|(id, ms)| (id, ms as u64)));
        ids.truncate(limit);
        Ok(ids)
    }

    async fn load_many(
        &self,
        ids: &[String],
        query: &TaskQuery,
    ) -> Result<Vec<TaskInstance>, BackendError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            let id: TaskId = id.parse().map_err(corrupt)?;
            pipe.cmd("HMGET")
                .arg(self.keys().task(id))
                .arg("doc")
                .arg("version");
            pipe.cmd("LRANGE").arg(self.keys().audit(id)).arg(0).arg(-1);
        }
        let replies: Vec<Value> = pipe
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let mut tasks = Vec::new();
        for pair in replies.chunks(2) {
            let [record, audit] = pair else { break };
            let (doc, version): (Option<String>, Option<String>) =
                redis::from_redis_value(record.clone()).map_err(corrupt)?;
            let audit: Vec<String> = redis::from_redis_value(audit.clone()).map_err(corrupt)?;
            // An index entry whose task just expired: skip it (the janitor
            // removes the entry).
            tasks.extend(parse_full(doc, version, audit)?.filter(|t| query.matches(t)));
        }
        Ok(tasks)
    }
}

#[async_trait]
impl TaskStore for RedisBackend {
    async fn create_task(
        &self,
        task: &TaskInstance,
        first: &QueueMessage,
    ) -> Result<Created, BackendError> {
        let k = self.keys();
        let p = k.partition_of(task.id);
        let existing: Option<String> = self
            .run(
                s::CREATE
                    .key(k.task(task.id))
                    .key(k.index(p, &task.saga, None))
                    .key(k.index(p, &task.saga, Some(TaskStatus::Pending)))
                    .key(k.queue(p))
                    .key(k.audit(task.id))
                    .arg(doc(task)?)
                    .arg(task.id.to_string())
                    .arg(WorkItem::Saga(first.clone()).encode())
                    .arg(task.created_at.0)
                    .arg(AUDIT_LOG_CAP)
                    .arg(audit_entries(task)?),
            )
            .await?;
        match existing {
            None => Ok(Created::New),
            Some(stored) => {
                let task = parse_doc(Some(stored), None)?
                    .ok_or_else(|| corrupt("create returned no record"))?;
                Ok(Created::Existing(Box::new(task)))
            }
        }
    }

    async fn load_task(&self, id: TaskId) -> Result<Option<TaskInstance>, BackendError> {
        let ((doc, version), audit): ((Option<String>, Option<String>), Vec<String>) =
            redis::pipe()
                .cmd("HMGET")
                .arg(self.keys().task(id))
                .arg("doc")
                .arg("version")
                .cmd("LRANGE")
                .arg(self.keys().audit(id))
                .arg(0)
                .arg(-1)
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
        parse_full(doc, version, audit)
    }

    async fn list_tasks(&self, query: &TaskQuery) -> Result<Vec<TaskInstance>, BackendError> {
        let mut tasks = Vec::new();
        for p in 0..self.keys().partitions() {
            tasks.extend(self.list_partition(p, query).await?);
        }
        tasks.sort_by_key(|t| std::cmp::Reverse((t.created_at, t.id)));
        tasks.truncate(query.limit);
        Ok(tasks)
    }

    /// The sizes of the per-status indexes of every partition, in one
    /// pipelined round trip.
    async fn count_tasks(&self, saga: &str) -> Result<Vec<(TaskStatus, usize)>, BackendError> {
        let k = self.keys();
        let mut cmds = Vec::new();
        for status in TaskStatus::ALL {
            for p in 0..k.partitions() {
                cmds.push(
                    redis::cmd("ZCARD")
                        .arg(k.index(p, saga, Some(status)))
                        .clone(),
                );
            }
        }
        let sizes: Vec<usize> = self
            .query_each(cmds)
            .await?
            .iter()
            .map(|v| redis::from_redis_value_ref(v).map_err(corrupt))
            .collect::<Result<_, _>>()?;
        let per_status = sizes.chunks(usize::from(k.partitions()).max(1));
        Ok(TaskStatus::ALL
            .into_iter()
            .zip(per_status)
            .map(|(status, sizes)| (status, sizes.iter().sum()))
            .filter(|(_, n)| *n > 0)
            .collect())
    }

    async fn lock_and_load(
        &self,
        id: TaskId,
        ttl: Duration,
    ) -> Result<Option<Locked>, BackendError> {
        let k = self.keys();
        let token = Uuid::new_v4().simple().to_string();
        let reply: Option<Vec<Value>> = self
            .run(
                s::LOCK
                    .key(k.lock(id))
                    .key(k.fence(id))
                    .key(k.task(id))
                    .key(k.cancel(id))
                    .arg(&token)
                    .arg(ms(ttl)),
            )
            .await?;
        let Some(reply) = reply else {
            return Ok(None);
        };
        let text = |i: usize| super::entry::text_at(&reply, i);
        let fence: u64 = text(0).and_then(|f| f.parse().ok()).unwrap_or(0);
        if fence == 0 {
            return Ok(Some(Locked::missing(id)));
        }
        let task = match parse_doc(text(1), text(2)) {
            Ok(task) => task,
            Err(error) => {
                // The lock is ours but no lease goes back to the caller:
                // free it now, or the task stays locked for a whole TTL.
                let _: Result<i64, _> = self.run(s::UNLOCK.key(k.lock(id)).arg(&token)).await;
                return Err(error);
            }
        };
        Ok(Some(Locked {
            lease: Lease {
                task_id: id,
                token,
                fence,
            },
            task,
            cancel_requested: cancel_time(text(3)),
        }))
    }

    async fn record_attempt(
        &self,
        task: &TaskInstance,
        stored_status: TaskStatus,
        lease: &Lease,
        claim: &str,
    ) -> Result<(u64, bool), BackendError> {
        let k = self.keys();
        let p = k.partition_of(task.id);
        let reply: Vec<Value> = self
            .run(
                s::RECORD_ATTEMPT
                    .key(k.fence(task.id))
                    .key(k.task(task.id))
                    .key(k.claims(task.id))
                    .key(k.index(p, &task.saga, Some(stored_status)))
                    .key(k.index(p, &task.saga, Some(task.status)))
                    .key(k.audit(task.id))
                    .arg(lease.fence)
                    .arg(task.version)
                    .arg(written(task)?)
                    .arg(claim)
                    .arg(task.status.as_str())
                    .arg(task.id.to_string())
                    .arg(task.created_at.0)
                    .arg(AUDIT_LOG_CAP)
                    .arg(audit_entries(task)?),
            )
            .await?;
        let version = Self::check_write(&reply, task, lease)?;
        Ok((version, matches!(reply.get(1), Some(Value::Int(1)))))
    }

    async fn record_next_attempt(
        &self,
        next: NextAttempt<'_>,
    ) -> Result<(u64, bool), BackendError> {
        let k = self.keys();
        let task = next.task;
        let p = k.partition_of(task.id);
        let (ttl, entry) = match next.renew {
            Some(ttl) => (ms(ttl).to_string(), self.entry_of(next.delivery, p)?),
            None => (String::new(), String::new()),
        };
        let reply: Vec<Value> = self
            .run(
                s::RECORD_NEXT
                    .key(k.fence(task.id))
                    .key(k.task(task.id))
                    .key(k.claims(task.id))
                    .key(k.index(p, &task.saga, Some(next.stored_status)))
                    .key(k.index(p, &task.saga, Some(task.status)))
                    .key(k.lock(task.id))
                    .key(k.queue(p))
                    .key(k.cancel(task.id))
                    .key(k.audit(task.id))
                    .arg(next.lease.fence)
                    .arg(task.version)
                    .arg(written(task)?)
                    .arg(next.claim)
                    .arg(task.status.as_str())
                    .arg(task.id.to_string())
                    .arg(task.created_at.0)
                    .arg(&next.lease.token)
                    .arg(ttl)
                    .arg(self.group())
                    .arg(&next.delivery.consumer)
                    .arg(entry)
                    .arg(if next.unless_cancelled { "1" } else { "0" })
                    .arg(AUDIT_LOG_CAP)
                    .arg(audit_entries(task)?),
            )
            .await?;
        let version = Self::check_write(&reply, task, next.lease)?;
        Ok((version, matches!(reply.get(1), Some(Value::Int(1)))))
    }

    async fn commit(&self, commit: TaskCommit<'_>) -> Result<u64, BackendError> {
        let k = self.keys();
        let task = commit.task;
        let p = k.partition_of(task.id);
        let limit = self.shared.config.dead_letter_payload_limit;
        let (kind, entry, payload, reason, size) = match commit.settle {
            Settle::Nothing => ("none", String::new(), "", "", None),
            Settle::Ack(d) => ("ack", self.entry_of(d, p)?, "", "", None),
            Settle::DeadLetter(d, reason) => {
                let (payload, size) = truncate_payload(&d.raw, limit);
                ("dead", self.entry_of(d, p)?, payload, reason, size)
            }
            Settle::ResolveDeadLetter(id) => {
                let (lp, entry) = k
                    .split_id(id)
                    .ok_or_else(|| corrupt(format!("bad dead letter id {id}")))?;
                if lp != p {
                    return Err(corrupt(format!(
                        "dead letter {id} is not in task {}'s partition",
                        task.id
                    )));
                }
                ("resolve", entry.to_owned(), "", "", None)
            }
        };
        let (next, delay) = match &commit.next {
            Some(next) => (
                WorkItem::Saga(next.message.clone()).encode(),
                next.delay.as_millis().min(1_000_000_000_000) as u64,
            ),
            None => (String::new(), 0),
        };
        // A task leaving a terminal status (a requeue) leaves the expiry set.
        let stored_member = if commit.stored_status.is_terminal() {
            Keys::expiring_member(task.id, commit.stored_status, &task.saga)
        } else {
            String::new()
        };
        let reply: Vec<Value> = self
            .run(
                s::COMMIT
                    .key(k.fence(task.id))
                    .key(k.task(task.id))
                    .key(k.lock(task.id))
                    .key(k.queue(p))
                    .key(k.dead(p))
                    .key(k.cancel(task.id))
                    .key(k.delayed(p))
                    .key(k.index(p, &task.saga, Some(commit.stored_status)))
                    .key(k.index(p, &task.saga, Some(task.status)))
                    .key(k.expiring(p))
                    .key(k.claims(task.id))
                    .key(k.audit(task.id))
                    .arg(commit.lease.fence)
                    .arg(task.version)
                    .arg(written(task)?)
                    .arg(&commit.lease.token)
                    .arg(next)
                    .arg(delay)
                    .arg(kind)
                    .arg(entry)
                    .arg(self.group())
                    .arg(payload)
                    .arg(reason)
                    .arg(task.id.to_string())
                    .arg(if commit.unless_cancelled { "1" } else { "0" })
                    .arg(task.status.as_str())
                    .arg(
                        commit
                            .expire_after
                            .map(ms)
                            .map(|m| m.to_string())
                            .unwrap_or_default(),
                    )
                    .arg(task.created_at.0)
                    .arg(stored_member)
                    .arg(Keys::expiring_member(task.id, task.status, &task.saga))
                    .arg(size.map(|s| s.to_string()).unwrap_or_default())
                    .arg(self.dead_letters_ceiling())
                    .arg(match task.status.is_terminal() {
                        true => k.finished_channel(),
                        false => String::new(),
                    })
                    .arg(AUDIT_LOG_CAP)
                    .arg(audit_entries(task)?),
            )
            .await?;
        Self::check_write(&reply, task, commit.lease)
    }

    async fn heartbeat(
        &self,
        lease: &Lease,
        delivery: &Delivery,
        ttl: Duration,
    ) -> Result<Heartbeat, BackendError> {
        let k = self.keys();
        let p = k.partition_of(lease.task_id);
        let entry = self.entry_of(delivery, p)?;
        let (held, cancel): (i64, Option<String>) = self
            .run(
                s::HEARTBEAT
                    .key(k.lock(lease.task_id))
                    .key(k.queue(p))
                    .key(k.cancel(lease.task_id))
                    .arg(&lease.token)
                    .arg(ms(ttl))
                    .arg(self.group())
                    .arg(&delivery.consumer)
                    .arg(entry),
            )
            .await?;
        Ok(Heartbeat {
            lock_held: held == 1,
            cancel_requested: cancel_time(cancel),
        })
    }

    async fn unlock(&self, lease: &Lease) -> Result<bool, BackendError> {
        let released: i64 = self
            .run(
                s::UNLOCK
                    .key(self.keys().lock(lease.task_id))
                    .arg(&lease.token),
            )
            .await?;
        Ok(released == 1)
    }

    async fn request_cancel(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
    ) -> Result<Option<Timestamp>, BackendError> {
        let k = self.keys();
        let previous: Option<String> = self
            .run(
                s::CANCEL
                    .key(k.cancel(id))
                    .key(k.task(id))
                    .key(k.queue(k.partition_of(id)))
                    .arg(Timestamp::now().0)
                    .arg(token)
                    .arg(k.cancel_channel())
                    .arg(id.to_string())
                    .arg(WorkItem::Saga(wake.clone()).encode()),
            )
            .await?;
        Ok(cancel_time(previous))
    }

    async fn cancel_requested(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError> {
        let at: Option<String> = redis::cmd("GET")
            .arg(self.keys().cancel(id))
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(cancel_time(at))
    }

    async fn wait_for_change(&self, id: TaskId, timeout: Duration) {
        let channel = self.keys().finished_channel();
        let finished = self.shared.finished.clone();
        finished
            .wait(&self.shared.server, &channel, id, timeout)
            .await;
    }

    async fn cancellations(&self) -> Result<BoxStream<'static, TaskId>, BackendError> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let server = self.shared.server.clone();
        let channel = self.keys().cancel_channel();
        // Resubscribes after a disconnect; ends when the receiver is dropped.
        tokio::spawn(async move {
            loop {
                // Connected afresh on every attempt: the primary may have
                // moved, a cluster node may have died.
                match server.pubsub().await {
                    Ok(mut pubsub) => {
                        if pubsub.subscribe(&channel).await.is_ok() {
                            let mut messages = pubsub.on_message();
                            loop {
                                // The receiver gone (the engine stopped),
                                // this task ends at once: it holds the
                                // server, whose sentinel poller lives as
                                // long as anything does.
                                let msg = tokio::select! {
                                    msg = messages.next() => msg,
                                    _ = tx.closed() => return,
                                };
                                let Some(msg) = msg else { break };
                                let Ok(text) = msg.get_payload::<String>() else {
                                    continue;
                                };
                                if let Ok(id) = text.parse::<TaskId>() {
                                    if tx.send(id).is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                    }
                    Err(error) => {
                        tracing::debug!(%error, "cancellation subscription failed; retrying")
                    }
                }
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
        Ok(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::task::{AuditAction, AuditEntry};

    #[test]
    fn the_stored_record_is_the_task_without_its_audit_log() {
        let mut task = TaskInstance::new(
            "s",
            serde_json::json!({"n": 1}),
            [("a".to_owned(), 1), ("b".to_owned(), 2)],
        );
        task.output = Some(serde_json::json!("done"));
        task.steps[0].output = Some(serde_json::json!([1, 2]));
        task.finished_at = Some(Timestamp(7));
        task.cancelled_at = Some(Timestamp(5));
        task.error = Some("e".into());
        task.version = 3;
        task.seq = 9;
        task.audit(AuditEntry::new(AuditAction::StepCompleted).step("a"));
        let stored: TaskInstance = serde_json::from_str(&doc(&task).unwrap()).unwrap();
        let mut expected = task.clone();
        expected.audit_log.clear();
        assert_eq!(stored, expected);

        // Read back whole: the record and the list.
        let entries = audit_entries(&task).unwrap();
        assert_eq!(entries.len(), 1);
        let full = parse_full(Some(doc(&task).unwrap()), Some("3".into()), entries)
            .unwrap()
            .unwrap();
        assert_eq!(full, task);
        assert!(
            full.unstored_audit().is_empty(),
            "loaded entries are stored"
        );

        // A record with its entries inline (written before the list) hands
        // them to the next write.
        let inline = serde_json::to_string(&task).unwrap();
        let old = parse_full(Some(inline), None, Vec::new()).unwrap().unwrap();
        assert_eq!(old.unstored_audit().len(), 1);
    }
}
