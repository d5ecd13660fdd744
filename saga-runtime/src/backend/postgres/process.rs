//! Process-manager instances, correlation entries, tombstones, the outbox
//! and timeouts (`migrations/0002_process.sql`).
//!
//! An instance is a row: its record one document (the engine reads and
//! writes it whole), its version and generation columns the write
//! compares. A correlation entry is a unique row `(process, field, value)
//! -> instance`, a shared one a row per member; what a deleted instance
//! handled is remembered by tombstone rows with an expiry. A commit is one
//! call of `process_commit`: every check, then every write (the instance,
//! its entries, the messages it enqueues, schedules and sends to
//! endpoints, the tallies it opens, the settling of its deliveries) in one
//! statement. One database holds all of it, so no write is ever refused
//! with [`ProcessRefusal::Elsewhere`].
//!
//! Timeouts are rows keyed by their due time. The timer poller asks often
//! (every few milliseconds in tests); an idle engine must not query each
//! time, so a commit that schedules one notifies its due time, and
//! [`process_release_due`](ProcessStore::process_release_due) skips the
//! query until the earliest due time it knows of.

use std::sync::atomic::Ordering;

use async_trait::async_trait;
use serde_json::{json, Value};
use sqlx::postgres::PgRow;
use sqlx::Row;
use uuid::Uuid;

use super::settling::{located, SettleArgs};
use super::tasks::ms;
use super::{corrupt, failure, PostgresBackend};
use crate::backend::{
    BackendError, Hold, Page, ProcessCommit, ProcessInstance, ProcessRefusal, ProcessStore,
    ProcessWrite, Settle, WorkItem,
};
use crate::model::envelope::Envelope;
use crate::model::tally::TallyOpen;
use crate::model::task::Timestamp;

/// Why `call_commit` wrote nothing, besides a refusal code.
enum CommitFailed {
    /// `endpoint_append` raised SG001: the endpoint is full.
    Full(String),
    Failed(BackendError),
}
use CommitFailed::{Failed, Full};

/// The endpoint `endpoint_append` found full, if that is why `e` failed.
fn full(e: &sqlx::Error) -> Option<String> {
    let db = e.as_database_error()?;
    if db.code().as_deref() != Some("SG001") {
        return None;
    }
    let message = db.message();
    let start = message.find('`')? + 1;
    let end = start + message[start..].find('`')?;
    Some(message[start..end].to_owned())
}

/// `process_commit`'s refusal codes (see the migration).
const CONFLICT: i32 = -2;
const TOMBSTONED: i32 = -6;
const TALLY_EXISTS: i32 = -7;
/// `process_hold`'s: held already (a success), or the cap reached.
const HELD_ALREADY: i32 = 1;
const HOLD_FULL: i32 = -8;

/// An instance from a row of `(record, version)`: the column's version is
/// the one writes compare.
fn instance(row: &PgRow) -> Result<ProcessInstance, BackendError> {
    let record: Value = row.try_get(0).map_err(corrupt)?;
    let version: i64 = row.try_get(1).map_err(corrupt)?;
    let mut instance: ProcessInstance = serde_json::from_value(record).map_err(corrupt)?;
    instance.version = u64::try_from(version).unwrap_or(0);
    Ok(instance)
}

/// A count or limit as the functions take it.
fn int(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A wall-clock time in ms as the tables keep it.
fn millis(t: u64) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

/// The tallies a commit opens, as `tally_open` takes them.
fn opened(tallies: &[TallyOpen]) -> String {
    let opened: Vec<Value> = tallies
        .iter()
        .map(|open| {
            json!({
                "process": open.tally.process,
                "instance": open.tally.instance,
                "generation": open.tally.generation,
                "name": open.tally.name,
                "items": open.items,
                // An expiry of 0 would make it gone before anyone looks.
                "keep_ms": ms(open.keep_for).max(1),
                "completion": WorkItem::Process(open.completion.clone()).encode(),
                "completion_late": WorkItem::Process(open.completion_late.clone()).encode(),
            })
        })
        .collect();
    Value::Array(opened).to_string()
}

/// A [`ProcessCommit`] as `process_commit`'s arguments.
struct CommitArgs<'a> {
    id: Option<&'a str>,
    generation: Option<&'a str>,
    version: i64,
    record: Option<String>,
    created_ms: i64,
    handled: Vec<String>,
    deleted_handled: Vec<String>,
    keys: String,
    enqueue: Vec<String>,
    due: Vec<i64>,
    timers: Vec<String>,
    endpoints: Vec<String>,
    envelopes: Vec<String>,
    tallies: String,
    settling: SettleArgs<'a>,
    batched_rows: Vec<i64>,
    batched_claims: Vec<Uuid>,
}

