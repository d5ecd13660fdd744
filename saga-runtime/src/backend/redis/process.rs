//! Process-manager instances, their correlation index, outbox and timeouts.

use async_trait::async_trait;

use super::scripts::{self as s};
use super::{corrupt, unavailable, RedisBackend};
use crate::backend::{
    BackendError, Page, ProcessCommit, ProcessInstance, ProcessStore, ProcessWrite, WorkItem,
};
use crate::model::envelope::Envelope;

pub(super) fn parse_instance(
    doc: Option<String>,
    version: Option<String>,
) -> Result<Option<ProcessInstance>, BackendError> {
    let Some(doc) = doc else { return Ok(None) };
    let mut instance: ProcessInstance = serde_json::from_str(&doc).map_err(corrupt)?;
    instance.version = version
        .and_then(|v| v.parse().ok())
        .unwrap_or(instance.version);
    Ok(Some(instance))
}

/// A record is only ever used by the process manager and instance it
/// belongs to: a key that another name's layout also produces (names were
/// once unrestricted: `acct:x` with id `1` and `acct` with id `x:1` met at
/// one key) must not hand one process manager another's state.
fn owned_by(
    instance: Option<ProcessInstance>,
    process: &str,
    id: &str,
) -> Result<Option<ProcessInstance>, BackendError> {
    match instance {
        Some(found) if found.process != process || found.id != id => Err(corrupt(format!(
            "the record at the key of instance `{id}` of process manager `{process}` belongs \
             to instance `{}` of `{}`",
            found.id, found.process
        ))),
        other => Ok(other),
    }
}

impl RedisBackend {
    /// The instances `ids` of `process`, 200 per pipelined round trip; a
    /// record that does not parse is logged and left out.
    async fn load_instances(
        &self,
        process: &str,
        ids: &[String],
    ) -> Result<Vec<ProcessInstance>, BackendError> {
        let mut list = Vec::new();
        for chunk in ids.chunks(200) {
            let cmds = chunk
                .iter()
                .map(|id| {
                    redis::cmd("HMGET")
                        .arg(self.keys().instance(process, id))
                        .arg("doc")
                        .arg("version")
                        .clone()
                })
                .collect();
            let docs: Vec<(Option<String>, Option<String>)> = self
                .query_each(cmds)
                .await?
                .iter()
                .map(|v| redis::from_redis_value_ref(v).map_err(corrupt))
                .collect::<Result<_, _>>()?;
            for ((doc, version), id) in docs.into_iter().zip(chunk) {
                match parse_instance(doc, version).and_then(|i| owned_by(i, process, id)) {
                    Ok(instance) => list.extend(instance),
                    Err(error) => {
                        tracing::warn!(process, instance = %id, %error, "instance left out of the listing")
                    }
                }
            }
        }
        Ok(list)
    }
}

impl RedisBackend {
    /// A random instance id in partition `k`.
    pub(super) fn id_in_partition(&self, process: &str, k: u16) -> String {
        loop {
            let id = uuid::Uuid::new_v4().to_string();
            if self.keys().pm_k(process, &id) == k {
                return id;
            }
        }
    }
}

#[async_trait]
impl ProcessStore for RedisBackend {
    async fn process_load(
        &self,
        process: &str,
        id: &str,
    ) -> Result<Option<ProcessInstance>, BackendError> {
        let (doc, version): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(self.keys().instance(process, id))
            .arg("doc")
            .arg("version")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        owned_by(parse_instance(doc, version)?, process, id)
    }

