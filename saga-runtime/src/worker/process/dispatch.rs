//! Handling one process-manager message: the driver of
//! [`crate::process::machine`]. It does what the machine cannot (read the
//! instance, run the handler, ask `#[on_error]`, write, log, count) and
//! decides nothing about the message itself: load, run, decide, commit,
//! and go again when the machine says the read was stale or the write
//! lost to another.
//!
//! Shared by the workers and by the test kit (`crate::testing`), so tests
//! exercise the real routing and correlation code.

use std::panic::AssertUnwindSafe;

use super::batch::{self, Joined, Joiners};
use super::handler::run_handler;
use crate::backend::{
    BackendError, Delivery, Hold, LoadedInstance, Partitions, ProcessBackend, ProcessCommit,
    ProcessInstance, ProcessRefusal, Settle,
};
use crate::model::task::Timestamp;
pub(crate) use crate::process::machine::RoutingKey;
use crate::process::machine::{
    self, Admitted, Commit, Decision, Failing, Given, Handling, Lookup, Note, Refusal, Save,
    Settlement, Verdict,
};
use crate::process::tally;
use crate::process::{
    Dispatched, Envelope, EnvelopeKind, ErasedProcess, ErrorAction, ProcessContext,
};
use crate::util::Unpoisoned;

/// How many times a handler is re-run after losing a concurrent write,
/// before the message is handed back for redelivery.
const CONFLICT_RETRIES: u32 = 64;

/// Where dispatch runs: the store, the routing table for `publish`, the
/// clock, and the delivery to settle (none in the test kit).
pub(crate) struct DispatchEnv<'a> {
    pub backend: &'a dyn ProcessBackend,
    /// Where a new instance's id is placed (its partition, on a backend
    /// that keeps partitions apart).
    pub placement: &'a dyn Partitions,
    pub subscribers: &'a (dyn Fn(&str) -> Vec<&'static str> + Send + Sync),
    /// The routing key of a message for a process manager (see
    /// [`routing_key`](crate::process::routing_key)), for the envelopes a
    /// handler publishes.
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
    /// How long a continuing message that matched no instance is held
    /// (unless its handler says).
    pub hold_unmatched: std::time::Duration,
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
    fn settle<'r>(&'r self, settlement: &'r Settlement) -> Settle<'r> {
        match (self.delivery, settlement) {
            (None, _) => Settle::Nothing,
            (Some(d), Settlement::Ack) => Settle::Ack(d),
            (Some(d), Settlement::DeadLetter(reason)) => Settle::DeadLetter(d, reason),
        }
    }

    /// What the machine is given, read now: the wall clock and the
    /// current span's trace context, besides the settings.
    pub(super) fn given(&self) -> Given<'_> {
        Given {
            now_ms: self.now_ms,
            at: Timestamp::now(),
            traceparent: crate::otel::current(),
            subscribers: self.subscribers,
            routing_key: self.routing_key,
            dead_letter_unmatched: self.dead_letter_unmatched,
            hold: self.hold_unmatched,
            tombstone_ttl: self.tombstone_ttl,
        }
    }
}

