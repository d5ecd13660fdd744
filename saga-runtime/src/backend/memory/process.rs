//! Process-manager instances, correlation entries, tombstones and timeouts.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::tally::MemTally;
use super::{MemoryBackend, State};
use crate::backend::{
    BackendError, ProcessCommit, ProcessInstance, ProcessRefusal, ProcessStore, ProcessWrite,
    Settle, WorkItem,
};
use crate::model::envelope::Envelope;
use crate::model::task::Timestamp;

/// Whether `envelope`, a scheduled one, is a message held for what
/// `(field, value)` names (an instance id when `field` is `None`).
fn held_for(envelope: &Envelope, process: &str, field: Option<&str>, value: &str) -> bool {
    envelope.hold_until.is_some()
        && envelope.process == process
        && envelope.instance_id.is_none()
        && envelope.key.as_deref() == Some(value)
        && envelope.key_field.as_deref() == field
}

/// Where a deleted instance's handled message ids are remembered: under its
/// id, and under each correlation entry it released.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) enum Tombstone {
    Instance(String, String),
    Correlation(String, String, String),
}

#[async_trait]
impl ProcessStore for MemoryBackend {
    async fn process_load(
        &self,
        process: &str,
        id: &str,
    ) -> Result<Option<ProcessInstance>, BackendError> {
        Ok(self
            .state()
            .instances
            .get(&(process.to_owned(), id.to_owned()))
            .cloned())
    }

