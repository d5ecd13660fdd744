//! Batching: the messages of one instance that wait for it in this process
//! go into the write of the message being handled, one load and one save
//! for all of them.
//!
//! Each is still handled on its own, in turn (its handler runs on the state
//! the previous one left), with its own duplicate check, effects and
//! acknowledgement; the write carries them all or, if it fails, none (each
//! then goes on alone, as if it had never been batched). Only messages
//! whose outcome is a plain save of the instance are batched; the first
//! that would do anything else (fail, create, delete, open a tally, change
//! the instance's correlation entries) ends the batch and is handled alone
//! after the write, so the order of the messages holds. Its handler then
//! runs again, which is why only `concurrency = optimistic` process
//! managers batch: the pessimistic mode promises one run per message.

use tokio::sync::oneshot;

use super::dispatch::DispatchEnv;
use super::effects::{effects, run_handler, Effects};
use crate::backend::{Batched, Delivery, InstanceStatus, ProcessInstance};
use crate::process::{
    Correlation, Dispatched, Envelope, EnvelopeKind, ErasedProcess, HandlerKind, ProcessContext,
};

/// Messages one write takes at most: a bound on the script's size and on
/// how long the others wait for it.
const BATCH_MAX: usize = 64;

/// A message waiting for its instance, offered to the handler ahead of it.
pub(crate) struct Joined {
    pub envelope: Envelope,
    pub delivery: Delivery,
    done: oneshot::Sender<Dispatched>,
}

impl Joined {
    /// The offer, and where its worker learns that it was handled in
    /// another's write (an error: it was not, and goes on alone).
    pub fn new(envelope: Envelope, delivery: Delivery) -> (Self, oneshot::Receiver<Dispatched>) {
        let (done, outcome) = oneshot::channel();
        let joined = Joined {
            envelope,
            delivery,
            done,
        };
        (joined, outcome)
    }

    pub(super) fn batched(&self) -> Batched<'_> {
        Batched {
            message_id: &self.envelope.message_id,
            delivery: &self.delivery,
        }
    }

    /// Its write is saved.
    pub(super) fn handled(self, instance: &str) {
        let _ = self.done.send(Dispatched::Handled {
            instance: instance.to_owned(),
            created: false,
        });
    }
}

/// Where a dispatch finds the messages waiting for its instance.
pub(crate) trait Joiners: Send + Sync {
    /// The next one, in the order they came (taken: it is this write's
    /// now, or, dropped, its own again).
    fn next(&self) -> Option<Joined>;
}

/// Applies waiting messages to `instance` and adds their effects to `fx`
/// until one cannot be batched or none waits; returns those applied.
pub(super) async fn absorb(
    pm: &dyn ErasedProcess,
    env: &DispatchEnv<'_>,
    joiners: &dyn Joiners,
    instance: &mut ProcessInstance,
    fx: &mut Effects,
) -> Vec<Joined> {
    let mut batch = Vec::new();
    while batch.len() < BATCH_MAX {
        let Some(joined) = joiners.next() else { break };
        match apply(pm, env, instance, &joined.envelope).await {
            Some(more) => {
                fx.enqueue.extend(more.enqueue);
                fx.endpoints.extend(more.endpoints);
                fx.schedule.extend(more.schedule);
                for entry in more.add_shared {
                    if !fx.add_shared.contains(&entry) {
                        fx.add_shared.push(entry);
                    }
                }
                batch.push(joined);
            }
            // Dropped: it goes on alone, after this write.
            None => break,
        }
    }
    batch
}

/// Handles `envelope` on `instance` if the outcome is a plain save that
/// keeps the instance's correlation entries; `None` (and `instance`
/// untouched) otherwise.
async fn apply(
    pm: &dyn ErasedProcess,
    env: &DispatchEnv<'_>,
    instance: &mut ProcessInstance,
    envelope: &Envelope,
) -> Option<Effects> {
    let def = pm.definition();
    let fresh = envelope.kind != EnvelopeKind::TallyReport
        && instance.status == InstanceStatus::Active
        && !instance.processed.contains(&envelope.message_id)
        && envelope
            .generation
            .as_ref()
            .is_none_or(|g| instance.generation.is_empty() || instance.generation == *g);
    let handler = def.handler(&envelope.message_type).filter(|_| fresh)?;
    if matches!(handler.kind, HandlerKind::Starts { strict: true }) {
        return None;
    }
    let key = || {
        pm.message_key(&envelope.message_type, &envelope.payload)
            .ok()
            .flatten()
    };
    let ours = match handler.correlation {
        Correlation::Instance => envelope.instance_id.as_deref() == Some(instance.id.as_str()),
        Correlation::Id => key().is_some_and(|k| k == instance.id),
        Correlation::Field { state_field, .. } => {
            !def.is_shared(state_field)
                && key().is_some_and(|k| {
                    instance
                        .keys
                        .iter()
                        .any(|(f, v)| f == state_field && *v == k)
                })
        }
    };
    if !ours {
        return None;
    }
    let mut ctx = ProcessContext::new(
        def.name,
        instance.id.clone(),
        instance.generation.clone(),
        envelope.message_id.clone(),
    );
    let state = Some(instance.state.clone());
    let handled = run_handler(pm, env, envelope, state, &mut ctx).await.ok()?;
    if !ctx.tallies.is_empty() {
        return None;
    }
    let mut next = instance.clone();
    // Its delays run from when it ran, not from when the first did.
    let now_ms = env.now_ms.max(crate::model::task::Timestamp::now().0);
    let fx = effects(def, env, now_ms, &mut next, envelope, &ctx, handled);
    // The same correlation values: the entries this write claims and
    // releases are the first message's (each save also re-joins shared
    // sets and drops legacy entries, the same for every message).
    let plain = !fx.delete && next.keys == instance.keys && fx.remove_shared.is_empty();
    if !plain {
        return None;
    }
    *instance = next;
    Some(fx)
}
