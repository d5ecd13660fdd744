//! A process-manager commit on Redis: where it lives (its partition's
//! slot), the correlation entries it claims in other slots first (on a
//! cluster), the one script that writes everything in its slot, and the
//! relays and releases after it.

use std::time::Duration;

use super::keys::slot;
use super::scripts::{self as s, EntryClaim, HeldKeys, Holding, RefusalCode, Refused, SettleArgv};
use super::{corrupt, ms, unavailable, RedisBackend};
use crate::backend::{
    truncate_payload, BackendError, Hold, ProcessCommit, ProcessRefusal, ProcessStore,
    ProcessWrite, Settle, WorkItem,
};
use crate::model::tally::TallyOpen;

/// How long a claim of a correlation entry in another slot than its
/// instance's counts as in flight (see `CLAIM_ENTRY`): far longer than the
/// commit that follows it takes, short enough that a claim whose commit
/// never came stops blocking the value soon.
const CLAIM_IN_FLIGHT: Duration = Duration::from_secs(30);

/// Where a process-manager write lives: the partition of its instance
/// (else of the message it settles), and which of the keys it touches are
/// in that partition's slot. In the compact layout every key is.
struct Placement {
    home: u16,
    slot: Option<u16>,
}

impl Placement {
    fn local(&self, key: &str) -> bool {
        self.slot.is_none_or(|s| slot(key) == s)
    }
}

/// The process commit script's refusal as the write's answer.
fn commit_refused(
    refused: Refused,
    instance: &str,
    tallies: &[TallyOpen],
    endpoints: &[(String, String)],
) -> Result<ProcessRefusal, BackendError> {
    Ok(match refused.refusal {
        RefusalCode::EndpointFull => {
            let n = refused.detail.and_then(|n| n.parse::<usize>().ok());
            match endpoints.get(n.unwrap_or(1).saturating_sub(1)) {
                Some((endpoint, _)) => ProcessRefusal::EndpointFull {
                    endpoint: endpoint.clone(),
                },
                None => return Err(corrupt("the process commit script named no endpoint")),
            }
        }
        RefusalCode::TallyExists => {
            let n = refused.detail.and_then(|n| n.parse::<usize>().ok());
            match tallies.get(n.unwrap_or(1).saturating_sub(1)) {
                Some(open) => ProcessRefusal::TallyExists(open.tally.clone()),
                None => return Err(corrupt("the process commit script named no tally")),
            }
        }
        RefusalCode::Tombstoned => ProcessRefusal::Tombstoned {
            instance: instance.to_owned(),
        },
        _ => ProcessRefusal::Conflict,
    })
}

impl RedisBackend {
    /// The keys of the messages held for `value` of `field` (`""`: an
    /// instance id), in the value's partition.
    fn held_keys(&self, process: &str, field: &str, value: &str) -> HeldKeys {
        let k = self.keys();
        HeldKeys {
            list: k.held(process, field, value, ""),
            payloads: k.held(process, field, value, ":p"),
            schedule: k.scheduled(k.pm_k(process, value)),
            queue: k.queue(k.process_route(process, value)),
        }
    }