impl<'a> CommitArgs<'a> {
    fn of(commit: &ProcessCommit<'a>, dead_letter_limit: usize) -> Result<Self, BackendError> {
        let instance = commit.instance;
        // The record as stored: the version it will have, stamped now.
        let record = match instance.filter(|_| !commit.delete) {
            Some(i) => {
                let mut stored = i.clone();
                stored.version += 1;
                stored.updated_at = Timestamp::now();
                Some(serde_json::to_string(&stored).map_err(corrupt)?)
            }
            None => None,
        };
        let keys = json!({
            "add": commit.add_keys,
            "remove": commit.remove_keys,
            "join": commit.add_shared,
            "leave": commit.remove_shared,
        });
        let mut batched_rows = Vec::with_capacity(commit.batched.len());
        let mut batched_claims = Vec::with_capacity(commit.batched.len());
        for b in &commit.batched {
            let (row, claim) = located(b.delivery)?;
            batched_rows.push(row);
            batched_claims.push(claim);
        }
        let (endpoints, envelopes) = commit.endpoints.iter().cloned().unzip();
        let (due, timers) = commit
            .schedule
            .iter()
            .map(|(due, e)| (millis(*due), WorkItem::Process(e.clone()).encode()))
            .unzip();
        Ok(CommitArgs {
            id: instance.map(|i| i.id.as_str()),
            generation: instance.map(|i| i.generation.as_str()),
            version: instance.map_or(0, |i| millis(i.version)),
            record,
            created_ms: instance.map_or(0, |i| millis(i.created_at.0)),
            handled: commit.handled_ids().map(str::to_owned).collect(),
            deleted_handled: match (commit.delete, instance) {
                (true, Some(i)) => i.handled(),
                _ => Vec::new(),
            },
            keys: keys.to_string(),
            enqueue: commit
                .enqueue
                .iter()
                .map(|e| WorkItem::Process(e.clone()).encode())
                .collect(),
            due,
            timers,
            endpoints,
            envelopes,
            tallies: opened(&commit.tallies),
            settling: SettleArgs::of(commit.settle, dead_letter_limit)?,
            batched_rows,
            batched_claims,
        })
    }
}

