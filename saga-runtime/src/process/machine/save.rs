//! After the handler ran: the instance as it leaves it, and everything its
//! write carries (correlation entries, outgoing messages, timeouts,
//! tallies, the acknowledgement).

use super::{
    audit, dead_letter, decided, derived_id, due, fail, sent, Commit, Decision, Dispatched,
    Effects, Given, Handling, Note, Refusal, Settlement, Verdict,
};
use crate::model::endpoint::PUBLISHED;
use crate::model::envelope::{Envelope, EnvelopeKind};
use crate::model::process::{InstanceStatus, ProcessAuditAction, ProcessInstance};
use crate::process::{
    tally, Correlation, FailureKind, Handled, HandlerKind, OnComplete, ProcessContext,
    ProcessDefinition, ProcessError, Target,
};

/// Message ids remembered per instance to drop exact duplicates.
pub(crate) const PROCESSED_MEMORY: usize = 128;

/// A handler's result, ready to write.
#[derive(Debug, Clone)]
pub(crate) struct Save {
    /// The write: the instance as the handler left it (always there),
    /// with its entries, its outbox and the acknowledgement.
    pub commit: Commit,
    /// Whether the message created the instance.
    pub created: bool,
    /// The instance as it was, for `#[on_error]`, should a tally the
    /// handler opens turn out to exist (`None` for a new instance).
    pub before: Option<ProcessInstance>,
    /// How many messages that waited for the instance [joined](Save::join)
    /// the write.
    pub batched: usize,
}

impl Handling<'_> {
    /// Turns the handler's run on `instance` (what it returned, and what
    /// it asked of `ctx`) into the write to make. A payload that does not
    /// deserialize is parked (no retry would change it); any other error
    /// is `#[on_error]`'s.
    pub(crate) fn ran(
        &self,
        instance: ProcessInstance,
        ctx: &ProcessContext,
        result: Result<Handled, ProcessError>,
        given: &Given<'_>,
    ) -> Result<Save, Verdict> {
        let created = instance.version == 0;
        let handled = match result {
            Ok(handled) => handled,
            Err(e) if e.is_invalid_payload() => return Err(decided(dead_letter(e.to_string()))),
            Err(e) => {
                let existing = (!created).then_some(instance);
                return Err(fail(existing, FailureKind::Handler, e.to_string()));
            }
        };
        let before = (!ctx.tallies.is_empty() && !created).then(|| instance.clone());
        let mut instance = instance;
        let effects = effects(self.def, &mut instance, self.envelope, ctx, handled, given);
        Ok(Save {
            commit: Commit {
                instance: Some(instance),
                handling: Some(self.envelope.message_id.clone()),
                tombstone_ttl: given.tombstone_ttl,
                effects,
                hold: None,
                settle: Settlement::Ack,
            },
            created,
            before,
            batched: 0,
        })
    }
}

impl Save {
    /// The instance as written.
    pub(crate) fn instance(&self) -> Option<&ProcessInstance> {
        self.commit.instance.as_ref()
    }

    /// The message's outcome once the write is saved.
    pub(crate) fn outcome(&self) -> Dispatched {
        Dispatched::Handled {
            instance: self.instance().map(|i| i.id.clone()).unwrap_or_default(),
            created: self.created,
        }
    }

    /// Whether messages waiting for the instance may join the write: not
    /// one that deletes it (they would find none) or opens tallies (one
    /// that exists refuses the write, and `#[on_error]` must then hear of
    /// this message alone).
    pub(crate) fn batchable(&self) -> bool {
        !self.commit.effects.delete && self.commit.effects.tallies.is_empty()
    }

    /// Adds the handling of `envelope`, a message that waited for the
    /// instance (see [`joins`]), whose handler ran on the state as this
    /// write leaves it: if its outcome is a plain save that keeps the
    /// instance's correlation entries, its effects join the write and
    /// `true`; else the write is left as it was (the message then goes on
    /// alone, after it, and runs again).
    pub(crate) fn join(
        &mut self,
        def: &ProcessDefinition,
        envelope: &Envelope,
        ctx: &ProcessContext,
        handled: Handled,
        given: &Given<'_>,
    ) -> bool {
        let Commit {
            instance: Some(instance),
            effects: fx,
            ..
        } = &mut self.commit
        else {
            return false;
        };
        if !ctx.tallies.is_empty() {
            return false;
        }
        let mut next = instance.clone();
        let more = effects(def, &mut next, envelope, ctx, handled, given);
        // The same correlation values: the entries this write claims and
        // releases are the first message's (each save also re-joins shared
        // sets and drops legacy entries, the same for every message).
        let plain = !more.delete && next.keys == instance.keys && more.remove_shared.is_empty();
        if !plain {
            return false;
        }
        *instance = next;
        fx.enqueue.extend(more.enqueue);
        fx.endpoints.extend(more.endpoints);
        fx.schedule.extend(more.schedule);
        for entry in more.add_shared {
            if !fx.add_shared.contains(&entry) {
                fx.add_shared.push(entry);
            }
        }
        self.batched += 1;
        true
    }

