//! Handling one process-manager message: find the instance, run the
//! handler, save everything at once; or ask `#[on_error]`.
//!
//! Shared by the workers and by the test kit (`crate::testing`), so tests
//! exercise the real routing and correlation code.

use std::panic::AssertUnwindSafe;

use serde_json::Value;

use super::batch::{self, Joiners};
use super::effects::{effects, run_handler};
use crate::backend::{
    Backend, BackendError, Delivery, InstanceStatus, LoadedInstance, ProcessAuditAction,
    ProcessCommit, ProcessInstance, Settle,
};
use crate::model::task::Timestamp;
use crate::process::machine::{audit, due};
use crate::process::tally;
use crate::process::{
    Correlation, Dispatched, Envelope, EnvelopeKind, ErasedProcess, ErrorAction, Failure,
    FailureKind, HandlerKind, ProcessContext,
};

/// How many times a handler is re-run after losing a concurrent write,
/// before the message is handed back for redelivery.
const CONFLICT_RETRIES: u32 = 64;

/// `(process, message type, payload) -> (key, key_field)`.
pub(crate) type RoutingKey<'a> =
    dyn Fn(&str, &str, &Value) -> (Option<String>, Option<String>) + Send + Sync + 'a;

/// Where dispatch runs: the store, the routing table for `publish`, the
/// clock, and the delivery to settle (none in the test kit).
pub(crate) struct DispatchEnv<'a> {
    pub backend: &'a dyn Backend,
    pub subscribers: &'a (dyn Fn(&str) -> Vec<&'static str> + Send + Sync),
    /// The routing key of a message for a process manager (see
    /// [`routing_key`](super::routing_key)), for the envelopes a handler
    /// publishes.
    pub routing_key: &'a RoutingKey<'a>,
    pub now_ms: u64,
    pub delivery: Option<&'a Delivery>,
    /// The instance as this process last saved it, if it knows (see
    /// `worker::instance_lock`): used for the first look instead of the
    /// backend's read with the delivery.
    pub cached: Option<&'a LoadedInstance>,
    /// Whether the instance the backend read with the delivery may be
    /// stale (another handler of it ran since): then it is not used.
    pub stale_read: bool,
    /// Where to leave the instance as this dispatch saved it, for the
    /// next message of the instance in this process.
    pub saved: Option<&'a std::sync::Mutex<Option<LoadedInstance>>>,
    pub dead_letter_unmatched: bool,
    /// How long one handler call may run before it is dropped and counted
    /// as a failure for `#[on_error]`.
    pub handler_timeout: std::time::Duration,
    /// How long a deleted instance's handled message ids are remembered.
    pub tombstone_ttl: std::time::Duration,
    /// Where conflicts are counted.
    pub metrics: Option<&'a super::ProcessMetrics>,
    /// Messages of the same instance waiting in this process, which a
    /// handled message takes into its write (see `batch`).
    pub joiners: Option<&'a dyn Joiners>,
}

impl DispatchEnv<'_> {
    fn ack(&self) -> Settle<'_> {
        self.delivery.map_or(Settle::Nothing, Settle::Ack)
    }

    fn dead<'r>(&'r self, reason: &'r str) -> Settle<'r> {
        self.delivery
            .map_or(Settle::Nothing, |d| Settle::DeadLetter(d, reason))
    }

    async fn settle_only(&self, process: &str, settle: Settle<'_>) -> Result<(), BackendError> {
        self.backend
            .process_commit(process, ProcessCommit::new(None, settle))
            .await
            .map(|_| ())
    }
}

/// The status a due tally report carries, read now; `Err(reason)` when
/// there is nothing to report (the tally is gone, or its deadline came
/// after it completed).
async fn tally_report(
    env: &DispatchEnv<'_>,
    envelope: &Envelope,
) -> Result<Result<Envelope, String>, BackendError> {
    let Some((tally, request)) = tally::report_target(envelope) else {
        return Ok(Err("malformed tally report".to_owned()));
    };
    let progress = env
        .backend
        .tally_progress(&tally, tally::MISSING_LISTED, request.deadline)
        .await?;
    Ok(tally::report(envelope, &tally, request.deadline, progress))
}

fn is_conflict(e: &BackendError) -> bool {
    matches!(
        e,
        BackendError::ProcessConflict { .. } | BackendError::Conflict { .. }
    )
}