    /// Holds a message for its instance (see [`Hold`]): one script in the
    /// value's partition, with the delivery it settles (a message read
    /// elsewhere is moved there first: `Elsewhere` hands it back for
    /// that).
    async fn hold_message(
        &self,
        process: &str,
        hold: Hold<'_>,
        settle: Settle<'_>,
    ) -> Result<ProcessWrite, BackendError> {
        let k = self.keys();
        let field = hold.field.unwrap_or_default();
        let held = self.held_keys(process, field, hold.value);
        let settle = match settle {
            Settle::Ack(d) => {
                let (p, entry) = self.process_entry_of(d)?;
                Some((k.queue(p), entry))
            }
            Settle::Nothing => None,
            _ => return Err(corrupt("a hold settles its delivery by acknowledging it")),
        };
        if let Some((queue, _)) = &settle {
            if k.spread() && slot(queue) != slot(&held.list) {
                return Ok(Err(ProcessRefusal::Elsewhere {
                    instance: String::new(),
                }));
            }
        }
        let (owner, tombstone) = match hold.field {
            None => (
                k.instance(process, hold.value),
                k.tombstone(process, hold.value),
            ),
            Some(f) => (
                k.correlation(process, f, hold.value),
                k.correlation_tombstone(process, f, hold.value),
            ),
        };
        let call = s::ProcessHold {
            owner,
            tombstone,
            held,
            settle: settle
                .as_ref()
                .map(|(q, e)| (q.clone(), e.as_str(), self.group())),
            message_id: &hold.envelope.message_id,
            payload: WorkItem::Process(hold.envelope.clone()).encode(),
            until_ms: hold.envelope.hold_until.unwrap_or_default(),
            cap: hold.cap,
        };
        Ok(match self.call(&call).await? {
            Ok(Holding::Held | Holding::Already) => Ok(0),
            Err(refused) => Err(match refused.refusal {
                RefusalCode::Tombstoned => ProcessRefusal::Tombstoned {
                    instance: hold.value.to_owned(),
                },
                RefusalCode::HoldFull => ProcessRefusal::HoldFull {
                    held: refused
                        .detail
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(hold.cap),
                },
                // An entry whose owner no longer holds it (spread layout:
                // a release lost) is cleared, and the hold judged again.
                RefusalCode::Taken => {
                    if let (Some(f), Some(owner)) = (hold.field, refused.detail) {
                        self.clear_stale_entry(process, f, hold.value, &owner)
                            .await?;
                    }
                    ProcessRefusal::Conflict
                }
                _ => ProcessRefusal::Conflict,
            }),
        })
    }

    /// Whether instance `id` of `process` holds `(field, value)`.
    async fn holds(
        &self,
        process: &str,
        id: &str,
        field: &str,
        value: &str,
    ) -> Result<bool, BackendError> {
        Ok(self
            .process_load(process, id)
            .await?
            .is_some_and(|i| i.keys.iter().any(|(f, v)| f == field && v == value)))
    }

    /// Deletes correlation entry `(field, value)` if `owner` holds it but
    /// no longer claims it (spread layout: an entry claimed from another
    /// slot whose instance's commit failed, or whose release was lost),
    /// and no claim of it is in flight. `true` if deleted.
    async fn clear_stale_entry(
        &self,
        process: &str,
        field: &str,
        value: &str,
        owner: &str,
    ) -> Result<bool, BackendError> {
        let k = self.keys();
        let in_flight: bool = redis::cmd("EXISTS")
            .arg(k.correlation_claim(process, field, value))
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if in_flight || self.holds(process, owner, field, value).await? {
            return Ok(false);
        }
        let swapped = self
            .call(&s::SwapEntry {
                entry: k.correlation(process, field, value),
                expected: owner,
                owner: None,
            })
            .await?;
        if swapped {
            tracing::warn!(
                process,
                field,
                value,
                owner,
                "correlation entry whose instance does not hold it cleared"
            );
        }
        Ok(swapped)
    }

    /// Where `commit` lives (see [`Placement`]); refuses one whose message
    /// is in another partition than its instance: the worker forwards it
    /// first (it found the instance by another value than the one the
    /// message was routed by, and handing it back lets it do so).
    fn placement(
        &self,
        process: &str,
        commit: &ProcessCommit<'_>,
    ) -> Result<Result<Placement, ProcessRefusal>, BackendError> {
        let k = self.keys();
        let settled = match commit.settle {
            Settle::Ack(d) | Settle::DeadLetter(d, _) => Some(self.process_entry_of(d)?.0),
            _ => None,
        };
        let home = match (commit.instance, settled) {
            (Some(i), _) => k.pm_k(process, &i.id),
            (None, Some(p)) => k.pm_partition_of(p).unwrap_or(0),
            (None, None) => commit
                .enqueue
                .first()
                .and_then(|e| k.pm_partition_of(k.envelope_stream(e)))
                .unwrap_or(0),
        };
        let placement = Placement {
            home,
            slot: k.spread().then(|| slot(&k.pm_part(home))),
        };
        let deliveries = settled.into_iter().chain(
            commit
                .batched
                .iter()
                .filter_map(|b| self.process_entry_of(b.delivery).ok().map(|(p, _)| p)),
        );
        for p in deliveries {
            if !placement.local(&k.queue(p)) {
                return Ok(Err(ProcessRefusal::Elsewhere {
                    instance: commit.instance.map(|i| i.id.clone()).unwrap_or_default(),
                }));
            }
        }
        Ok(Ok(placement))
    }