impl PostgresBackend {
    /// Calls `process_commit`: `(code, detail, version)`.
    async fn call_commit(
        &self,
        process: &str,
        commit: &ProcessCommit<'_>,
    ) -> Result<(i32, Option<String>, i64), CommitFailed> {
        let config = &self.shared.config;
        let a = CommitArgs::of(commit, config.dead_letter_payload_limit).map_err(Failed)?;
        let s = &a.settling;
        // The messages held for what the write creates or claims are
        // released in its transaction, once it is written (see
        // `release_held`).
        let (created, claimed) = match commit.instance.filter(|_| !commit.delete) {
            Some(i) => (
                (i.version == 0).then_some(i.id.as_str()),
                serde_json::to_string(&commit.add_keys).map_err(|e| Failed(corrupt(e)))?,
            ),
            None => (None, "[]".to_owned()),
        };
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT c.code, c.detail, c.version, \
                 CASE WHEN c.code = 0 AND ($28::text IS NOT NULL OR $29::jsonb <> '[]'::jsonb) \
                 THEN {}($1, $28, $29::jsonb) ELSE 0 END \
                 FROM {}($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, \
                 $11::jsonb, $12, $13, $14, $15, $16, $17, $18::jsonb, $19, $20, $21, $22, $23, $24, \
                 $25, $26, $27) AS c",
                self.q("release_held"),
                self.q("process_commit")
            ))
            .bind(process)
            .bind(a.id)
            .bind(a.generation)
            .bind(a.version)
            .bind(a.record.as_deref())
            .bind(a.created_ms)
            .bind(commit.delete)
            .bind(&a.handled)
            .bind(&a.deleted_handled)
            .bind(ms(commit.tombstone_ttl))
            .bind(&a.keys)
            .bind(&a.enqueue)
            .bind(&a.due)
            .bind(&a.timers)
            .bind(&a.endpoints)
            .bind(&a.envelopes)
            .bind(i64::try_from(config.endpoint_max_len.max(1)).unwrap_or(i64::MAX))
            .bind(&a.tallies)
            .bind(s.how)
            .bind(s.row)
            .bind(s.claim)
            .bind(s.payload)
            .bind(s.reason)
            .bind(s.size)
            .bind(s.dead_letter)
            .bind(&a.batched_rows)
            .bind(&a.batched_claims)
            .bind(created)
            .bind(&claimed),
            fetch_one
        );
        // Held messages released onto the queue wake its readers.
        if matches!(&row, Ok(r) if r.try_get::<i32, _>(3).is_ok_and(|moved| moved > 0)) {
            self.shared.waker.work();
        }
        // The commit notified nobody: wake whoever may care, unless it was
        // refused (a failed statement may have committed all the same).
        let refused = matches!(&row, Ok(r) if r.try_get::<i32, _>(0).is_ok_and(|code| code != 0));
        if !refused {
            self.woke_after(commit);
            // The next message of the delivery's lane may be taken now.
            if matches!(commit.settle, Settle::Ack(_) | Settle::DeadLetter(..)) {
                self.shared.waker.work();
            }
        }
        let row = match row {
            Ok(row) => row,
            Err(e) => return Err(full(&e).map_or_else(|| Failed(failure(e)), Full)),
        };
        let column = |e| Failed(corrupt(e));
        Ok((
            row.try_get(0).map_err(column)?,
            row.try_get(1).map_err(column)?,
            row.try_get(2).map_err(column)?,
        ))
    }

    /// Calls `process_hold` (see [`Hold`]).
    async fn call_hold(
        &self,
        process: &str,
        hold: Hold<'_>,
        settle: Settle<'_>,
    ) -> Result<ProcessWrite, BackendError> {
        let s = SettleArgs::of(settle, 0)?;
        if !matches!(s.how, "ack" | "none") {
            return Err(corrupt("a hold settles its delivery by acknowledging it"));
        }
        let due = hold.envelope.hold_until.unwrap_or_default();
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT code, detail FROM {}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                self.q("process_hold")
            ))
            .bind(process)
            .bind(hold.field)
            .bind(hold.value)
            .bind(&hold.envelope.message_id)
            .bind(millis(due))
            .bind(WorkItem::Process(hold.envelope.clone()).encode())
            .bind(int(hold.cap))
            .bind(s.how)
            .bind(s.row)
            .bind(s.claim),
            fetch_one
        )
        .map_err(failure)?;
        let code: i32 = row.try_get(0).map_err(corrupt)?;
        let detail: Option<String> = row.try_get(1).map_err(corrupt)?;
        Ok(match code {
            0 => {
                self.shared.waker.timer(due);
                Ok(0)
            }
            HELD_ALREADY => Ok(0),
            CONFLICT => Err(ProcessRefusal::Conflict),
            TOMBSTONED => Err(ProcessRefusal::Tombstoned {
                instance: hold.value.to_owned(),
            }),
            HOLD_FULL => Err(ProcessRefusal::HoldFull {
                held: detail.and_then(|d| d.parse().ok()).unwrap_or(hold.cap),
            }),
            other => {
                return Err(corrupt(format!(
                    "unexpected refusal code {other} from a hold"
                )))
            }
        })
    }

    /// Wakes readers, endpoint consumers and timer pollers for what a
    /// written commit enqueued, sent and scheduled.
    fn woke_after(&self, commit: &ProcessCommit<'_>) {
        let waker = &self.shared.waker;
        if !commit.enqueue.is_empty() || !commit.tallies.is_empty() {
            waker.work();
        }
        if let Some(due) = commit.schedule.iter().map(|(due, _)| *due).min() {
            waker.timer(due);
        }
        if !commit.endpoints.is_empty() {
            waker.endpoints();
        }
    }

    /// Instances of `process` that meet `condition` on `i` (which may
    /// name `$2`, bound to `after`), in `order`, at most `limit` (`None`:
    /// all), each with its id and read on its own: a record this version
    /// cannot parse is an error of its own, not of the listing.
    async fn instances_where(
        &self,
        process: &str,
        condition: &str,
        after: Option<&str>,
        limit: Option<i64>,
        order: &str,
    ) -> Result<Vec<(String, Result<ProcessInstance, BackendError>)>, BackendError> {
        let rows = run!(
            self,
            sqlx::query(sql!(
                "SELECT i.record, i.version, i.id FROM {} i WHERE i.process = $1 AND {condition} \
             ORDER BY {order} LIMIT $3",
                self.q("process_instances")
            ))
            .bind(process)
            .bind(after)
            .bind(limit),
            fetch_all
        )
        .map_err(failure)?;
        rows.iter()
            .map(|row| Ok((row.try_get(2).map_err(corrupt)?, instance(row))))
            .collect()
    }
}