    /// What the store's refusal of the write means.
    pub(crate) fn refused(self, refusal: Refusal) -> Verdict {
        match refusal {
            // Someone else wrote the instance (or claimed its correlation
            // entry) first: run again on the fresh state.
            Refusal::Conflict => Verdict::Reread,
            // One of the batched messages may be the late duplicate: each
            // goes on its own (the worker hands them back), this one again.
            Refusal::Tombstoned { .. } if self.batched > 0 => Verdict::Reread,
            // A late duplicate of a message a deleted instance with this
            // id (or correlation) handled: it must not start the process
            // again, nor reach the instance created since.
            Refusal::Tombstoned { instance } => {
                let note = Note::DeletedDuplicate {
                    instance: instance.clone(),
                };
                let outcome = Dispatched::Duplicate { instance };
                decided(Decision::new(Commit::settle(Settlement::Ack), outcome).noted(note))
            }
            Refusal::TallyExists { error } => fail(self.before, FailureKind::Handler, error),
            // Not a refusal of a save (only a hold is refused for it): the
            // store answered something else than was asked; read again.
            Refusal::HoldFull => Verdict::Reread,
        }
    }
}

/// Whether `envelope`, waiting in this process behind a handled message of
/// `instance`, may be handled in the same write: it is for this instance
/// (`message_key`: its correlation value, asked only if needed), would
/// run its handler on it (not a duplicate, not for another generation, the
/// instance active) and cannot fail on routing (a strict start). Whether
/// its outcome is a plain save is known only once it ran: see
/// [`Save::join`].
pub(crate) fn joins(
    def: &ProcessDefinition,
    instance: &ProcessInstance,
    envelope: &Envelope,
    message_key: impl FnOnce() -> Option<String>,
) -> bool {
    let fresh = envelope.kind != EnvelopeKind::TallyReport
        && instance.status == InstanceStatus::Active
        && !instance.processed.contains(&envelope.message_id)
        && envelope
            .generation
            .as_ref()
            .is_none_or(|g| instance.generation.is_empty() || instance.generation == *g);
    let Some(handler) = def.handler(&envelope.message_type).filter(|_| fresh) else {
        return false;
    };
    if matches!(handler.kind, HandlerKind::Starts { strict: true }) {
        return false;
    }
    match handler.correlation {
        Correlation::Instance => envelope.instance_id.as_deref() == Some(instance.id.as_str()),
        Correlation::Id => message_key().is_some_and(|k| k == instance.id),
        Correlation::Field { state_field, .. } => {
            !def.is_shared(state_field)
                && message_key().is_some_and(|k| {
                    instance
                        .keys
                        .iter()
                        .any(|(f, v)| f == state_field && *v == k)
                })
        }
    }
}

/// Applies a handler's result (`state`, the correlation values it left,
/// what it asked of `ctx`) to `instance` and returns what the write must
/// carry besides it.
fn effects(
    def: &ProcessDefinition,
    instance: &mut ProcessInstance,
    envelope: &Envelope,
    ctx: &ProcessContext,
    (state, keys): Handled,
    given: &Given<'_>,
) -> Effects {
    instance.state = state;
    instance.processed.push(envelope.message_id.clone());
    let excess = instance.processed.len().saturating_sub(PROCESSED_MEMORY);
    instance.processed.drain(..excess);
    let desired: Vec<(String, String)> = keys
        .into_iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(field, value)| (field.to_owned(), value))
        .collect();
    let delete = ctx.stop || (ctx.complete && def.on_complete == OnComplete::Delete);
    let mut fx = entries(def, &instance.keys, &desired, delete, ctx.complete);
    fx.delete = delete;
    instance.keys = desired;
    if ctx.complete {
        instance.status = InstanceStatus::Completed;
        audit(instance, envelope, ProcessAuditAction::Completed, given.at);
    } else {
        audit(instance, envelope, ProcessAuditAction::Handled, given.at);
    }
    outbox(def.name, instance, envelope, ctx, given, &mut fx);
    fx
}