    /// Before the commit (spread layout): claims the correlation entries,
    /// joins the shared ones, and (deleting) writes the tombstones that
    /// live in other slots than the instance. Returns the entries it
    /// claimed that were not the instance's already.
    async fn commit_remote_first(
        &self,
        process: &str,
        commit: &ProcessCommit<'_>,
        placement: &Placement,
    ) -> Result<Result<Vec<(String, String)>, ProcessRefusal>, BackendError> {
        let k = self.keys();
        let mut newly = Vec::new();
        let Some(instance) = commit.instance else {
            return Ok(Ok(newly));
        };
        let id = instance.id.as_str();
        let conflict = || Ok(Err(ProcessRefusal::Conflict));
        let handled: Vec<&str> = commit.handled_ids().collect();
        if !commit.delete {
            for (field, value) in &commit.add_keys {
                if placement.local(&k.correlation(process, field, value)) {
                    continue;
                }
                let claim = s::ClaimEntry {
                    entry: k.correlation(process, field, value),
                    tombstone: k.correlation_tombstone(process, field, value),
                    marker: k.correlation_claim(process, field, value),
                    id,
                    handled: &handled,
                    in_flight_ms: ms(CLAIM_IN_FLIGHT),
                };
                let mut claimed = false;
                for _ in 0..2 {
                    match self.call(&claim).await? {
                        Ok(EntryClaim::Claimed) => {
                            newly.push((field.clone(), value.clone()));
                            claimed = true;
                            break;
                        }
                        Ok(EntryClaim::Held) => {
                            claimed = true;
                            break;
                        }
                        Err(refused) if refused.refusal == RefusalCode::Tombstoned => {
                            self.unclaim(process, commit, &newly).await;
                            return Ok(Err(ProcessRefusal::Tombstoned {
                                instance: id.to_owned(),
                            }));
                        }
                        // Taken by another instance: unless its owner no
                        // longer holds it (then cleared, and claimed again).
                        Err(refused) => {
                            let owner = refused.detail.unwrap_or_default();
                            if !self
                                .clear_stale_entry(process, field, value, &owner)
                                .await?
                            {
                                self.unclaim(process, commit, &newly).await;
                                return conflict();
                            }
                        }
                    }
                }
                if !claimed {
                    self.unclaim(process, commit, &newly).await;
                    return conflict();
                }
            }
        }
        let mut cmds = Vec::new();
        for (field, value) in &commit.add_shared {
            let key = k.shared_correlation(process, field, value);
            if !placement.local(&key) {
                cmds.push(redis::cmd("SADD").arg(key).arg(id).clone());
            }
        }
        self.query_each(cmds).await?;
        if commit.delete {
            let handled = instance.handled();
            if !handled.is_empty() {
                for (field, value) in &commit.remove_keys {
                    let tomb = k.correlation_tombstone(process, field, value);
                    if placement.local(&tomb) {
                        continue;
                    }
                    self.call(&s::Remember {
                        set: tomb,
                        ttl_ms: ms(commit.tombstone_ttl),
                        members: &handled,
                    })
                    .await?;
                }
            }
        }
        Ok(Ok(newly))
    }