/// Why a message was not handled now: the store failed, or refused a
/// write in a way this handling cannot settle (the message is in another
/// partition than its instance; a race that outlasted the re-runs).
/// Either way the message is handed back and comes again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotHandled {
    /// The store failed.
    #[error(transparent)]
    Failed(#[from] BackendError),
    /// The store refused the write.
    #[error("the write was refused: {0}")]
    Refused(#[from] ProcessRefusal),
}

/// A write the store refused, as the machine reads it, and as the store
/// said it (for a caller that expects no refusal: it hands the message
/// back with it).
struct Refused {
    refusal: Refusal,
    raw: ProcessRefusal,
}

/// Writes `write`; the store's expected refusals come back as the
/// machine's. The one place that reads them.
async fn write(
    env: &DispatchEnv<'_>,
    process: &str,
    write: ProcessCommit<'_>,
) -> Result<Result<u64, Refused>, NotHandled> {
    let raw = match env.backend.process_commit(process, write).await? {
        Ok(version) => return Ok(Ok(version)),
        Err(raw) => raw,
    };
    let refusal = match &raw {
        ProcessRefusal::Conflict => Refusal::Conflict,
        ProcessRefusal::Tombstoned { instance } => Refusal::Tombstoned {
            instance: instance.clone(),
        },
        ProcessRefusal::TallyExists(_) => Refusal::TallyExists {
            error: raw.to_string(),
        },
        ProcessRefusal::HoldFull { .. } => Refusal::HoldFull,
        // Handed back: the worker forwards it on its next delivery, or
        // (an endpoint full) tries again once its consumers caught up.
        ProcessRefusal::Elsewhere { .. } | ProcessRefusal::EndpointFull { .. } => {
            return Err(raw.into())
        }
    };
    Ok(Err(Refused { refusal, raw }))
}

/// The backend's write of `commit`: it borrows the instance and the
/// settlement (which borrows the delivery) and the messages batched with
/// it, and takes the rest over.
fn write_of<'c>(
    env: &'c DispatchEnv<'_>,
    commit: &'c mut Commit,
    batch: &'c [Joined],
) -> ProcessCommit<'c> {
    let fx = std::mem::take(&mut commit.effects);
    // Stamped here, for every store alike: the record says when it was
    // last written (its completion included), not when it was loaded.
    if let Some(instance) = commit.instance.as_mut() {
        instance.updated_at = Timestamp::now();
    }
    let commit: &'c Commit = commit;
    ProcessCommit {
        instance: commit.instance.as_ref(),
        handling: commit.handling.as_deref(),
        tombstone_ttl: commit.tombstone_ttl,
        delete: fx.delete,
        add_keys: fx.add_keys,
        remove_keys: fx.remove_keys,
        add_shared: fx.add_shared,
        remove_shared: fx.remove_shared,
        enqueue: fx.enqueue,
        endpoints: fx.endpoints,
        schedule: fx.schedule,
        tallies: fx.tallies,
        hold: commit.hold.as_ref().map(|held| Hold {
            field: held.field.as_deref(),
            value: &held.value,
            envelope: &held.envelope,
            cap: crate::process::HOLD_CAP,
        }),
        settle: env.settle(&commit.settle),
        batched: batch.iter().map(Joined::batched).collect(),
    }
}

/// Logs a decision's note (before its write, as a reader of the log
/// expects).
fn log(process: &str, envelope: &Envelope, note: &Note) {
    match note {
        Note::DeadLettering { reason } => {
            tracing::error!(process, message = %envelope.message_id, %reason, "dead-lettering process message")
        }
        Note::NotReported { reason } => {
            tracing::debug!(process, message = %envelope.message_id, %reason, "tally report not delivered")
        }
        Note::EarlierGeneration { instance } => {
            tracing::debug!(process, %instance, "message for an earlier instance with this id ignored")
        }
        Note::InstanceGone { instance } => {
            tracing::debug!(process, %instance, "timeout for an instance that no longer exists ignored")
        }
        Note::Unmatched { correlation } => tracing::warn!(
            process, message_type = %envelope.message_type, %correlation,
            "continuing message matched no instance"
        ),
        Note::Holding { correlation } => tracing::debug!(
            process, message_type = %envelope.message_type, %correlation,
            "continuing message matched no instance yet; held until it starts"
        ),
        Note::DeletedDuplicate { instance } => {
            tracing::debug!(process, %instance, message = %envelope.message_id, "duplicate of a deleted instance's message dropped")
        }
    }
}

/// Writes a decision's commit (its outcome then stands), unless the store
/// refuses it.
async fn decide(
    env: &DispatchEnv<'_>,
    process: &str,
    envelope: &Envelope,
    decision: &mut Decision,
) -> Result<Result<(), Refused>, NotHandled> {
    if let Some(note) = &decision.note {
        log(process, envelope, note);
    }
    let written = write(env, process, write_of(env, &mut decision.commit, &[])).await?;
    Ok(written.map(|_| ()))
}

/// Writes a decision that leaves nothing to read again: a refusal hands
/// the message back (it is redelivered and judged against the fresh
/// state).
async fn settled(
    env: &DispatchEnv<'_>,
    process: &str,
    envelope: &Envelope,
    mut decision: Decision,
) -> Result<Dispatched, NotHandled> {
    match decide(env, process, envelope, &mut decision).await? {
        Ok(()) => Ok(decision.outcome),
        Err(refused) => Err(refused.raw.into()),
    }
}

/// The filled-in report a due tally report envelope carries, read now;
/// `Err(reason)` when there is nothing to report.
async fn tally_report(
    env: &DispatchEnv<'_>,
    envelope: &Envelope,
) -> Result<Result<Envelope, String>, NotHandled> {
    let Some((tally, request)) = tally::report_target(envelope) else {
        return Ok(Err("malformed tally report".to_owned()));
    };
    let progress = env
        .backend
        .tally_progress(&tally, tally::MISSING_LISTED, request.deadline)
        .await?;
    Ok(tally::report(envelope, &tally, request.deadline, progress))
}