/// Handles one envelope for `pm`.
pub(crate) async fn dispatch(
    pm: &dyn ErasedProcess,
    env: &DispatchEnv<'_>,
    envelope: &Envelope,
) -> Result<Dispatched, BackendError> {
    let def = pm.definition();
    let process = def.name;
    let filled;
    let envelope = match envelope.kind {
        EnvelopeKind::TallyReport => match tally_report(env, envelope).await? {
            Ok(report) => {
                filled = report;
                &filled
            }
            Err(reason) => {
                tracing::debug!(process, message = %envelope.message_id, %reason, "tally report not delivered");
                env.settle_only(process, env.ack()).await?;
                return Ok(Dispatched::Ignored { reason });
            }
        },
        _ => envelope,
    };
    let dead_letter = |reason: String| async move {
        tracing::error!(process, message = %envelope.message_id, %reason, "dead-lettering process message");
        env.settle_only(process, env.dead(&reason)).await?;
        Ok::<_, BackendError>(Dispatched::DeadLettered { reason })
    };
    let Some(handler) = def.handler(&envelope.message_type) else {
        return dead_letter(format!(
            "process manager `{process}` has no handler for message type `{}`",
            envelope.message_type
        ))
        .await;
    };

    // The instance as this process last saved it, or as the backend read
    // it with the delivery: used for the first look only (a conflict
    // re-run loads again), if it was looked up by what this handler looks
    // up. Either may be stale (another process wrote since): the save's
    // version check catches that, and the handler runs again on the fresh
    // state. (The worker passes neither where a decision must rest on a
    // read under the pessimistic lease.)
    let mut loaded = env
        .cached
        .or(env
            .delivery
            .filter(|_| !env.stale_read)
            .and_then(|d| d.instance.as_deref()))
        // Only a record of this process manager and, looked up by id, of
        // that instance (as the store's own loads check).
        .filter(|l| {
            l.instance
                .as_ref()
                .is_none_or(|i| i.process == process && (l.key_field.is_some() || i.id == l.key))
        });
    // Messages waiting in this process are taken into the first write
    // only: once it is refused, those it took go on alone, and ones that
    // came after them must not overtake them.
    let mut joiners = env.joiners;
    for _ in 0..CONFLICT_RETRIES {
        let loaded = loaded.take();
        // A first look may be stale (another process wrote since): a
        // decision that settles the message without a versioned write
        // (ignore, drop as unmatched or duplicate) is made on a fresh read.
        // (Only if the instance came from it: a lookup it did not answer
        // read the store.)
        let from_first_look = std::sync::atomic::AtomicBool::new(false);
        let loaded_by = |key: &str, field: Option<&str>| {
            let found = loaded
                .filter(|l| l.key == key && l.key_field.as_deref() == field)
                .map(|l| l.instance.clone());
            if found.is_some() {
                from_first_look.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            found
        };
        // 1. Find the instance.
        let (existing, key) = match handler.correlation {
            Correlation::Instance => {
                let Some(id) = envelope.instance_id.as_deref() else {
                    return dead_letter(format!(
                        "timeout `{}` names no instance",
                        envelope.message_type
                    ))
                    .await;
                };
                let existing = match loaded_by(id, None) {
                    Some(existing) => existing,
                    None => env.backend.process_load(process, id).await?,
                };
                (existing, id.to_owned())
            }
            Correlation::Id | Correlation::Field { .. } => {
                let key = match pm.message_key(&envelope.message_type, &envelope.payload) {
                    Ok(Some(key)) => key,
                    Ok(None) => {
                        return dead_letter(format!(
                            "`{}` has no correlation id; mark a field `#[correlation_id]` or correlate with `#[correlate]`",
                            envelope.message_type
                        ))
                        .await
                    }
                    Err(e) => return dead_letter(e.to_string()).await,
                };
                let found = match handler.correlation {
                    Correlation::Field { state_field, .. } if def.is_shared(state_field) => {
                        let many = matches!(handler.kind, HandlerKind::Handles { many: true, .. });
                        if let (true, Some(id)) = (many, envelope.instance_id.as_deref()) {
                            // One instance's copy of a fanned-out message:
                            // for it only while it still holds the value.
                            let found = match loaded_by(id, None) {
                                Some(found) => found,
                                None => env.backend.process_load(process, id).await?,
                            };
                            let holds = found.as_ref().is_some_and(|i| {
                                i.keys.iter().any(|(f, v)| f == state_field && *v == key)
                            });
                            if !holds {
                                env.settle_only(process, env.ack()).await?;
                                return Ok(Dispatched::Ignored {
                                    reason: format!(
                                        "instance `{id}` no longer holds `{state_field}` = `{key}` \
                                         (gone or changed since the message was handed to it)"
                                    ),
                                });
                            }
                            found
                        } else {
                            let ids = holders(env.backend, process, state_field, &key).await?;
                            match ids.as_slice() {
                                [] => None,
                                [id] => match loaded_by(id, None) {
                                    Some(found) => found,
                                    None => env.backend.process_load(process, id).await?,
                                },
                                _ if many => return fan_out(process, env, envelope, ids).await,
                                _ => {
                                    let error = format!(
                                        "`{}` matched {} instances of `{process}` by \
                                         `{state_field}` = `{key}`, and one cannot be picked: \
                                         mark its handler `#[handles(many)]` to deliver it to each",
                                        envelope.message_type,
                                        ids.len()
                                    );
                                    return fail(
                                        pm,
                                        env,
                                        envelope,
                                        None,
                                        FailureKind::Ambiguous,
                                        error,
                                    )
                                    .await;
                                }
                            }
                        }
                    }
                    Correlation::Field { state_field, .. } => {
                        match loaded_by(&key, Some(state_field)) {
                            Some(found) => found,
                            None => env.backend.process_find(process, state_field, &key).await?,
                        }
                    }
                    _ => match loaded_by(&key, None) {
                        Some(found) => found,
                        None => env.backend.process_load(process, &key).await?,
                    },
                };
                (found, key)
            }
        };

        let first_look = from_first_look.load(std::sync::atomic::Ordering::Relaxed);
        // A timeout or a tally's message is for the generation that asked
        // for it. A record without a generation was written by a worker
        // that predates them (a rolling deploy): unknown, so the message
        // is delivered rather than lost.
        if let (Some(instance), Some(generation)) = (&existing, &envelope.generation) {
            if !instance.generation.is_empty() && instance.generation != *generation {
                if first_look {
                    continue;
                }
                tracing::debug!(process, instance = %instance.id, "message for an earlier instance with this id ignored");
                env.settle_only(process, env.ack()).await?;
                return Ok(Dispatched::Ignored {
                    reason: format!(
                        "`{}` is for an earlier instance `{}` (deleted, then created again)",
                        envelope.message_type, instance.id
                    ),
                });
            }
        }

        // 2. Decide whether the handler runs.
        let fresh = match (&existing, handler.kind) {
            (None, HandlerKind::Timeout | HandlerKind::Handles { .. }) if first_look => continue,
            (Some(instance), _)
                if first_look && instance.processed.contains(&envelope.message_id) =>
            {
                continue
            }
            (None, HandlerKind::Timeout) => {
                tracing::debug!(process, instance = %key, "timeout for an instance that no longer exists ignored");
                env.settle_only(process, env.ack()).await?;
                return Ok(Dispatched::Ignored {
                    reason: format!("instance `{key}` does not exist"),
                });
            }
            (None, HandlerKind::Handles { strict: false, .. }) => {
                tracing::warn!(
                    process, message_type = %envelope.message_type, correlation = %key,
                    "continuing message matched no instance"
                );
                let reason = format!(
                    "`{}` for process manager `{process}` matched no instance (correlation `{key}`)",
                    envelope.message_type
                );
                let settle = if env.dead_letter_unmatched {
                    env.dead(&reason)
                } else {
                    env.ack()
                };
                env.settle_only(process, settle).await?;
                return Ok(Dispatched::Unmatched { key });
            }
            (None, HandlerKind::Handles { strict: true, .. }) => {
                let error =
                    format!("no instance of `{process}` for `{key}` (`#[handles(strict)]`)");
                return fail(pm, env, envelope, None, FailureKind::NotStarted, error).await;
            }
            (None, HandlerKind::Starts { .. }) => {
                let id = match handler.correlation {
                    Correlation::Id => key.clone(),
                    _ => env.backend.new_instance_id(process, &key),
                };
                let now = Timestamp::now();
                ProcessInstance {
                    process: process.to_owned(),
                    id,
                    generation: uuid::Uuid::new_v4().simple().to_string(),
                    started_by: Some(envelope.message_id.clone()),
                    state: Value::Null,
                    status: InstanceStatus::Active,
                    version: 0,
                    keys: Vec::new(),
                    processed: Vec::new(),
                    audit_log: Vec::new(),
                    created_at: now,
                    updated_at: now,
                }
            }
            (Some(instance), _) if instance.processed.contains(&envelope.message_id) => {
                env.settle_only(process, env.ack()).await?;
                return Ok(Dispatched::Duplicate {
                    instance: instance.id.clone(),
                });
            }
            (Some(instance), _) if instance.status != InstanceStatus::Active => {
                let mut instance = instance.clone();
                let reason = format!("instance is {:?}", instance.status).to_lowercase();
                audit(
                    &mut instance,
                    envelope,
                    ProcessAuditAction::Ignored {
                        reason: reason.clone(),
                    },
                );
                match env
                    .backend
                    .process_commit(process, ProcessCommit::new(Some(&instance), env.ack()))
                    .await
                {
                    Err(e) if is_conflict(&e) => continue,
                    other => other?,
                };
                return Ok(Dispatched::Ignored { reason });
            }
            (Some(instance), HandlerKind::Starts { strict: true }) => {
                let error = format!(
                    "instance `{}` of `{process}` already exists (`#[starts(strict)]`)",
                    instance.id
                );
                let instance = instance.clone();
                return fail(
                    pm,
                    env,
                    envelope,
                    Some(instance),
                    FailureKind::AlreadyStarted,
                    error,
                )
                .await;
            }
            (Some(instance), _) => instance.clone(),
        };
        let created = fresh.version == 0;

        // 3. Run the handler on a copy of the state.
        let mut ctx = ProcessContext::new(
            process,
            fresh.id.clone(),
            fresh.generation.clone(),
            envelope.message_id.clone(),
        );
        let state = (!created).then(|| fresh.state.clone());
        let handled = match run_handler(pm, env, envelope, state, &mut ctx).await {
            Ok(handled) => handled,
            Err(e) if e.is_invalid_payload() => return dead_letter(e.to_string()).await,
            Err(e) => {
                let existing = (!created).then_some(fresh);
                return fail(
                    pm,
                    env,
                    envelope,
                    existing,
                    FailureKind::Handler,
                    e.to_string(),
                )
                .await;
            }
        };

        // 4. Save state, correlation entries, outbox and acknowledgement at once.
        // (The state as it was, for `#[on_error]`, should a tally it opens
        // turn out to exist.)
        let before = (!ctx.tallies.is_empty() && !created).then(|| fresh.clone());
        let mut instance = fresh;
        let mut fx = effects(def, env, env.now_ms, &mut instance, envelope, &ctx, handled);
        // Messages of the instance that waited for this one here go in the
        // same write, each applied in turn.
        let batch = match joiners.take() {
            Some(joiners) if !fx.delete && fx.tallies.is_empty() => {
                batch::absorb(pm, env, joiners, &mut instance, &mut fx).await
            }
            _ => Vec::new(),
        };
        let write = ProcessCommit {
            instance: Some(&instance),
            handling: Some(envelope.message_id.as_str()),
            tombstone_ttl: env.tombstone_ttl,
            delete: fx.delete,
            add_keys: fx.add_keys,
            remove_keys: fx.remove_keys,
            add_shared: fx.add_shared,
            remove_shared: fx.remove_shared,
            enqueue: fx.enqueue,
            endpoints: fx.endpoints,
            schedule: fx.schedule,
            tallies: fx.tallies,
            settle: env.ack(),
            batched: batch.iter().map(|j| j.batched()).collect(),
        };
        let delete = write.delete;
        match env.backend.process_commit(process, write).await {
            Ok(version) => {
                if let Some(saved) = env.saved {
                    *saved.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(saved_as(instance.clone(), version, delete));
                }
                for joined in batch {
                    joined.handled(&instance.id);
                }
                return Ok(Dispatched::Handled {
                    instance: instance.id,
                    created,
                });
            }
            // One of the batched messages may be the late duplicate: each
            // goes on its own (dropping them hands them back to their
            // workers), this one again.
            Err(BackendError::ProcessTombstoned { .. }) if !batch.is_empty() => continue,
            // A late duplicate of a message a deleted instance with this id
            // (or correlation) handled: it must not start the process again,
            // nor reach the instance created since.
            Err(BackendError::ProcessTombstoned { instance, .. }) => {
                tracing::debug!(process, %instance, message = %envelope.message_id, "duplicate of a deleted instance's message dropped");
                env.settle_only(process, env.ack()).await?;
                return Ok(Dispatched::Duplicate { instance });
            }
            Err(BackendError::TallyExists(tally)) => {
                let error = BackendError::TallyExists(tally).to_string();
                return fail(pm, env, envelope, before, FailureKind::Handler, error).await;
            }
            // Someone else wrote the instance (or claimed its correlation
            // entry) first: re-run on the fresh state.
            Err(e) if is_conflict(&e) => {
                if let Some(metrics) = env.metrics {
                    metrics.count_conflict(pm.definition().name);
                }
                tracing::debug!(process, instance = %instance.id, "concurrent write; re-running the handler");
                continue;
            }
            Err(e) => return Err(e),
        }
    }
    Err(BackendError::unavailable(format!(
        "process `{process}`: still conflicting after {CONFLICT_RETRIES} attempts; the message will be redelivered"
    )))
}

/// The instance as a commit left it, by its id, for the next handler of
/// it in this process (which may find it by id or by a value it holds:
/// see `worker::process`).
fn saved_as(
    mut instance: ProcessInstance,
    version: u64,
    deleted: bool,
) -> crate::backend::LoadedInstance {
    instance.version = version;
    instance.updated_at = Timestamp::now();
    crate::backend::LoadedInstance {
        key: instance.id.clone(),
        key_field: None,
        instance: (!deleted).then_some(instance),
    }
}

/// The instances holding `value` of the shared field `field`: those in
/// its set, and one saved before the field was shared, found by its old
/// exclusive entry (it joins the set on its next save).
pub(crate) async fn holders(
    backend: &dyn Backend,
    process: &str,
    field: &str,
    value: &str,
) -> Result<Vec<String>, BackendError> {
    let mut ids = backend.process_find_shared(process, field, value).await?;
    if let Some(legacy) = backend.process_find(process, field, value).await? {
        if !ids.contains(&legacy.id) {
            ids.push(legacy.id);
            ids.sort();
        }
    }
    Ok(ids)
}

/// Hands a `#[handles(many)]` message to each instance sharing its value:
/// one copy per instance, addressed to it, enqueued with the
/// acknowledgement of the original. Each copy is then handled like any
/// message of one instance (its own save, duplicate detection and errors).
async fn fan_out(
    process: &str,
    env: &DispatchEnv<'_>,
    envelope: &Envelope,
    ids: Vec<String>,
) -> Result<Dispatched, BackendError> {
    let instances = ids.len();
    let mut write = ProcessCommit::new(None, env.ack());
    write.enqueue = ids
        .into_iter()
        .map(|id| Envelope {
            instance_id: Some(id.clone()),
            key: Some(id),
            key_field: None,
            ..envelope.clone()
        })
        .collect();
    env.backend.process_commit(process, write).await?;
    Ok(Dispatched::FannedOut { instances })
}

/// Asks `#[on_error]` and carries out its answer.
async fn fail(
    pm: &dyn ErasedProcess,
    env: &DispatchEnv<'_>,
    envelope: &Envelope,
    instance: Option<ProcessInstance>,
    kind: FailureKind,
    error: String,
) -> Result<Dispatched, BackendError> {
    let process = pm.definition().name;
    let failure = Failure {
        kind,
        error: error.clone(),
        message_type: envelope.message_type.clone(),
        message_id: envelope.message_id.clone(),
        instance_id: instance.as_ref().map(|i| i.id.clone()),
        failures: envelope.failures + 1,
    };
    // `#[on_error]` is user code too: a panic there stops the instance
    // rather than the worker.
    let action = std::panic::catch_unwind(AssertUnwindSafe(|| pm.on_error(&failure)))
        .unwrap_or_else(|_| {
            tracing::error!(process, message_type = %envelope.message_type, "#[on_error] panicked; stopping the instance");
            ErrorAction::Stop
        });
    tracing::warn!(process, message_type = %envelope.message_type, %error, failures = failure.failures, ?action, "process handler failed");
    let mut again = envelope.clone();
    again.failures += 1;
    let mut write = ProcessCommit::new(None, env.ack());
    let mut instance = instance;
    let reason;
    match action {
        ErrorAction::Retry => write.enqueue.push(again),
        ErrorAction::RetryAfter(delay) => write.schedule.push((due(env.now_ms, delay), again)),
        ErrorAction::Skip => {
            if let Some(i) = instance.as_mut() {
                audit(
                    i,
                    envelope,
                    ProcessAuditAction::Skipped {
                        error: error.clone(),
                    },
                );
            }
        }
        ErrorAction::Stop => {
            if let Some(i) = instance.as_mut() {
                i.status = InstanceStatus::Stopped;
                audit(
                    i,
                    envelope,
                    ProcessAuditAction::Stopped {
                        error: error.clone(),
                    },
                );
            }
        }
    }
    if action == ErrorAction::Stop {
        reason = format!("process `{process}` stopped after: {error}");
        write.settle = env.dead(&reason);
    }
    if matches!(action, ErrorAction::Skip | ErrorAction::Stop) {
        write.instance = instance.as_ref();
    }
    match env.backend.process_commit(process, write).await {
        Ok(_) => Ok(Dispatched::Failed { action, error }),
        // The instance moved on meanwhile: hand the message back; it is
        // redelivered and judged against the fresh state.
        Err(e) => Err(e),
    }
}
