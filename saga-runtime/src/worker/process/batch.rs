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
use super::handler::run_handler;
use crate::backend::{Batched, Delivery};
use crate::model::task::Timestamp;
use crate::process::machine::{joins, Given, Save};
use crate::process::{Dispatched, Envelope, ErasedProcess, ProcessContext};

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

/// Handles waiting messages in `save`'s write, each on the state the
/// previous one left, until one cannot be batched or none waits; returns
/// those handled.
pub(super) async fn absorb(
    pm: &dyn ErasedProcess,
    env: &DispatchEnv<'_>,
    joiners: &dyn Joiners,
    save: &mut Save,
) -> Vec<Joined> {
    let mut batch = Vec::new();
    while batch.len() < BATCH_MAX {
        let Some(joined) = joiners.next() else { break };
        if !apply(pm, env, save, &joined.envelope).await {
            // Dropped: it goes on alone, after this write.
            break;
        }
        batch.push(joined);
    }
    batch
}

/// Runs `envelope`'s handler on the instance as `save` leaves it, if the
/// machine lets it join the write, and joins it if its outcome allows.
async fn apply(
    pm: &dyn ErasedProcess,
    env: &DispatchEnv<'_>,
    save: &mut Save,
    envelope: &Envelope,
) -> bool {
    let def = pm.definition();
    let Some(instance) = save.instance() else {
        return false;
    };
    let key = || {
        pm.message_key(&envelope.message_type, &envelope.payload)
            .ok()
            .flatten()
    };
    if !joins(def, instance, envelope, key) {
        return false;
    }
    let mut ctx = ProcessContext::new(
        def.name,
        instance.id.clone(),
        instance.generation.clone(),
        envelope.message_id.clone(),
    );
    let state = Some(instance.state.clone());
    let Ok(handled) = run_handler(pm, env, envelope, state, &mut ctx).await else {
        return false;
    };
    // Its delays run from when it ran, not from when the first did.
    let given = Given {
        now_ms: env.now_ms.max(Timestamp::now().0),
        ..env.given()
    };
    save.join(def, envelope, &ctx, handled, &given)
}