    /// Gives up correlation entries a write claimed before its commit,
    /// which then failed. Best effort: one left behind is taken for stale
    /// once its claim is no longer in flight.
    async fn unclaim(
        &self,
        process: &str,
        commit: &ProcessCommit<'_>,
        claimed: &[(String, String)],
    ) {
        let (Some(instance), k) = (commit.instance, self.keys()) else {
            return;
        };
        for (field, value) in claimed {
            let released = self
                .call(&s::SwapEntry {
                    entry: k.correlation(process, field, value),
                    expected: &instance.id,
                    owner: None,
                })
                .await;
            let cleared: Result<i64, _> = redis::cmd("DEL")
                .arg(k.correlation_claim(process, field, value))
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable);
            if let Err(error) = released.and(cleared) {
                tracing::debug!(%error, process, field, value, "giving up a claim failed; it lapses on its own");
            }
        }
    }

    /// After the commit (spread layout): releases the correlation entries
    /// and leaves the shared ones that live in other slots. Best effort:
    /// an entry left behind names an instance that no longer holds it,
    /// which lookups check and claims clear.
    async fn commit_remote_after(
        &self,
        process: &str,
        commit: &ProcessCommit<'_>,
        placement: &Placement,
    ) {
        let k = self.keys();
        let Some(instance) = commit.instance else {
            return;
        };
        let id = instance.id.as_str();
        if !commit.delete {
            for (field, value) in &commit.add_keys {
                if placement.local(&k.correlation(process, field, value)) {
                    continue;
                }
                let held = self.held_keys(process, field, value);
                if let Err(error) = self.call(&s::ReleaseHeld { held: &held }).await {
                    tracing::warn!(%error, process, field, value, "releasing the messages held for a value failed; they come when their hold ends");
                }
            }
        }
        for (field, value) in &commit.remove_keys {
            let key = k.correlation(process, field, value);
            if placement.local(&key) {
                continue;
            }
            // A later write of the instance (another process's) may hold
            // the value again by now: then the entry is its.
            if !commit.delete && self.holds(process, id, field, value).await.unwrap_or(true) {
                continue;
            }
            let released = self
                .call(&s::SwapEntry {
                    entry: key,
                    expected: id,
                    owner: None,
                })
                .await;
            if let Err(error) = released {
                tracing::warn!(%error, process, field, value, "releasing a correlation entry failed; lookups see it is stale");
            }
        }
        let cmds: Vec<redis::Cmd> = commit
            .remove_shared
            .iter()
            .map(|(field, value)| k.shared_correlation(process, field, value))
            .filter(|key| !placement.local(key))
            .map(|key| redis::cmd("SREM").arg(key).arg(id).clone())
            .collect();
        if let Err(error) = self.query_each(cmds).await {
            tracing::warn!(%error, process, "leaving shared correlation entries failed; fan-outs skip instances that left");
        }
    }

    /// After a conflict on a correlation entry in the commit's own slot
    /// (spread layout): clears those of the entries it claims whose owner
    /// was stale, so that the next attempt can succeed.
    async fn clear_stale_local_claims(
        &self,
        process: &str,
        commit: &ProcessCommit<'_>,
        placement: &Placement,
    ) -> Result<(), BackendError> {
        let k = self.keys();
        let Some(instance) = commit.instance else {
            return Ok(());
        };
        for (field, value) in &commit.add_keys {
            let key = k.correlation(process, field, value);
            if !placement.local(&key) {
                continue;
            }
            let owner: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            if let Some(owner) = owner.filter(|o| *o != instance.id) {
                self.clear_stale_entry(process, field, value, &owner)
                    .await?;
            }
        }
        Ok(())
    }

    /// The commit's script: everything in the slot of its partition (in
    /// the compact layout, everything). Messages for endpoints in other
    /// slots are relayed right after it.
    async fn commit_here(
        &self,
        process: &str,
        commit: &ProcessCommit<'_>,
        placement: &Placement,
    ) -> Result<ProcessWrite, BackendError> {
        let call = self.commit_call(process, commit, placement)?;
        let committed = match self.call(&call).await? {
            Ok(committed) => committed,
            Err(refused) => {
                let refused = commit_refused(refused, &call.id, &commit.tallies, &commit.endpoints);
                return Ok(Err(refused?));
            }
        };
        // Messages for endpoints in other slots: relayed now, so that they
        // are there when the commit returns; the entries left on the
        // partition's relay stream are the fallback should this process
        // die first (housekeeping relays them).
        let relay_stream = self.keys().relays(placement.home);
        let relayed = call
            .endpoints
            .iter()
            .filter_map(|e| e.relay_to.as_ref().map(|to| (to, &e.payload)));
        for ((endpoint, payload), entry) in relayed.zip(&committed.relayed) {
            self.relay_now(&relay_stream, endpoint, payload, entry)
                .await;
        }
        Ok(Ok(committed.version))
    }

    /// The call of [`commit_here`](Self::commit_here).
    fn commit_call<'a>(
        &'a self,
        process: &str,
        commit: &ProcessCommit<'a>,
        placement: &Placement,
    ) -> Result<s::ProcessCommit<'a>, BackendError> {
        let k = self.keys();
        let home = placement.home;
        let limit = self.shared.config.dead_letter_payload_limit;
        let (pm, settle) = match commit.settle {
            Settle::Nothing => (k.process_partition(home), SettleArgv::Keep),
            Settle::Ack(d) => {
                let (pm, entry) = self.process_entry_of(d)?;
                (pm, SettleArgv::Ack { entry })
            }
            Settle::DeadLetter(d, reason) => {
                let (payload, size) = truncate_payload(&d.raw, limit);
                let (pm, entry) = self.process_entry_of(d)?;
                let dead = SettleArgv::Dead {
                    entry,
                    payload,
                    reason,
                    size,
                };
                (pm, dead)
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
        // The correlation entries of the partition's slot (the others
        // were claimed before, and are released after: see `placement`).
        let here = |keys: &'_ [(String, String)], key: &dyn Fn(&str, &str) -> String| {
            keys.iter()
                .filter(|(f, v)| placement.local(&key(f, v)))
                .cloned()
                .collect::<Vec<_>>()
        };
        let entry_key = |f: &str, v: &str| k.correlation(process, f, v);
        let shared_key = |f: &str, v: &str| k.shared_correlation(process, f, v);
        let correlations = |keys: &[(String, String)]| {
            here(keys, &entry_key)
                .iter()
                .map(|(field, value)| s::Correlation {
                    entry: k.correlation(process, field, value),
                    tombstone: k.correlation_tombstone(process, field, value),
                })
                .collect()
        };
        let shared = |keys: &[(String, String)]| {
            here(keys, &shared_key)
                .iter()
                .map(|(field, value)| k.shared_correlation(process, field, value))
                .collect()
        };
        // Keys a settle-only write does not touch, named in its slot all
        // the same (a cluster routes a script by its first key, and refuses
        // one whose keys span slots).
        let (instance_key, tombstone_key) = match commit.instance {
            Some(_) => (k.instance(process, &id), k.tombstone(process, &id)),
            None => (k.pm_unused(home, "inst"), k.pm_unused(home, "tomb")),
        };
        // The home partition's queue, where a message for another slot
        // goes to be forwarded (spread layout).
        let home_queue = k.queue(k.process_partition(home));
        let in_slot = |queue: String| match placement.local(&queue) {
            true => queue,
            false => home_queue.clone(),
        };
        // The messages held for what the write creates or claims here (the
        // entries claimed from other slots release theirs after it).
        let mut release_held = Vec::new();
        if let Some(i) = commit.instance.filter(|_| !commit.delete) {
            if i.version == 0 {
                release_held.push(self.held_keys(process, "", &i.id));
            }
            for (field, value) in &commit.add_keys {
                if placement.local(&k.correlation(process, field, value)) {
                    release_held.push(self.held_keys(process, field, value));
                }
            }
        }
        let mut batched = Vec::new();
        for b in &commit.batched {
            let (p, entry) = self.process_entry_of(b.delivery)?;
            batched.push(s::BatchedMessage {
                message_id: b.message_id.to_owned(),
                queue: k.queue(p),
                entry,
            });
        }
        Ok(s::ProcessCommit {
            instance: instance_key,
            instances: k.instances(process, home),
            queue: k.queue(pm),
            dead: k.dead(pm),
            schedule: k.scheduled(home),
            claim: correlations(&commit.add_keys),
            release: correlations(&commit.remove_keys),
            endpoints: self.commit_endpoints(commit, placement),
            tombstone: tombstone_key,
            tallies: self.opened_tallies(commit, &in_slot)?,
            open_tallies: k.open_tallies(home),
            join_shared: shared(&commit.add_shared),
            leave_shared: shared(&commit.remove_shared),
            members: (!k.spread()).then(|| k.partition_members()),
            has_instance: commit.instance.is_some(),
            version,
            doc,
            id,
            delete: commit.delete,
            generation: commit.instance.map_or("", |i| i.generation.as_str()),
            settle,
            group: self.group(),
            dead_cap: self.dead_letters_ceiling(),
            endpoint_cap: (self.shared.config.endpoint_max_len as u64).min(super::MAXLEN_LIMIT),
            handling: commit.handling,
            tombstone_ttl_ms: ms(commit.tombstone_ttl),
            deleted_handled: match (commit.delete, commit.instance) {
                (true, Some(i)) => i.handled(),
                _ => Vec::new(),
            },
            batched,
            enqueue: commit
                .enqueue
                .iter()
                .map(|e| {
                    let queue = in_slot(k.queue(k.envelope_stream(e)));
                    (queue, WorkItem::Process(e.clone()).encode())
                })
                .collect(),
            timeouts: commit
                .schedule
                .iter()
                .map(|(due, e)| (*due, WorkItem::Process(e.clone()).encode()))
                .collect(),
            release_held,
        })
    }

    /// The messages of a commit for endpoints: written to the endpoint's
    /// stream when it is in the commit's slot, else to the partition's
    /// relay stream, to be relayed.
    fn commit_endpoints(
        &self,
        commit: &ProcessCommit<'_>,
        placement: &Placement,
    ) -> Vec<s::EndpointMessage> {
        let k = self.keys();
        commit
            .endpoints
            .iter()
            .map(|(endpoint, payload)| {
                let stream = k.endpoint(endpoint);
                let (stream, relay_to) = match placement.local(&stream) {
                    true => (stream, None),
                    false => (k.relays(placement.home), Some(stream)),
                };
                s::EndpointMessage {
                    stream,
                    relay_to,
                    payload: payload.clone(),
                }
            })
            .collect()
    }

    /// The tallies a commit opens; `in_slot` is the queue a completion
    /// goes to, in the commit's slot.
    fn opened_tallies(
        &self,
        commit: &ProcessCommit<'_>,
        in_slot: &dyn Fn(String) -> String,
    ) -> Result<Vec<s::OpenTally>, BackendError> {
        let k = self.keys();
        commit
            .tallies
            .iter()
            .map(|open| {
                Ok(s::OpenTally {
                    hash: k.tally(&open.tally, ""),
                    pending: k.tally(&open.tally, ":pending"),
                    checked: k.tally(&open.tally, ":checked"),
                    keep_ms: ms(open.keep_for).max(1),
                    completion: WorkItem::Process(open.completion.clone()).encode(),
                    completion_late: WorkItem::Process(open.completion_late.clone()).encode(),
                    completion_queue: in_slot(k.queue(k.envelope_stream(&open.completion))),
                    items: open.items.clone(),
                    member: super::tally::member(&open.tally)?,
                })
            })
            .collect()
    }

    /// Writes `commit` (see [`ProcessStore::process_commit`](crate::backend::ProcessStore::process_commit)).
    pub(super) async fn commit_process(
        &self,
        process: &str,
        commit: ProcessCommit<'_>,
    ) -> Result<ProcessWrite, BackendError> {
        if let Some(hold) = commit.hold {
            return self.hold_message(process, hold, commit.settle).await;
        }
        let placement = match self.placement(process, &commit)? {
            Ok(placement) => placement,
            Err(refused) => return Ok(Err(refused)),
        };
        let spread = self.keys().spread();
        let claimed = match spread {
            true => match self
                .commit_remote_first(process, &commit, &placement)
                .await?
            {
                Ok(claimed) => claimed,
                Err(refused) => return Ok(Err(refused)),
            },
            false => Vec::new(),
        };
        let committed = self.commit_here(process, &commit, &placement).await;
        match &committed {
            Ok(Ok(_)) if spread => self.commit_remote_after(process, &commit, &placement).await,
            Ok(Err(_)) | Err(_) if spread => {
                // The claims this write made go with it (else they would
                // keep the values from others until taken for stale).
                self.unclaim(process, &commit, &claimed).await;
                if matches!(committed, Ok(Err(ProcessRefusal::Conflict))) {
                    self.clear_stale_local_claims(process, &commit, &placement)
                        .await?;
                }
            }
            _ => {}
        }
        committed
    }
}