/// The correlation entries to claim and release (exclusive and shared) for
/// an instance that held `held` and now holds `desired`.
fn entries(
    def: &ProcessDefinition,
    held: &[(String, String)],
    desired: &[(String, String)],
    delete: bool,
    complete: bool,
) -> Effects {
    let (add_keys, remove_keys): (Vec<_>, Vec<_>) = if delete {
        // Release every entry the instance owns, old and new.
        let mut all = held.to_vec();
        all.extend(desired.iter().filter(|k| !held.contains(k)).cloned());
        (Vec::new(), all)
    } else {
        (
            desired
                .iter()
                .filter(|k| !held.contains(k))
                .cloned()
                .collect(),
            held.iter()
                .filter(|k| !desired.contains(k))
                .cloned()
                .collect(),
        )
    };
    // Entries of shared fields join and leave sets of instances.
    let shared = |keys: Vec<(String, String)>| -> (Vec<_>, Vec<_>) {
        keys.into_iter()
            .partition(|(field, _)| def.is_shared(field))
    };
    let (mut add_shared, add_keys) = shared(add_keys);
    let (mut remove_shared, mut remove_keys) = shared(remove_keys);
    // An instance saved before its field was shared has an exclusive
    // entry instead: every save joins the set (it is idempotent) and
    // drops the old entry, so no instance is missed after `many` is
    // added to a handler.
    // A completed instance leaves its shared sets: it would only ignore
    // what they bring it, and they would grow with every instance ever
    // completed.
    let leaves = delete || complete;
    for entry in desired.iter().filter(|(f, _)| def.is_shared(f)) {
        if !leaves && !add_shared.contains(entry) {
            add_shared.push(entry.clone());
        }
        if complete && !delete {
            add_shared.retain(|e| e != entry);
            remove_shared.push(entry.clone());
        }
        remove_keys.push(entry.clone());
    }
    Effects {
        add_keys,
        remove_keys,
        add_shared,
        remove_shared,
        ..Effects::default()
    }
}

/// What the handler sent, published, scheduled and opened, as the write's
/// messages. Their ids derive from the message handled, so a re-run after
/// a conflict emits the same ones; delays run from `given.now_ms`.
fn outbox(
    process: &str,
    instance: &ProcessInstance,
    envelope: &Envelope,
    ctx: &ProcessContext,
    given: &Given<'_>,
    fx: &mut Effects,
) {
    let now_ms = given.now_ms;
    for (n, out) in ctx.outgoing.iter().enumerate() {
        let message_id = derived_id(&envelope.message_id, &instance.id, &n.to_string());
        let name = match &out.target {
            Target::Publish => {
                for subscriber in (given.subscribers)(&out.message_type) {
                    let (key, key_field) =
                        (given.routing_key)(subscriber, &out.message_type, &out.payload);
                    fx.enqueue.push(Envelope {
                        traceparent: given.traceparent.clone(),
                        due_ms: None,
                        hops: 0,
                        hold_until: None,
                        message_id: message_id.clone(),
                        process: subscriber.to_owned(),
                        message_type: out.message_type.clone(),
                        payload: out.payload.clone(),
                        kind: EnvelopeKind::Message,
                        instance_id: None,
                        generation: None,
                        failures: 0,
                        key,
                        key_field,
                    });
                }
                PUBLISHED.to_owned()
            }
            Target::Endpoint(name) => name.clone(),
        };
        let message = sent(message_id, process, &instance.id, out, now_ms);
        fx.endpoints.push((name, message));
    }
    for (n, t) in ctx.timeouts.iter().enumerate() {
        let due_ms = due(now_ms, t.delay);
        let timeout = Envelope {
            traceparent: given.traceparent.clone(),
            due_ms: Some(due_ms),
            hops: 0,
            hold_until: None,
            message_id: derived_id(&envelope.message_id, &instance.id, &format!("t{n}")),
            process: process.to_owned(),
            message_type: t.message_type.clone(),
            payload: t.payload.clone(),
            kind: EnvelopeKind::Timeout,
            instance_id: Some(instance.id.clone()),
            generation: Some(instance.generation.clone()).filter(|g| !g.is_empty()),
            failures: 0,
            key: None,
            key_field: None,
        };
        fx.schedule.push((due_ms, timeout));
    }
    let (tallies, reports) =
        tally::commit_parts(ctx, envelope, now_ms, given.traceparent.as_deref());
    fx.schedule.extend(reports);
    fx.tallies = tallies;
}