/// Handles one envelope for `pm`.
pub(crate) async fn dispatch(
    pm: &dyn ErasedProcess,
    env: &DispatchEnv<'_>,
    envelope: &Envelope,
) -> Result<Dispatched, NotHandled> {
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
                return settled(env, process, envelope, machine::unreported(reason)).await
            }
        },
        _ => envelope,
    };
    let key = || pm.message_key(&envelope.message_type, &envelope.payload);
    let handling = match Handling::new(def, envelope, key) {
        Ok(handling) => handling,
        Err(decision) => return settled(env, process, envelope, *decision).await,
    };
    let mut first = first_look(env, process);
    // Messages waiting in this process are taken into the first write
    // only: once it is refused, those it took go on alone, and ones that
    // came after them must not overtake them.
    let mut joiners = env.joiners;
    for _ in 0..CONFLICT_RETRIES {
        if let Some(outcome) = attempt(pm, env, &handling, first.take(), &mut joiners).await? {
            return Ok(outcome);
        }
    }
    Err(BackendError::unavailable(format!(
        "process `{process}`: still conflicting after {CONFLICT_RETRIES} attempts; the message will be redelivered"
    ))
    .into())
}

/// The instance as this process last saved it, or as the backend read it
/// with the delivery: used for the first look only (a conflict re-run
/// loads again), if it was looked up by what this handler looks up.
/// Either may be stale (another process wrote since): the machine knows
/// which of its decisions must rest on a fresh read. (The worker passes
/// neither where a decision must rest on a read under the pessimistic
/// lease.)
fn first_look<'a>(env: &DispatchEnv<'a>, process: &str) -> Option<&'a LoadedInstance> {
    env.cached
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
        })
}

/// One go at the message: find its instance, decide, run its handler,
/// write. `None`: go again (the first look was stale, or the write lost
/// to another writer).
async fn attempt(
    pm: &dyn ErasedProcess,
    env: &DispatchEnv<'_>,
    handling: &Handling<'_>,
    first: Option<&LoadedInstance>,
    joiners: &mut Option<&dyn Joiners>,
) -> Result<Option<Dispatched>, NotHandled> {
    let process = handling.def.name;
    let envelope = handling.envelope;
    // 1. Find the instance.
    let (found, first_look) = match find(env, handling, first).await? {
        Ok(found) => found,
        Err(verdict) => return conclude(pm, env, handling, verdict).await,
    };
    // 2. Decide whether the handler runs.
    let instance = match handling.admit(found, first_look, &env.given()) {
        Ok(Admitted::Run(instance)) => *instance,
        Ok(Admitted::Start { id }) => {
            let key = handling.lookup.key();
            let id = id.unwrap_or_else(|| env.placement.new_instance_id(process, key));
            let generation = uuid::Uuid::new_v4().simple().to_string();
            handling.start(id, generation, Timestamp::now())
        }
        Err(verdict) => return conclude(pm, env, handling, verdict).await,
    };
    // 3. Run the handler on a copy of the state.
    let mut ctx = ProcessContext::new(
        process,
        instance.id.clone(),
        instance.generation.clone(),
        envelope.message_id.clone(),
    );
    let state = (instance.version != 0).then(|| instance.state.clone());
    let result = run_handler(pm, env, envelope, state, &mut ctx).await;
    let mut save = match handling.ran(instance, &ctx, result, &env.given()) {
        Ok(save) => save,
        Err(verdict) => return conclude(pm, env, handling, verdict).await,
    };
    // Messages of the instance that waited for this one here go in the
    // same write, each applied in turn.
    let batch = match joiners.take() {
        Some(joiners) if save.batchable() => batch::absorb(pm, env, joiners, &mut save).await,
        _ => Vec::new(),
    };
    // 4. Save state, correlation entries, outbox and acknowledgement at once.
    commit(pm, env, handling, save, batch).await
}

/// Step 1: the instance `handling` is for, as read now or (`true`) taken
/// from the first look, if that answers the same lookup.
async fn find(
    env: &DispatchEnv<'_>,
    handling: &Handling<'_>,
    first: Option<&LoadedInstance>,
) -> Result<Result<(Option<ProcessInstance>, bool), Verdict>, NotHandled> {
    let process = handling.def.name;
    let backend = env.backend;
    let looked = |key: &str, field: Option<&str>| {
        first
            .filter(|l| l.key == key && l.key_field.as_deref() == field)
            .map(|l| l.instance.clone())
    };
    let found = match &handling.lookup {
        Lookup::Id(id) | Lookup::Copy { id, .. } => match looked(id, None) {
            Some(found) => (found, true),
            None => (backend.process_load(process, id).await?, false),
        },
        Lookup::Field { field, value } => match looked(value, Some(field)) {
            Some(found) => (found, true),
            None => (backend.process_find(process, field, value).await?, false),
        },
        Lookup::Shared { field, value, .. } => {
            let ids = holders(backend, process, field, value).await?;
            match handling.among(ids) {
                Ok(None) => (None, false),
                Ok(Some(id)) => match looked(&id, None) {
                    Some(found) => (found, true),
                    None => (backend.process_load(process, &id).await?, false),
                },
                Err(verdict) => return Ok(Err(verdict)),
            }
        }
    };
    Ok(Ok(found))
}