    async fn process_find(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Option<ProcessInstance>, BackendError> {
        let id: Option<String> = redis::cmd("GET")
            .arg(self.keys().correlation(process, field, value))
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let Some(id) = id else { return Ok(None) };
        let found = self.process_load(process, &id).await?;
        // Spread layout: an entry claimed from another slot than its
        // instance's may name an instance whose commit has not landed (or
        // never will); only one that holds the value is found by it.
        Ok(found.filter(|i| {
            !self.keys().spread() || i.keys.iter().any(|(f, v)| f == field && v == value)
        }))
    }

    async fn process_find_shared(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Vec<String>, BackendError> {
        let mut ids: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.keys().shared_correlation(process, field, value))
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        ids.sort();
        Ok(ids)
    }

    async fn process_list(&self, process: &str) -> Result<Vec<ProcessInstance>, BackendError> {
        let k = self.keys();
        let cmds = k
            .pm_parts()
            .into_iter()
            .map(|part| {
                redis::cmd("SMEMBERS")
                    .arg(k.instances(process, part))
                    .clone()
            })
            .collect();
        let mut ids: Vec<String> = Vec::new();
        for set in self.query_each(cmds).await? {
            let members: Vec<String> = redis::from_redis_value_ref(&set).map_err(corrupt)?;
            ids.extend(members);
        }
        let mut list = self.load_instances(process, &ids).await?;
        list.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(list)
    }

    /// A page of the partitions' sets of instances, scanned in turn
    /// (compact: the one set); the cursor is the set's `SSCAN` cursor,
    /// preceded in the spread layout by the partition (`<k>/<cursor>`).
    async fn process_page(
        &self,
        process: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<ProcessInstance>, BackendError> {
        let k = self.keys();
        let bad = || BackendError::InvalidCursor(after.unwrap_or_default().to_owned());
        let (part, start): (u16, u64) = match (after, k.spread()) {
            (None, _) => (0, 0),
            (Some(cursor), false) => (0, cursor.parse().map_err(|_| bad())?),
            (Some(cursor), true) => {
                let (part, start) = cursor.split_once('/').ok_or_else(bad)?;
                let part: u16 = part.parse().map_err(|_| bad())?;
                if part >= k.pm_count() {
                    return Err(bad());
                }
                (part, start.parse().map_err(|_| bad())?)
            }
        };
        // Scans the partitions' sets in turn until about `limit` ids are
        // gathered (one partition holds a 24th of them) or the last is done.
        let (mut part, mut start) = (part, start);
        let mut ids: Vec<String> = Vec::new();
        let next = loop {
            let (cursor, found): (String, Vec<String>) = redis::cmd("SSCAN")
                .arg(k.instances(process, part))
                .arg(start)
                .arg("COUNT")
                .arg(limit.saturating_sub(ids.len()).max(1))
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            ids.extend(found);
            let next = match (cursor.as_str(), k.spread()) {
                ("0", false) => None,
                (_, false) => Some(cursor),
                ("0", true) => (part + 1 < k.pm_count()).then(|| format!("{}/0", part + 1)),
                (_, true) => Some(format!("{part}/{cursor}")),
            };
            match &next {
                Some(cursor) if k.spread() && ids.len() < limit => {
                    let (p, s) = cursor.split_once('/').ok_or_else(bad)?;
                    (part, start) = (p.parse().map_err(|_| bad())?, s.parse().map_err(|_| bad())?);
                }
                _ => break next,
            }
        };
        let items = self.load_instances(process, &ids).await?;
        Ok(Page { items, next })
    }

    /// The sizes of the partitions' instance sets, in one round trip.
    async fn process_count(&self, process: &str) -> Result<usize, BackendError> {
        let k = self.keys();
        let cmds = k
            .pm_parts()
            .into_iter()
            .map(|part| redis::cmd("SCARD").arg(k.instances(process, part)).clone())
            .collect();
        let mut count = 0;
        for size in self.query_each(cmds).await? {
            count += redis::from_redis_value_ref::<usize>(&size).map_err(corrupt)?;
        }
        Ok(count)
    }

    async fn process_commit(
        &self,
        process: &str,
        commit: ProcessCommit<'_>,
    ) -> Result<ProcessWrite, BackendError> {
        self.commit_process(process, commit).await
    }

    async fn process_release_due(&self, now_ms: u64, limit: usize) -> Result<usize, BackendError> {
        let k = self.keys();
        if !k.spread() {
            return self
                .call(&s::ReleaseDue {
                    schedule: k.scheduled(0),
                    queue: k.queue(k.process_stream()),
                    members: Some(k.partition_members()),
                    due_by_ms: now_ms,
                    limit,
                    pm_prefix: k.process_prefix(k.process_stream()),
                    partitions: k.pm_count(),
                })
                .await;
        }
        // A schedule per partition, moved onto the partition's queue.
        let mut most = 0;
        for part in k.pm_parts() {
            let moved = self
                .call(&s::ReleaseDue {
                    schedule: k.scheduled(part),
                    queue: k.queue(k.process_partition(part)),
                    members: None,
                    due_by_ms: now_ms,
                    limit,
                    pm_prefix: String::new(),
                    partitions: k.pm_count(),
                })
                .await?;
            most = most.max(moved);
        }
        Ok(most)
    }

    async fn process_scheduled(&self) -> Result<Vec<(u64, Envelope)>, BackendError> {
        let k = self.keys();
        let mut all = Vec::new();
        for part in k.pm_parts() {
            let entries: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
                .arg(k.scheduled(part))
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            all.extend(entries.into_iter().filter_map(|(payload, due)| {
                match WorkItem::decode(&payload) {
                    Ok(WorkItem::Process(envelope)) => Some((due as u64, envelope)),
                    _ => None,
                }
            }));
        }
        all.sort_by_key(|(due, _)| *due);
        Ok(all)
    }
}
