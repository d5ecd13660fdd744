//! Process-manager instances, their correlation index, outbox and timeouts.

use async_trait::async_trait;
use redis::Value;

use super::{corrupt, scripts as s, unavailable, RedisBackend};
use crate::backend::{
    truncate_payload, BackendError, Page, ProcessCommit, ProcessInstance, ProcessStore, Settle,
    WorkItem,
};
use crate::process::Envelope;

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
        let mut conn = self.conn();
        let mut list = Vec::new();
        for chunk in ids.chunks(200) {
            let mut pipe = redis::pipe();
            for id in chunk {
                pipe.cmd("HMGET")
                    .arg(self.keys().instance(process, id))
                    .arg("doc")
                    .arg("version");
            }
            let docs: Vec<(Option<String>, Option<String>)> =
                pipe.query_async(&mut conn).await.map_err(unavailable)?;
            for ((doc, version), id) in docs.into_iter().zip(chunk) {
                match owned_by(parse_instance(doc, version)?, process, id) {
                    Ok(instance) => list.extend(instance),
                    Err(error) => tracing::warn!(%error, "instance left out of the listing"),
                }
            }
        }
        Ok(list)
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
        match id {
            Some(id) => self.process_load(process, &id).await,
            None => Ok(None),
        }
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
        let ids: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.keys().instances(process))
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let mut list = self.load_instances(process, &ids).await?;
        list.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(list)
    }

    async fn process_page(
        &self,
        process: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<ProcessInstance>, BackendError> {
        let start: u64 = match after {
            Some(cursor) => cursor
                .parse()
                .map_err(|_| BackendError::InvalidCursor(cursor.to_owned()))?,
            None => 0,
        };
        let (cursor, ids): (String, Vec<String>) = redis::cmd("SSCAN")
            .arg(self.keys().instances(process))
            .arg(start)
            .arg("COUNT")
            .arg(limit.max(1))
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let items = self.load_instances(process, &ids).await?;
        let next = (cursor != "0").then_some(cursor);
        Ok(Page { items, next })
    }

    async fn process_commit(
        &self,
        process: &str,
        commit: ProcessCommit<'_>,
    ) -> Result<u64, BackendError> {
        let k = self.keys();
        let limit = self.shared.config.dead_letter_payload_limit;
        let (kind, (pm, entry), payload, reason, size) = match commit.settle {
            Settle::Nothing => ("none", (k.process_stream(), String::new()), "", "", None),
            Settle::Ack(d) => ("ack", self.process_entry_of(d)?, "", "", None),
            Settle::DeadLetter(d, reason) => {
                let (payload, size) = truncate_payload(&d.raw, limit);
                ("dead", self.process_entry_of(d)?, payload, reason, size)
            }
            Settle::ResolveDeadLetter(_) => {
                return Err(corrupt("process commits do not resolve dead letters"))
            }
        };
        let (id, doc, version) = match commit.instance {
            Some(i) => (
                i.id.clone(),
                serde_json::to_string(i).map_err(corrupt)?,
                i.version,
            ),
            None => (String::new(), String::new(), 0),
        };
        let mut invocation = s::PROCESS_COMMIT.prepare_invoke();
        invocation
            .key(k.instance(process, &id))
            .key(k.instances(process))
            .key(k.queue(pm))
            .key(k.scheduled())
            .key(k.dead(pm));
        for (field, value) in commit.add_keys.iter().chain(&commit.remove_keys) {
            invocation.key(k.correlation(process, field, value));
        }
        for (endpoint, _) in &commit.endpoints {
            invocation.key(k.endpoint(endpoint));
        }
        // Tombstones: the instance's, then those of the entries claimed
        // (checked when creating) and released (written when deleting).
        invocation.key(k.tombstone(process, &id));
        for (field, value) in commit.add_keys.iter().chain(&commit.remove_keys) {
            invocation.key(k.correlation_tombstone(process, field, value));
        }
        for open in &commit.tallies {
            invocation
                .key(k.tally(&open.tally, ""))
                .key(k.tally(&open.tally, ":pending"))
                .key(k.tally(&open.tally, ":checked"));
        }
        invocation.key(k.open_tallies());
        for (field, value) in commit.add_shared.iter().chain(&commit.remove_shared) {
            invocation.key(k.shared_correlation(process, field, value));
        }
        invocation.key(k.partition_members());
        let handled = match (commit.delete, commit.instance) {
            (true, Some(i)) => serde_json::to_string(&i.handled()).map_err(corrupt)?,
            _ => "[]".to_owned(),
        };
        invocation
            .arg(if commit.instance.is_some() { "1" } else { "0" })
            .arg(version)
            .arg(doc)
            .arg(&id)
            .arg(if commit.delete { "1" } else { "0" })
            .arg(commit.add_keys.len())
            .arg(commit.remove_keys.len())
            .arg(commit.endpoints.len())
            .arg(commit.enqueue.len())
            .arg(commit.schedule.len())
            .arg(kind)
            .arg(entry)
            .arg(self.group())
            .arg(payload)
            .arg(reason)
            .arg(size.map(|s| s.to_string()).unwrap_or_default())
            .arg(self.dead_letters_ceiling())
            .arg((self.shared.config.endpoint_max_len as u64).min(super::MAXLEN_LIMIT))
            .arg(commit.handling.unwrap_or_default())
            .arg(super::ms(commit.tombstone_ttl))
            .arg(handled)
            .arg(commit.tallies.len())
            .arg(commit.add_shared.len())
            .arg(commit.remove_shared.len());
        let mut batched_ids = Vec::new();
        let mut batched_acks = Vec::new();
        for batched in &commit.batched {
            let (p, entry) = self.process_entry_of(batched.delivery)?;
            batched_ids.push(batched.message_id);
            batched_acks.push([k.queue(p), entry]);
        }
        invocation
            .arg(serde_json::to_string(&batched_ids).map_err(corrupt)?)
            .arg(serde_json::to_string(&batched_acks).map_err(corrupt)?)
            .arg(commit.instance.map_or("", |i| i.generation.as_str()));
        for envelope in &commit.enqueue {
            invocation
                .arg(k.queue(k.envelope_stream(envelope)))
                .arg(WorkItem::Process(envelope.clone()).encode());
        }
        for (_, payload) in &commit.endpoints {
            invocation.arg(payload);
        }
        for (due, envelope) in &commit.schedule {
            invocation
                .arg(*due)
                .arg(WorkItem::Process(envelope.clone()).encode());
        }
        for open in &commit.tallies {
            invocation
                .arg(open.items.len())
                .arg(super::ms(open.keep_for).max(1))
                .arg(WorkItem::Process(open.completion.clone()).encode())
                .arg(WorkItem::Process(open.completion_late.clone()).encode())
                .arg(k.queue(k.envelope_stream(&open.completion)));
            for item in &open.items {
                invocation.arg(item);
            }
            invocation.arg(super::tally::member(&open.tally)?);
        }
        let reply: Vec<Value> = self.run(&invocation).await?;
        match reply.first() {
            Some(Value::Int(v)) if *v >= 0 => Ok(*v as u64),
            Some(Value::Int(-6)) => {
                let n = match reply.get(1) {
                    Some(Value::Int(n)) => *n as usize,
                    _ => 1,
                };
                let open = commit.tallies.get(n.saturating_sub(1));
                Err(open.map_or_else(
                    || corrupt("the process commit script named no tally"),
                    |o| BackendError::TallyExists(o.tally.clone()),
                ))
            }
            Some(Value::Int(-5)) => Err(BackendError::ProcessTombstoned {
                process: process.to_owned(),
                instance: id,
            }),
            Some(Value::Int(_)) => Err(BackendError::ProcessConflict {
                process: process.to_owned(),
                instance: id,
            }),
            _ => Err(corrupt("unexpected reply from the process commit script")),
        }
    }

    async fn process_release_due(&self, now_ms: u64, limit: usize) -> Result<usize, BackendError> {
        self.run(
            s::RELEASE_DUE
                .key(self.keys().scheduled())
                .key(self.keys().queue(self.keys().process_stream()))
                .key(self.keys().partition_members())
                .arg(now_ms)
                .arg(limit)
                .arg(self.keys().process_prefix())
                .arg(super::keys::PROCESS_PARTITIONS),
        )
        .await
    }

    async fn process_scheduled(&self) -> Result<Vec<(u64, Envelope)>, BackendError> {
        let entries: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
            .arg(self.keys().scheduled())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(entries
            .into_iter()
            .filter_map(|(payload, due)| match WorkItem::decode(&payload) {
                Ok(WorkItem::Process(envelope)) => Some((due as u64, envelope)),
                _ => None,
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