/// The instances a listing shows: one whose record this version cannot
/// read (a newer version's, during a rolling deploy) is left out with a
/// warning naming it, as on Redis; loading it by its id answers the error.
fn readable(
    process: &str,
    rows: Vec<(String, Result<ProcessInstance, BackendError>)>,
) -> Vec<ProcessInstance> {
    rows.into_iter()
        .filter_map(|(id, instance)| match instance {
            Ok(instance) => Some(instance),
            Err(error) => {
                tracing::warn!(process, instance = %id, %error, "an instance record this version cannot read is left out of the listing");
                None
            }
        })
        .collect()
}

#[async_trait]
impl ProcessStore for PostgresBackend {
    async fn process_load(
        &self,
        process: &str,
        id: &str,
    ) -> Result<Option<ProcessInstance>, BackendError> {
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT record, version FROM {} WHERE process = $1 AND id = $2",
                self.q("process_instances")
            ))
            .bind(process)
            .bind(id),
            fetch_optional
        )
        .map_err(failure)?;
        row.as_ref().map(instance).transpose()
    }

    async fn process_find(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Option<ProcessInstance>, BackendError> {
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT i.record, i.version FROM {} e JOIN {} i \
             ON i.process = e.process AND i.id = e.instance \
             WHERE e.process = $1 AND e.field = $2 AND e.value = $3",
                self.q("process_entries"),
                self.q("process_instances")
            ))
            .bind(process)
            .bind(field)
            .bind(value),
            fetch_optional
        )
        .map_err(failure)?;
        row.as_ref().map(instance).transpose()
    }

    async fn process_find_shared(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Vec<String>, BackendError> {
        run!(
            self,
            sqlx::query_scalar(sql!(
                "SELECT instance FROM {} WHERE process = $1 AND field = $2 AND value = $3 \
             ORDER BY instance",
                self.q("process_shared_entries")
            ))
            .bind(process)
            .bind(field)
            .bind(value),
            fetch_all
        )
        .map_err(failure)
    }

    /// Counted on the primary key's index (`process` leads it).
    async fn process_count(&self, process: &str) -> Result<usize, BackendError> {
        let n: i64 = run!(
            self,
            sqlx::query_scalar(sql!(
                "SELECT count(*) FROM {} WHERE process = $1",
                self.q("process_instances")
            ))
            .bind(process),
            fetch_one
        )
        .map_err(failure)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    async fn process_list(&self, process: &str) -> Result<Vec<ProcessInstance>, BackendError> {
        let rows = self
            .instances_where(
                process,
                "$2::text IS NULL",
                None,
                None,
                "i.created_ms, i.id",
            )
            .await?;
        Ok(readable(process, rows))
    }

    /// A page in id order, read from the primary key's index: only the
    /// page is read.
    async fn process_page(
        &self,
        process: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<ProcessInstance>, BackendError> {
        let limit = limit.max(1);
        let more = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
        let mut rows = self
            .instances_where(
                process,
                "($2::text IS NULL OR i.id > $2)",
                after,
                Some(more),
                "i.id",
            )
            .await?;
        // The cursor is the last row's id, read or not: a page short of an
        // unreadable instance is not the last.
        let next = match rows.len() > limit {
            true => {
                rows.truncate(limit);
                rows.last().map(|(id, _)| id.clone())
            }
            false => None,
        };
        Ok(Page {
            items: readable(process, rows),
            next,
        })
    }

    async fn process_commit(
        &self,
        process: &str,
        commit: ProcessCommit<'_>,
    ) -> Result<ProcessWrite, BackendError> {
        if let Some(hold) = commit.hold {
            return self.call_hold(process, hold, commit.settle).await;
        }
        let (code, detail, version) = match self.call_commit(process, &commit).await {
            Err(Full(endpoint)) => return Ok(Err(ProcessRefusal::EndpointFull { endpoint })),
            Err(Failed(error)) => return Err(error),
            Ok(answer) => answer,
        };
        let instance = || commit.instance.map(|i| i.id.clone()).unwrap_or_default();
        Ok(match code {
            0 => Ok(u64::try_from(version).unwrap_or(0)),
            CONFLICT => Err(ProcessRefusal::Conflict),
            TOMBSTONED => Err(ProcessRefusal::Tombstoned {
                instance: instance(),
            }),
            TALLY_EXISTS => {
                let n = detail.and_then(|d| d.parse::<usize>().ok()).unwrap_or(1);
                match commit.tallies.get(n.saturating_sub(1)) {
                    Some(open) => Err(ProcessRefusal::TallyExists(open.tally.clone())),
                    None => return Err(corrupt("the process commit named no tally it opens")),
                }
            }
            other => {
                return Err(corrupt(format!(
                    "unexpected refusal code {other} from a process commit"
                )))
            }
        })
    }

    async fn process_release_due(&self, now_ms: u64, limit: usize) -> Result<usize, BackendError> {
        let signals = &self.shared.signals;
        let known = signals.next_timer.load(Ordering::SeqCst);
        // Nothing is due before the earliest time known: notifications
        // bring every time scheduled since (unless the listener is down).
        if signals.listening.load(Ordering::SeqCst) && known != 0 && now_ms < known {
            return Ok(0);
        }
        // From here, the times notifications bring are kept with what the
        // query finds left.
        signals.next_timer.store(u64::MAX, Ordering::SeqCst);
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT moved, next_due FROM {}($1, $2)",
                self.q("release_timers")
            ))
            .bind(millis(now_ms))
            .bind(int(limit.max(1))),
            fetch_one
        );
        let row = match row {
            Ok(row) => row,
            Err(error) => {
                signals.next_timer.store(0, Ordering::SeqCst);
                return Err(failure(error));
            }
        };
        let moved: i32 = row.try_get(0).map_err(corrupt)?;
        if moved > 0 {
            self.shared.waker.work();
        }
        let next: Option<i64> = row.try_get(1).map_err(corrupt)?;
        signals.timer_at(next.map_or(u64::MAX, |n| u64::try_from(n).unwrap_or(0)));
        Ok(usize::try_from(moved).unwrap_or(0))
    }

    async fn process_scheduled(&self) -> Result<Vec<(u64, Envelope)>, BackendError> {
        let rows = run!(
            self,
            sqlx::query(sql!(
                "SELECT due_ms, payload FROM {} ORDER BY due_ms, id",
                self.q("process_timers")
            )),
            fetch_all
        )
        .map_err(failure)?;
        let mut scheduled = Vec::with_capacity(rows.len());
        for row in rows {
            let due: i64 = row.try_get(0).map_err(corrupt)?;
            let payload: String = row.try_get(1).map_err(corrupt)?;
            if let Ok(WorkItem::Process(envelope)) = WorkItem::decode(payload.as_bytes()) {
                scheduled.push((u64::try_from(due).unwrap_or(0), envelope));
            }
        }
        Ok(scheduled)
    }
}