/// Step 4: writes the handler's result; on a refusal, what the machine
/// makes of it.
async fn commit(
    pm: &dyn ErasedProcess,
    env: &DispatchEnv<'_>,
    handling: &Handling<'_>,
    mut save: Save,
    batch: Vec<Joined>,
) -> Result<Option<Dispatched>, NotHandled> {
    let process = handling.def.name;
    let delete = save.commit.effects.delete;
    let written = write(env, process, write_of(env, &mut save.commit, &batch)).await?;
    match written {
        Ok(version) => {
            let outcome = save.outcome();
            if let Some(instance) = save.commit.instance {
                if let Some(saved) = env.saved {
                    *saved.locked() = Some(saved_as(instance.clone(), version, delete));
                }
                for joined in batch {
                    joined.handled(&instance.id);
                }
            }
            Ok(Some(outcome))
        }
        Err(refused) => {
            if refused.refusal == Refusal::Conflict {
                if let Some(metrics) = env.metrics {
                    metrics.count_conflict(process);
                }
                let instance = save.instance().map(|i| i.id.as_str()).unwrap_or_default();
                tracing::debug!(process, %instance, "concurrent write; re-running the handler");
            }
            conclude(pm, env, handling, save.refused(refused.refusal)).await
        }
    }
}

/// Carries out a verdict: `None` to go again.
async fn conclude(
    pm: &dyn ErasedProcess,
    env: &DispatchEnv<'_>,
    handling: &Handling<'_>,
    verdict: Verdict,
) -> Result<Option<Dispatched>, NotHandled> {
    let process = handling.def.name;
    match verdict {
        Verdict::Reread => Ok(None),
        Verdict::Decided(mut decision) => {
            match decide(env, process, handling.envelope, &mut decision).await? {
                Ok(()) => Ok(Some(decision.outcome)),
                Err(refused) if decision.rereads_after(&refused.refusal) => Ok(None),
                Err(refused) => match decision.instead(&refused.refusal) {
                    Some(instead) => settled(env, process, handling.envelope, instead)
                        .await
                        .map(Some),
                    None => Err(refused.raw.into()),
                },
            }
        }
        Verdict::Fail(failing) => fail(pm, env, handling, *failing).await.map(Some),
    }
}

/// Asks `#[on_error]` and carries out its answer.
async fn fail(
    pm: &dyn ErasedProcess,
    env: &DispatchEnv<'_>,
    handling: &Handling<'_>,
    failing: Failing,
) -> Result<Dispatched, NotHandled> {
    let process = handling.def.name;
    let envelope = handling.envelope;
    let failure = handling.failure(&failing);
    // `#[on_error]` is user code too: a panic there stops the instance
    // rather than the worker.
    let action = std::panic::catch_unwind(AssertUnwindSafe(|| pm.on_error(&failure)))
        .unwrap_or_else(|_| {
            tracing::error!(process, message_type = %envelope.message_type, "#[on_error] panicked; stopping the instance");
            ErrorAction::Stop
        });
    let error = &failing.error;
    tracing::warn!(process, message_type = %envelope.message_type, %error, failures = failure.failures, ?action, "process handler failed");
    let decision = handling.failed(failing, action, &env.given());
    settled(env, process, envelope, decision).await
}

/// The instance as a commit left it, by its id, for the next handler of
/// it in this process (which may find it by id or by a value it holds:
/// see `worker::process`).
fn saved_as(mut instance: ProcessInstance, version: u64, deleted: bool) -> LoadedInstance {
    instance.version = version;
    instance.updated_at = Timestamp::now();
    LoadedInstance {
        key: instance.id.clone(),
        key_field: None,
        instance: (!deleted).then_some(instance),
    }
}

/// The instances holding `value` of the shared field `field`: those in
/// its set, and one saved before the field was shared, found by its old
/// exclusive entry (it joins the set on its next save).
pub(crate) async fn holders(
    backend: &dyn ProcessBackend,
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
