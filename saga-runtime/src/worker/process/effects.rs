//! What one handler run turns into: the instance as it leaves it and the
//! effects its write carries (correlation entries, outgoing messages,
//! timeouts, tallies). Shared by the message a dispatch handles and the
//! messages it batches after it.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use serde_json::Value;

use super::dispatch::DispatchEnv;
use crate::backend::{InstanceStatus, ProcessAuditAction, ProcessInstance, TallyOpen};
use crate::process::machine::{audit, derived_id, due, sent};
use crate::process::{
    tally, Envelope, EnvelopeKind, ErasedProcess, Handled, OnComplete, ProcessContext,
    ProcessDefinition, ProcessError, Target,
};

/// Message ids remembered per instance to drop exact duplicates.
const PROCESSED_MEMORY: usize = 128;

/// The effects of one or more handled messages, for one write.
#[derive(Debug, Default)]
pub(super) struct Effects {
    pub delete: bool,
    pub add_keys: Vec<(String, String)>,
    pub remove_keys: Vec<(String, String)>,
    pub add_shared: Vec<(String, String)>,
    pub remove_shared: Vec<(String, String)>,
    pub enqueue: Vec<Envelope>,
    pub endpoints: Vec<(String, String)>,
    pub schedule: Vec<(u64, Envelope)>,
    pub tallies: Vec<TallyOpen>,
}

/// Runs `pm`'s handler of `envelope` on `state` (`None`: a new instance),
/// bounded by the handler timeout; a panic or a timeout is an error.
pub(super) async fn run_handler(
    pm: &dyn ErasedProcess,
    env: &DispatchEnv<'_>,
    envelope: &Envelope,
    state: Option<Value>,
    ctx: &mut ProcessContext,
) -> Result<Handled, ProcessError> {
    let created = state.is_none();
    let run = pm.handle_json(
        &envelope.message_type,
        envelope.payload.clone(),
        state,
        created,
        ctx,
    );
    let run = tokio::time::timeout(env.handler_timeout, AssertUnwindSafe(run).catch_unwind());
    let result = match run.await {
        Ok(result) => result,
        Err(_) => Ok(Err(ProcessError::new(format!(
            "handler timed out after {} and was dropped",
            humantime::format_duration(env.handler_timeout)
        )))),
    };
    let result = result.unwrap_or_else(|panic| {
        let text = crate::worker::panic_message(&*panic);
        Err(ProcessError::new(format!("handler panicked: {text}")))
    });
    match (result, ctx.error.take()) {
        (Ok(_), Some(error)) => Err(ProcessError::new(error)),
        (result, _) => result,
    }
}

/// Applies a handler's result (`state`, the correlation values it left,
/// what it asked of `ctx`) to `instance` and returns what the write must
/// carry besides it; delays run from `now_ms` (when the handler ran).
pub(super) fn effects(
    def: &ProcessDefinition,
    env: &DispatchEnv<'_>,
    now_ms: u64,
    instance: &mut ProcessInstance,
    envelope: &Envelope,
    ctx: &ProcessContext,
    (state, keys): Handled,
) -> Effects {
    let process = def.name;
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
    let (add_keys, remove_keys): (Vec<_>, Vec<_>) = if delete {
        // Release every entry the instance owns, old and new.
        let mut all = instance.keys.clone();
        all.extend(
            desired
                .iter()
                .filter(|k| !instance.keys.contains(k))
                .cloned(),
        );
        (Vec::new(), all)
    } else {
        (
            desired
                .iter()
                .filter(|k| !instance.keys.contains(k))
                .cloned()
                .collect(),
            instance
                .keys
                .iter()
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
    let leaves = delete || ctx.complete;
    for entry in desired.iter().filter(|(f, _)| def.is_shared(f)) {
        if !leaves && !add_shared.contains(entry) {
            add_shared.push(entry.clone());
        }
        if ctx.complete && !delete {
            add_shared.retain(|e| e != entry);
            remove_shared.push(entry.clone());
        }
        remove_keys.push(entry.clone());
    }
    instance.keys = desired;
    if ctx.complete {
        instance.status = InstanceStatus::Completed;
        audit(instance, envelope, ProcessAuditAction::Completed);
    } else {
        audit(instance, envelope, ProcessAuditAction::Handled);
    }

    let mut enqueue = Vec::new();
    let mut endpoints = Vec::new();
    for (n, out) in ctx.outgoing.iter().enumerate() {
        let message_id = derived_id(&envelope.message_id, &instance.id, &n.to_string());
        match &out.target {
            Target::Publish => {
                for subscriber in (env.subscribers)(&out.message_type) {
                    let (key, key_field) =
                        (env.routing_key)(subscriber, &out.message_type, &out.payload);
                    enqueue.push(Envelope {
                        traceparent: crate::otel::current(),
                        due_ms: None,
                        hops: 0,
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
                endpoints.push((
                    crate::model::endpoint::PUBLISHED.to_owned(),
                    sent(message_id, process, &instance.id, out, now_ms),
                ));
            }
            Target::Endpoint(name) => endpoints.push((
                name.clone(),
                sent(message_id, process, &instance.id, out, now_ms),
            )),
        }
    }
    let mut schedule = ctx
        .timeouts
        .iter()
        .enumerate()
        .map(|(n, t)| {
            let envelope = Envelope {
                traceparent: crate::otel::current(),
                due_ms: Some(due(now_ms, t.delay)),
                hops: 0,
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
            (envelope.due_ms.unwrap_or_default(), envelope)
        })
        .collect::<Vec<_>>();
    let traceparent = crate::otel::current();
    let (tallies, reports) = tally::commit_parts(ctx, envelope, now_ms, traceparent.as_deref());
    schedule.extend(reports);
    Effects {
        delete,
        add_keys,
        remove_keys,
        add_shared,
        remove_shared,
        enqueue,
        endpoints,
        schedule,
        tallies,
    }
}