    async fn process_find(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Option<ProcessInstance>, BackendError> {
        let state = self.state();
        let key = (process.to_owned(), field.to_owned(), value.to_owned());
        Ok(state
            .index
            .get(&key)
            .and_then(|id| state.instances.get(&(process.to_owned(), id.clone())))
            .cloned())
    }

    async fn process_find_shared(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Vec<String>, BackendError> {
        let key = (process.to_owned(), field.to_owned(), value.to_owned());
        let mut ids: Vec<String> = self
            .state()
            .shared
            .get(&key)
            .map(|ids| ids.iter().cloned().collect())
            .unwrap_or_default();
        ids.sort();
        Ok(ids)
    }

    async fn process_count(&self, process: &str) -> Result<usize, BackendError> {
        let state = self.state();
        Ok(state
            .instances
            .values()
            .filter(|i| i.process == process)
            .count())
    }

    async fn process_list(&self, process: &str) -> Result<Vec<ProcessInstance>, BackendError> {
        let state = self.state();
        let mut list: Vec<_> = state
            .instances
            .values()
            .filter(|i| i.process == process)
            .cloned()
            .collect();
        list.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(list)
    }

    async fn process_commit(
        &self,
        process: &str,
        commit: ProcessCommit<'_>,
    ) -> Result<ProcessWrite, BackendError> {
        let version = {
            let mut state = self.state();
            let now = Instant::now();
            state.tallies.retain(|_, t| t.expires > now);
            let mut version = 0;
            // Refused when an endpoint cannot take all it is sent.
            let sending = |e: &String| commit.endpoints.iter().filter(|(o, _)| o == e).count();
            if let Some((endpoint, _)) = commit.endpoints.iter().find(|(e, _)| {
                let cap = state.endpoint_cap;
                state
                    .endpoints
                    .get(e)
                    .is_some_and(|stream| stream.full(cap, sending(e)))
            }) {
                let endpoint = endpoint.clone();
                return Ok(Err(ProcessRefusal::EndpointFull { endpoint }));
            }
            if let Some(hold) = commit.hold {
                if let Err(refused) = state.hold(process, hold, commit.handling) {
                    return Ok(Err(refused));
                }
            }
            if let Some(instance) = commit.instance {
                // Every check before the first write, as a script would.
                if let Err(refused) = state.refusal(process, instance, &commit) {
                    return Ok(Err(refused));
                }
                state.release_keys(process, instance, &commit.remove_keys);
                match commit.delete {
                    true => state.delete_instance(process, instance, &commit, now),
                    false => {
                        state.release_held(process, instance, &commit);
                        version = state.save_instance(process, instance, &commit);
                    }
                }
            }
            state.apply_effects(commit, now, self.shared.payload_limit);
            version
        };
        self.queue_changed();
        Ok(Ok(version))
    }

    async fn process_release_due(&self, now_ms: u64, limit: usize) -> Result<usize, BackendError> {
        let moved = {
            let mut state = self.state();
            let due = state
                .scheduled
                .iter()
                .take_while(|(at, _)| *at <= now_ms)
                .count()
                .min(limit);
            let released: Vec<(u64, Envelope)> = state.scheduled.drain(..due).collect();
            for (_, envelope) in released.iter() {
                if envelope.hold_until.is_some() {
                    let held = (envelope.process.clone(), envelope.message_id.clone());
                    state.held_order.remove(&held);
                }
                state.push_item(&WorkItem::Process(envelope.clone()), Duration::ZERO);
            }
            released.len()
        };
        if moved > 0 {
            self.queue_changed();
        }
        Ok(moved)
    }

    async fn process_scheduled(&self) -> Result<Vec<(u64, Envelope)>, BackendError> {
        Ok(self.state().scheduled.clone())
    }
}

/// The steps of a process-manager commit, each on the store's state under
/// its lock: the checks that refuse it, then the writes.
impl State {
    /// Why the write of `instance` must be refused, if it must: another
    /// version or generation stored, a tally it opens exists, a message it
    /// handles is remembered by a tombstone, or an entry it claims is
    /// owned by another instance.
    fn refusal(
        &self,
        process: &str,
        instance: &ProcessInstance,
        commit: &ProcessCommit<'_>,
    ) -> Result<(), ProcessRefusal> {
        let key = (process.to_owned(), instance.id.clone());
        let stored = self.instances.get(&key).map_or(0, |i| i.version);
        let conflict = || ProcessRefusal::Conflict;
        // The same version of another generation: deleted and created
        // again since it was read.
        let regenerated = self.instances.get(&key).is_some_and(|i| {
            !i.generation.is_empty()
                && !instance.generation.is_empty()
                && i.generation != instance.generation
        });
        if stored != instance.version || regenerated {
            return Err(conflict());
        }
        // After the version: a handler that lost a race to the writer that
        // opened the tally runs again instead.
        if let Some(open) = commit
            .tallies
            .iter()
            .find(|o| self.tallies.contains_key(&o.tally))
        {
            return Err(ProcessRefusal::TallyExists(open.tally.clone()));
        }
        if !commit.delete && self.tombstoned(process, instance, commit) {
            return Err(ProcessRefusal::Tombstoned {
                instance: instance.id.clone(),
            });
        }
        for (field, value) in &commit.add_keys {
            let ikey = (process.to_owned(), field.clone(), value.clone());
            if matches!(self.index.get(&ikey), Some(owner) if *owner != instance.id) {
                return Err(conflict());
            }
        }
        Ok(())
    }

    /// Whether a tombstone of the instance's id, or of an entry it claims,
    /// remembers a message the write handles: a late duplicate.
    fn tombstoned(
        &self,
        process: &str,
        instance: &ProcessInstance,
        commit: &ProcessCommit<'_>,
    ) -> bool {
        let now = Instant::now();
        commit.handled_ids().any(|message| {
            let remembers = |t: Tombstone| {
                self.tombstones
                    .get(&t)
                    .is_some_and(|(ids, until)| *until > now && ids.contains(message))
            };
            remembers(Tombstone::Instance(process.to_owned(), instance.id.clone()))
                || commit.add_keys.iter().any(|(f, v)| {
                    remembers(Tombstone::Correlation(
                        process.to_owned(),
                        f.clone(),
                        v.clone(),
                    ))
                })
        })
    }

    /// Keeps a message until its instance exists (see
    /// [`Hold`](crate::backend::Hold)): refused if one owns what it looks
    /// for, a tombstone there remembers it, or the value holds its cap;
    /// held once per message id. `handling` is its message id.
    fn hold(
        &mut self,
        process: &str,
        hold: crate::backend::Hold<'_>,
        handling: Option<&str>,
    ) -> Result<(), ProcessRefusal> {
        let (field, value) = (hold.field, hold.value);
        let owned = match field {
            None => self
                .instances
                .contains_key(&(process.to_owned(), value.to_owned())),
            Some(f) => {
                self.index
                    .contains_key(&(process.to_owned(), f.to_owned(), value.to_owned()))
            }
        };
        if owned {
            return Err(ProcessRefusal::Conflict);
        }
        let now = Instant::now();
        let place = match field {
            None => Tombstone::Instance(process.to_owned(), value.to_owned()),
            Some(f) => Tombstone::Correlation(process.to_owned(), f.to_owned(), value.to_owned()),
        };
        let message = hold.envelope.message_id.as_str();
        let remembered = self.tombstones.get(&place).is_some_and(|(ids, until)| {
            *until > now && (ids.contains(message) || handling.is_some_and(|h| ids.contains(h)))
        });
        if remembered {
            return Err(ProcessRefusal::Tombstoned {
                instance: value.to_owned(),
            });
        }
        let held: Vec<&Envelope> = self
            .scheduled
            .iter()
            .map(|(_, e)| e)
            .filter(|e| held_for(e, process, field, value))
            .collect();
        if held.iter().any(|e| e.message_id == message) {
            return Ok(());
        }
        if held.len() >= hold.cap {
            return Err(ProcessRefusal::HoldFull { held: held.len() });
        }
        let until = hold.envelope.hold_until.unwrap_or(0);
        self.held_seq += 1;
        let order = (process.to_owned(), hold.envelope.message_id.clone());
        self.held_order.insert(order, self.held_seq);
        self.scheduled.push((until, hold.envelope.clone()));
        self.scheduled.sort_by_key(|(due, _)| *due);
        Ok(())
    }

    /// Moves the messages held for `instance` onto the queue, in the
    /// order they were held: those held under its id if the write
    /// creates it, and under each entry it claims.
    fn release_held(
        &mut self,
        process: &str,
        instance: &ProcessInstance,
        commit: &ProcessCommit<'_>,
    ) {
        let created = !self
            .instances
            .contains_key(&(process.to_owned(), instance.id.clone()));
        let wanted = |e: &Envelope| {
            (created && held_for(e, process, None, &instance.id))
                || commit
                    .add_keys
                    .iter()
                    .any(|(f, v)| held_for(e, process, Some(f), v))
        };
        let (mut released, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.scheduled)
            .into_iter()
            .partition(|(_, e)| wanted(e));
        self.scheduled = kept;
        let order = |e: &Envelope| (e.process.clone(), e.message_id.clone());
        let held = &self.held_order;
        released.sort_by_key(|(_, e)| held.get(&order(e)).copied().unwrap_or(0));
        for (_, envelope) in released {
            self.held_order.remove(&order(&envelope));
            self.push_item(&WorkItem::Process(envelope), Duration::ZERO);
        }
    }

    /// Releases the correlation entries the instance still owns.
    fn release_keys(
        &mut self,
        process: &str,
        instance: &ProcessInstance,
        remove: &[(String, String)],
    ) {
        for (field, value) in remove {
            let ikey = (process.to_owned(), field.clone(), value.clone());
            if self.index.get(&ikey) == Some(&instance.id) {
                self.index.remove(&ikey);
            }
        }
    }

    /// Deletes the instance and every entry it owns, leaving tombstones
    /// under its id and its released entries that remember what it
    /// handled.
    fn delete_instance(
        &mut self,
        process: &str,
        instance: &ProcessInstance,
        commit: &ProcessCommit<'_>,
        now: Instant,
    ) {
        let until = now + commit.tombstone_ttl;
        self.tombstones.retain(|_, (_, until)| *until > now);
        let ids: HashSet<String> = instance.handled().into_iter().collect();
        let places = std::iter::once(Tombstone::Instance(process.to_owned(), instance.id.clone()))
            .chain(
                commit
                    .remove_keys
                    .iter()
                    .map(|(f, v)| Tombstone::Correlation(process.to_owned(), f.clone(), v.clone())),
            );
        for place in places {
            let (known, expiry) = self
                .tombstones
                .entry(place)
                .or_insert_with(|| (HashSet::new(), until));
            known.extend(ids.iter().cloned());
            *expiry = until;
        }
        self.instances
            .remove(&(process.to_owned(), instance.id.clone()));
        let id = &instance.id;
        self.index
            .retain(|(p, _, _), owner| !(p == process && owner == id));
        self.shared.retain(|(p, _, _), ids| {
            if p == process {
                ids.remove(id);
            }
            !ids.is_empty()
        });
    }

    /// Stores the instance under the next version with the entries it
    /// claims and the shared entries it joins or leaves; returns the
    /// version.
    fn save_instance(
        &mut self,
        process: &str,
        instance: &ProcessInstance,
        commit: &ProcessCommit<'_>,
    ) -> u64 {
        for (field, value) in &commit.add_keys {
            self.index.insert(
                (process.to_owned(), field.clone(), value.clone()),
                instance.id.clone(),
            );
        }
        for (field, value) in &commit.add_shared {
            self.shared
                .entry((process.to_owned(), field.clone(), value.clone()))
                .or_default()
                .insert(instance.id.clone());
        }
        for (field, value) in &commit.remove_shared {
            let k = (process.to_owned(), field.clone(), value.clone());
            if let Some(ids) = self.shared.get_mut(&k) {
                ids.remove(&instance.id);
                if ids.is_empty() {
                    self.shared.remove(&k);
                }
            }
        }
        let mut stored = instance.clone();
        stored.version += 1;
        stored.updated_at = Timestamp::now();
        let version = stored.version;
        self.instances
            .insert((process.to_owned(), instance.id.clone()), stored);
        version
    }

    /// What the write sends and settles: messages enqueued, scheduled and
    /// sent to endpoints, tallies opened, the message handled and those
    /// batched with it acknowledged.
    fn apply_effects(&mut self, commit: ProcessCommit<'_>, now: Instant, payload_limit: usize) {
        for envelope in &commit.enqueue {
            self.push_item(&WorkItem::Process(envelope.clone()), Duration::ZERO);
        }
        for (endpoint, payload) in &commit.endpoints {
            let cap = self.endpoint_cap;
            self.endpoints
                .entry(endpoint.clone())
                .or_default()
                .push(payload.clone(), cap);
        }
        self.scheduled.extend(commit.schedule.iter().cloned());
        self.scheduled.sort_by_key(|(due, _)| *due);
        for open in commit.tallies {
            let complete = open.items.is_empty();
            if complete {
                self.push_item(&WorkItem::Process(open.completion.clone()), Duration::ZERO);
            }
            self.tallies.insert(
                open.tally,
                MemTally {
                    pending: open.items.into_iter().collect(),
                    checked: HashSet::new(),
                    complete,
                    deadline_passed: false,
                    completion: open.completion,
                    completion_late: open.completion_late,
                    expires: now + open.keep_for,
                },
            );
        }
        self.settle(commit.settle, None, payload_limit);
        for batched in &commit.batched {
            self.settle(Settle::Ack(batched.delivery), None, payload_limit);
        }
    }
}
