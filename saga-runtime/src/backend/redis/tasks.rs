//! Task records, leases, attempt claims, commits and cancellation flags.

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use redis::Value;
use uuid::Uuid;

use super::record::{write_fields, RawRecord};
use super::scripts::{self as s, Locking, RefusalCode, Refused};
use super::{corrupt, ms, unavailable, RedisBackend};
use crate::backend::write::{Answer, Write};
use crate::backend::{
    BackendError, Created, Delivery, Heartbeat, Lease, Locked, QueueMessage, TaskCursor, TaskQuery,
    TaskRefusal, TaskStore, WorkItem,
};
use crate::model::task::{AuditEntry, TaskId, TaskInstance, TaskStatus, Timestamp, AUDIT_LOG_CAP};

pub(super) use super::cancel::cancel_time;

/// A task from its record alone, without the audit log: what a worker
/// needs (it only appends to the log). A record written before the log had
/// its own list carries its entries inline; they count as not stored yet,
/// so the next write moves them to the list.
pub(super) fn parse_doc(record: RawRecord) -> Result<Option<TaskInstance>, BackendError> {
    record.parse()
}

/// A whole task: its record and its audit log.
fn parse_full(record: RawRecord, audit: Vec<String>) -> Result<Option<TaskInstance>, BackendError> {
    let Some(mut task) = parse_doc(record)? else {
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

impl RedisBackend {
    /// The record of a write (`doc` and the other fields, see
    /// `record::write_fields`): stamped with when it was written (the
    /// store's `updated_at`, as the in-memory backend keeps it).
    pub(super) fn written(
        &self,
        task: &TaskInstance,
    ) -> Result<(String, Vec<String>), BackendError> {
        write_fields(task, Timestamp::now(), None)
    }
}

/// The audit entries a write appends: those the store does not hold yet,
/// at most the last `AUDIT_LOG_CAP` (older ones would be trimmed anyway).
pub(super) fn audit_entries(task: &TaskInstance) -> Result<Vec<String>, BackendError> {
    let unstored = task.unstored_audit();
    unstored[unstored.len().saturating_sub(AUDIT_LOG_CAP)..]
        .iter()
        .map(|e| serde_json::to_string(e).map_err(corrupt))
        .collect()
}

/// A task write script's refusal as the write's answer; a code no task
/// write answers is a corrupt reply.
pub(super) fn write_refused(
    refused: Refused,
    task: &TaskInstance,
    lease: &Lease,
) -> Result<TaskRefusal, BackendError> {
    Ok(match refused.refusal {
        RefusalCode::LockLost => TaskRefusal::LockLost { fence: lease.fence },
        RefusalCode::Conflict => TaskRefusal::Conflict {
            expected: task.version,
            actual: refused.detail.and_then(|s| s.parse().ok()).unwrap_or(0),
        },
        RefusalCode::Missing => TaskRefusal::Missing,
        RefusalCode::CancelRequested => TaskRefusal::CancelRequested {
            at: cancel_time(refused.detail).unwrap_or_else(Timestamp::now),
        },
        _ => return Err(corrupt("unexpected reply from a write script")),
    })
}

impl RedisBackend {
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
            pipe.cmd("HGETALL").arg(self.keys().task(id));
            pipe.cmd("LRANGE").arg(self.keys().audit(id)).arg(0).arg(-1);
        }
        let replies: Vec<Value> = pipe
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let mut tasks = Vec::new();
        for (pair, id) in replies.chunks(2).zip(ids) {
            let [record, audit] = pair else { break };
            let audit: Vec<String> = redis::from_redis_value_ref(audit).map_err(corrupt)?;
            // A record this version cannot read (a newer version's, during
            // a rolling deploy) is its own error, not its neighbours': left
            // out with a warning naming it (loading it by id answers the
            // error), and the page reads on past it.
            let task = match RawRecord::from_fields(record).and_then(|r| parse_full(r, audit)) {
                Ok(task) => task,
                Err(error) => {
                    tracing::warn!(task_id = %id, %error, "a task record this version cannot read is left out of the listing");
                    continue;
                }
            };
            // An index entry whose task just expired: skip it (the janitor
            // removes the entry).
            tasks.extend(task.filter(|t| query.matches(t)));
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
        let (doc, fields) = write_fields(task, task.updated_at, Some(self.creates_apart().await))?;
        let tk = k.of_task(task.id);
        let existing = self
            .call(&s::Create {
                task: tk.task,
                index_all: k.index(p, &task.saga, None),
                index_pending: k.index(p, &task.saga, Some(TaskStatus::Pending)),
                queue: k.queue(p),
                audit: tk.audit,
                doc,
                id: tk.id,
                payload: WorkItem::Saga(first.clone()).encode(),
                created_ms: task.created_at.0,
                audit_cap: AUDIT_LOG_CAP,
                fields,
                audit_entries: audit_entries(task)?,
            })
            .await?;
        match existing {
            None => Ok(Created::New),
            Some(stored) => {
                let task =
                    parse_doc(stored)?.ok_or_else(|| corrupt("create returned no record"))?;
                Ok(Created::Existing(Box::new(task)))
            }
        }
    }

    async fn load_task(&self, id: TaskId) -> Result<Option<TaskInstance>, BackendError> {
        let (record, audit): (Value, Vec<String>) = redis::pipe()
            .cmd("HGETALL")
            .arg(self.keys().task(id))
            .cmd("LRANGE")
            .arg(self.keys().audit(id))
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        parse_full(RawRecord::from_fields(&record)?, audit)
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

    async fn saga_names(&self) -> Result<Option<Vec<String>>, BackendError> {
        self.scan_saga_names().await.map(Some)
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

    /// The sizes of the asked-for per-status indexes of every partition,
    /// in one pipelined round trip.
    async fn count_in_statuses(
        &self,
        sagas: &[&str],
        statuses: &[TaskStatus],
    ) -> Result<Vec<(String, TaskStatus, usize)>, BackendError> {
        let k = self.keys();
        let mut cmds = Vec::new();
        let mut cells = Vec::new();
        for saga in sagas {
            for status in statuses {
                for p in 0..k.partitions() {
                    cmds.push(
                        redis::cmd("ZCARD")
                            .arg(k.index(p, saga, Some(*status)))
                            .clone(),
                    );
                }
                cells.push(((*saga).to_owned(), *status));
            }
        }
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        let sizes: Vec<usize> = self
            .query_each(cmds)
            .await?
            .iter()
            .map(|v| redis::from_redis_value_ref(v).map_err(corrupt))
            .collect::<Result<_, _>>()?;
        let per_cell = sizes.chunks(usize::from(k.partitions()).max(1));
        Ok(cells
            .into_iter()
            .zip(per_cell)
            .map(|((saga, status), sizes)| (saga, status, sizes.iter().sum()))
            .filter(|(_, _, n)| *n > 0)
            .collect())
    }

    async fn lock_and_load(
        &self,
        id: TaskId,
        ttl: Duration,
    ) -> Result<Option<Locked>, BackendError> {
        let k = self.keys();
        let token = Uuid::new_v4().simple().to_string();
        let locking = self
            .call(&s::Lock {
                lock: k.lock(id),
                fence: k.fence(id),
                task: k.task(id),
                cancel: k.cancel(id),
                token: &token,
                ttl_ms: ms(ttl),
            })
            .await?;
        let (fence, record, cancel) = match locking {
            Locking::Busy => return Ok(None),
            Locking::Missing => return Ok(Some(Locked::missing(id))),
            Locking::Taken {
                fence,
                record,
                cancel,
            } => (fence, record, cancel),
        };
        let task = match parse_doc(record) {
            Ok(task) => task,
            Err(error) => {
                // The lock is ours but no lease goes back to the caller:
                // free it now, or the task stays locked for a whole TTL.
                let unlock = s::Unlock {
                    lock: k.lock(id),
                    token: &token,
                };
                let _: Result<bool, _> = self.call(&unlock).await;
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
            cancel_requested: cancel_time(cancel),
        }))
    }

    async fn apply(&self, write: &Write<'_>) -> Result<Answer, BackendError> {
        self.interpret(write).await
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
        let beat = self
            .call(&s::Heartbeat {
                lock: k.lock(lease.task_id),
                queue: k.queue(p),
                cancel: k.cancel(lease.task_id),
                task: k.task(lease.task_id),
                token: &lease.token,
                ttl_ms: ms(ttl),
                group: self.group(),
                consumer: &delivery.consumer,
                entry,
            })
            .await?;
        Ok(Heartbeat {
            lock_held: beat.held,
            cancel_requested: cancel_time(beat.cancel),
        })
    }

    async fn unlock(&self, lease: &Lease) -> Result<bool, BackendError> {
        self.call(&s::Unlock {
            lock: self.keys().lock(lease.task_id),
            token: &lease.token,
        })
        .await
    }

    async fn request_cancel(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
    ) -> Result<Option<Timestamp>, BackendError> {
        self.cancel_request(id, token, wake, None).await
    }

    async fn request_cancel_audited(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
        entry: &AuditEntry,
    ) -> Result<Option<Timestamp>, BackendError> {
        self.cancel_request(id, token, wake, Some(entry)).await
    }

    async fn cancel_requested(&self, id: TaskId) -> Result<Option<Timestamp>, BackendError> {
        // A key of its own (record layout 1) or a field of the record.
        let (key, field): (Option<String>, Option<String>) = redis::pipe()
            .cmd("GET")
            .arg(self.keys().cancel(id))
            .cmd("HGET")
            .arg(self.keys().task(id))
            .arg("cancel")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(cancel_time(key.or(field)))
    }

    async fn wait_for_change(&self, id: TaskId, timeout: Duration) {
        let channel = self.keys().finished_channel();
        let finished = self.shared.finished.clone();
        finished
            .wait(&self.shared.server, &channel, id, timeout)
            .await;
    }

    async fn cancellations(&self) -> Result<BoxStream<'static, TaskId>, BackendError> {
        Ok(self.cancellation_stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::task::{AuditAction, AuditEntry, StepStatus};

    fn raw(doc: String, version: Option<&str>) -> RawRecord {
        RawRecord {
            doc: Some(doc),
            version: version.map(str::to_owned),
            apart: false,
        }
    }

    /// What `HGETALL` answers for a hash of these fields.
    fn hash(fields: &[(&str, &str)]) -> Value {
        Value::Array(
            fields
                .iter()
                .flat_map(|(k, v)| [k, v])
                .map(|s| Value::BulkString(s.as_bytes().to_vec()))
                .collect(),
        )
    }

    fn sample() -> TaskInstance {
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
        task
    }

    #[test]
    fn the_stored_record_is_the_task_without_its_audit_log() {
        let task = sample();
        let (doc, fields) = write_fields(&task, task.updated_at, None).unwrap();
        assert!(fields.is_empty(), "layout 1: the whole record in doc");
        let stored: TaskInstance = serde_json::from_str(&doc).unwrap();
        let mut expected = task.clone();
        expected.audit_log.clear();
        assert_eq!(stored, expected);

        // Read back whole: the record and the list.
        let entries = audit_entries(&task).unwrap();
        assert_eq!(entries.len(), 1);
        let full = parse_full(raw(doc, Some("3")), entries).unwrap().unwrap();
        assert_eq!(full, task);
        assert!(
            full.unstored_audit().is_empty(),
            "loaded entries are stored"
        );

        // A record with its entries inline (written before the list) hands
        // them to the next write.
        let inline = serde_json::to_string(&task).unwrap();
        let old = parse_full(raw(inline, None), Vec::new()).unwrap().unwrap();
        assert_eq!(old.unstored_audit().len(), 1);
    }

    /// Layout 2: the fixed fields and every step when a task is created;
    /// then the changing fields and the steps that changed; read back
    /// whole. A record in layout 1 stays there.
    #[test]
    fn a_record_with_its_steps_apart_sends_only_what_changed() {
        let task = sample();
        let (doc, fields) = write_fields(&task, task.updated_at, Some(true)).unwrap();
        let names: Vec<&str> = fields.iter().step_by(2).map(String::as_str).collect();
        assert_eq!(names, ["n", "h", "s:0", "s:1"], "created: everything");
        assert!(!doc.contains("input") && !doc.contains("steps"), "{doc}");
        let mut stored: Vec<(&str, &str)> = vec![("doc", &doc), ("version", "3")];
        stored.extend(fields.chunks(2).map(|p| (p[0].as_str(), p[1].as_str())));
        let mut loaded = parse_doc(RawRecord::from_fields(&hash(&stored)).unwrap())
            .unwrap()
            .unwrap();
        let mut expected = task.clone();
        expected.audit_log.clear();
        assert_eq!(loaded, expected);
        assert!(loaded.steps_apart());

        // A step changes: its field alone.
        loaded.steps[1].status = StepStatus::Running;
        let (_, fields) = write_fields(&loaded, loaded.updated_at, None).unwrap();
        let names: Vec<&str> = fields.iter().step_by(2).map(String::as_str).collect();
        assert_eq!(names, ["n", "s:1"]);
        // Saved at the next version: nothing to send but `doc` and `n`.
        loaded.version += 1;
        loaded.steps_saved(loaded.version);
        let (_, fields) = write_fields(&loaded, loaded.updated_at, None).unwrap();
        assert_eq!(fields, ["n", "2"]);

        // A step field missing: unreadable, not a task with a step less.
        let short: Vec<(&str, &str)> = stored
            .iter()
            .copied()
            .filter(|(k, _)| *k != "s:1")
            .collect();
        assert!(parse_doc(RawRecord::from_fields(&hash(&short)).unwrap()).is_err());
        // A damaged step count is refused, not built for.
        for n in ["4000000000", "-1"] {
            let damaged: Vec<(&str, &str)> = stored
                .iter()
                .map(|&(k, v)| if k == "n" { (k, n) } else { (k, v) })
                .collect();
            assert!(RawRecord::from_fields(&hash(&damaged)).is_err(), "n = {n}");
        }
    }
}
