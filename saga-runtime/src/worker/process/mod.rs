//! Delivering one message to a process manager: the routing, correlation
//! and atomic save are `dispatch`'s (the driver of `process::machine`);
//! this adds what a worker owns: the pessimistic instance lease, keeping
//! the message alive while the handler runs, and metrics.

use std::future::Future;
use std::sync::Arc;

use tracing::Instrument;

mod batch;
pub(crate) mod dispatch;
mod handler;
pub(crate) mod instance_lock;
pub(crate) mod lanes;
mod metrics;

use batch::{Joined, Joiners};
use dispatch::{dispatch, DispatchEnv};
use instance_lock::{Cached, HeldLease, InstanceGuard, Locked};
pub(crate) use lanes::Ticket;
pub use metrics::ProcessMetrics;

use super::limits::{Asker, HeldLimits, NotNow};
use super::runtime::Runtime;
use crate::backend::{
    BackendError, Delivery, ForwardTo, LimitCause, LoadedInstance, ProcessBackend, ProcessRefusal,
};
use crate::limit::LimitSpec;
use crate::metrics::DeadLetterKind;
use crate::model::task::Timestamp;
use crate::process::{
    Concurrency, Correlation, Dispatched, Envelope, EnvelopeKind, ErasedProcess, ErrorAction,
    HandlerKind,
};
use crate::saga::state_machine::poison_reason;

/// What a delivered process-manager message is routed by: its process
/// manager, and the instance id or correlation value it names; `None`
/// for anything else, or a message whose routing cannot be told here.
pub(super) fn routed_by<'a>(rt: &Runtime, delivery: &'a Delivery) -> Option<(&'a str, String)> {
    let Ok(crate::backend::WorkItem::Process(envelope)) = &delivery.item else {
        return None;
    };
    let target = match &envelope.instance_id {
        Some(id) => id.clone(),
        None => {
            let pm = rt.processes.get(envelope.process.as_str())?;
            crate::process::routing_key(pm.as_ref(), &envelope.message_type, &envelope.payload).0?
        }
    };
    Some((envelope.process.as_str(), target))
}

/// The ticket of a message routed by `target` in its lane; `None` (it
/// goes on at once) for one whose routing cannot be told.
pub(super) fn lane(rt: &Runtime, target: Option<&(&str, String)>) -> Option<Ticket> {
    let (process, target) = target?;
    Some(rt.lanes.enter(format!("{process}:{target}")))
}

/// Handles one process-manager envelope; `lane`, its place among its
/// instance's messages, passes once it queued on the instance's lock.
pub(super) async fn handle(
    rt: &Arc<Runtime>,
    delivery: &Delivery,
    envelope: &Envelope,
    mut lane: Option<Ticket>,
) {
    if let Some(lane) = &lane {
        touching(rt, delivery, lane.turn()).await;
    }
    let Some(pm) = rt.processes.get(envelope.process.as_str()).cloned() else {
        return unknown(rt, delivery, envelope).await;
    };
    let process = pm.definition().name;
    if delivery.deliveries > rt.settings.max_deliveries {
        rt.metrics.count_dead_lettered(process);
        let reason = poison_reason(delivery.deliveries - 1);
        return super::dead_letter(rt, delivery, reason, None).await;
    }
    // One handler per instance at a time in this process; the next one
    // starts from the instance as the previous one saved it.
    let Some(target) = placed(rt, pm.as_ref(), delivery, envelope).await else {
        return;
    };
    let pessimistic = pm.definition().concurrency == Concurrency::Pessimistic;
    // A limited handler neither joins another's write nor takes others
    // into its own: each of its messages needs its own slot. It asks for
    // it once it holds its instance's lock (a slot held while waiting for
    // the lock would not be renewed).
    let limits = handler_limits(pm.as_ref(), envelope);
    let joins = !pessimistic && limits.1.is_empty();
    let mut local = match lock_local(rt, delivery, envelope, &target, !joins, &mut lane).await {
        Ok(local) => local,
        Err(outcome) => {
            rt.metrics.count_batched(process);
            return counted(rt, process, envelope, &outcome);
        }
    };
    let held = match limited(rt, (limits.0, limits.1), delivery, envelope).await {
        Ok(held) => held,
        Err(delay) => return super::release(rt, delivery, delay).await,
    };
    let Cached {
        instance: cached,
        lease: handed,
    } = local.as_mut().map(|l| l.take_cached()).unwrap_or_default();
    let waited = local.as_ref().is_some_and(|l| l.waited);
    let mut cached = remembered(pm.as_ref(), delivery, envelope, cached, waited);
    // The backend read the instance with the message; if another handler
    // of it ran meanwhile, that read is stale.
    let mut stale_read = waited;
    // Pessimistic mode: one handler per instance at a time, across
    // processes too, and its decisions are made on what it reads under
    // the lease: not the read that came with the message, and the
    // previous handler's save only if the lease passed on without a gap.
    let lease = if pessimistic {
        stale_read = true;
        let name = target.lease_name(&envelope.process);
        match leased(rt, name, handed, &mut cached).await {
            Some(lease) => Some(lease),
            None => return super::release(rt, delivery, rt.settings.lock_retry_delay).await,
        }
    } else {
        None
    };
    let saved = std::sync::Mutex::new(None);
    let subscribers = |t: &str| rt.subscribers(t);
    let routing_key = |process: &str, message_type: &str, payload: &serde_json::Value| match rt
        .processes
        .get(process)
    {
        Some(pm) => crate::process::routing_key(pm.as_ref(), message_type, payload),
        None => (None, None),
    };
    let Ok(backend) = rt.processes() else {
        // Not reached: an engine with a process manager is built only on a
        // backend with a process store.
        return super::release(rt, delivery, rt.settings.lock_retry_delay).await;
    };
    let env = DispatchEnv {
        backend,
        placement: rt.placement(),
        subscribers: &subscribers,
        routing_key: &routing_key,
        now_ms: Timestamp::now().0,
        delivery: Some(delivery),
        cached: cached.as_ref(),
        stale_read,
        saved: Some(&saved),
        dead_letter_unmatched: rt.settings.dead_letter_unmatched,
        hold_unmatched: rt.settings.hold_unmatched,
        handler_timeout: rt.settings.step_timeout,
        tombstone_ttl: rt.settings.process_tombstone_ttl,
        metrics: Some(&rt.metrics),
        joiners: local
            .as_ref()
            .filter(|_| !pessimistic && held.is_none())
            .map(|l| l as &dyn Joiners),
    };
    let span = tracing::info_span!(
        "process_message",
        process = %envelope.process,
        message_type = %envelope.message_type,
        message_id = %envelope.message_id,
    );
    crate::otel::continue_trace(&span, envelope.traceparent.as_deref(), None);
    let work = dispatch(pm.as_ref(), &env, envelope).instrument(span);
    let result = kept_alive(rt, delivery, lease.as_ref(), held.as_ref(), work).await;
    drop(held);
    let saved = saved.into_inner().unwrap_or_else(|p| p.into_inner());
    hand_over(rt, local.as_mut(), lease, saved, result.is_ok()).await;
    drop(local);
    match result {
        Ok(outcome) => counted(rt, process, envelope, &outcome),
        // The outbox is full: nothing is dropped, the message waits (an
        // operator needs to hear of it: its consumers are behind or gone).
        Err(dispatch::NotHandled::Refused(ProcessRefusal::EndpointFull { endpoint })) => {
            tracing::error!(process, %endpoint, message_id = %envelope.message_id, "endpoint full: the message is handed back until its consumers catch up");
            crate::metrics::endpoint_full(&endpoint);
            super::release(rt, delivery, ENDPOINT_FULL_RETRY).await;
        }
        Err(error) => {
            tracing::warn!(%error, "process message not recorded; it will be redelivered");
            super::release(rt, delivery, rt.settings.lock_retry_delay).await;
        }
    }
}

/// Asks the limits of the message's handler (`None`: it has none), or
/// says after how long to hand the message back: a message held back by a
/// limit is handed back answered, so the wait does not count towards its
/// delivery cap.
async fn limited(
    rt: &Arc<Runtime>,
    (method, limits): (&str, &'static [LimitSpec]),
    delivery: &Delivery,
    envelope: &Envelope,
) -> Result<Option<HeldLimits>, std::time::Duration> {
    if limits.is_empty() {
        return Ok(None);
    }
    let waiter = format!("{}:{}", envelope.message_id, method);
    // It waits in line like a saga step (so a saga sharing the limit's
    // name cannot keep it out), but nothing can wake it: it looks again
    // on its own, and a slot reserved for it waits for it meanwhile.
    let asker = Asker {
        waiter: &waiter,
        wake: Some(String::new()),
    };
    match HeldLimits::acquire(rt, limits, &envelope.payload, asker).await {
        Ok(Ok(held)) => Ok(Some(held)),
        Ok(Err(refused)) => {
            tracing::debug!(limit = refused.limit, message_id = %envelope.message_id, "held back by its limit; handed back");
            Err(handed_back_for(&refused, delivery))
        }
        Err(error) => {
            tracing::warn!(%error, "asking the handler's limits failed; message handed back");
            Err(rt.settings.lock_retry_delay)
        }
    }
}

/// The limits of the handler of `envelope`'s message type (none if it
/// has no handler here: the dispatch deals with that).
fn handler_limits(
    pm: &dyn ErasedProcess,
    envelope: &Envelope,
) -> (&'static str, &'static [LimitSpec]) {
    pm.definition()
        .handlers
        .iter()
        .find(|h| h.message_type == envelope.message_type)
        .map_or(("", &[]), |h| (h.method, h.limits))
}

/// How long a message a limit held back stays away: until its booked
/// token (a rate), or a share of a second (a slot: nothing wakes a
/// process-manager message, so it looks again soon, spread so that the
/// messages held back together do not all come back at once).
fn handed_back_for(refused: &NotNow, delivery: &Delivery) -> std::time::Duration {
    use std::hash::{Hash, Hasher};
    match refused.cause {
        LimitCause::Rate => refused.retry_after,
        LimitCause::Concurrency => {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            delivery.id.hash(&mut h);
            let spread = std::time::Duration::from_millis(h.finish() % 500);
            refused
                .retry_after
                .min(std::time::Duration::from_millis(500))
                + spread
        }
    }
}

/// Which instance the message is for, once it is where that instance's
/// keys are (a cluster keeps partitions apart: a message read from
/// another partition moves there first). `None`: it was moved, or handed
/// back.
async fn placed(
    rt: &Runtime,
    pm: &dyn ErasedProcess,
    delivery: &Delivery,
    envelope: &Envelope,
) -> Option<Target> {
    let target = match async { target(pm, rt.processes()?, delivery, envelope).await }.await {
        Ok(target) => target,
        Err(error) => {
            tracing::warn!(%error, "resolving the instance failed; message handed back");
            super::release(rt, delivery, rt.settings.lock_retry_delay).await;
            return None;
        }
    };
    match forward(rt, delivery, envelope, &target).await {
        Ok(true) => {
            rt.metrics.count_forwarded(pm.definition().name);
            None
        }
        Ok(false) => Some(target),
        Err(error) => {
            tracing::warn!(%error, "moving the message to its instance's partition failed; handed back");
            super::release(rt, delivery, rt.settings.lock_retry_delay).await;
            None
        }
    }
}

/// Takes this process's lock of the message's instance, if it has one.
/// Waiting behind other handlers may take a while: the message is kept
/// meanwhile, and (optimistic mode: see `process::batch`) offered to the
/// handler ahead to handle in its write: `Err` with its outcome if it
/// did.
async fn lock_local<'r>(
    rt: &'r Runtime,
    delivery: &Delivery,
    envelope: &Envelope,
    target: &Target,
    pessimistic: bool,
    lane: &mut Option<Ticket>,
) -> Result<Option<InstanceGuard<'r>>, Dispatched> {
    let mut queued = || {
        if let Some(lane) = lane.as_mut() {
            lane.pass();
        }
    };
    Ok(match target.local_name(&envelope.process) {
        Some(name) if pessimistic => {
            Some(touching(rt, delivery, rt.instance_locks.lock(name, &mut queued)).await)
        }
        Some(name) => {
            let offer = || Joined::new(envelope.clone(), delivery.clone());
            let lock = rt.instance_locks.lock_or_join(name, offer, &mut queued);
            match touching(rt, delivery, lock).await {
                Locked::Held(guard) => Some(guard),
                Locked::Handled(outcome) => return Err(outcome),
            }
        }
        None => None,
    })
}

/// What this process remembers of the instance, as the message looks it
/// up (by id, or by a value it holds). Found with the lock free (not
/// `waited`), that may be older than the read taken with the message
/// (another process wrote it since, or deleted and created it again):
/// used only if it is that instance, that generation, and not older.
fn remembered(
    pm: &dyn ErasedProcess,
    delivery: &Delivery,
    envelope: &Envelope,
    cached: Option<LoadedInstance>,
    waited: bool,
) -> Option<LoadedInstance> {
    let cached =
        cached.and_then(|c| crate::process::lookup(pm, envelope).and_then(|l| c.found_by(l)));
    if waited {
        return cached;
    }
    let remembered = cached.as_ref().and_then(|c| c.instance.as_ref());
    let read = delivery
        .instance
        .as_deref()
        .and_then(|r| r.instance.as_ref());
    let current = match (remembered, read) {
        (Some(c), Some(r)) => {
            c.id == r.id && c.generation == r.generation && c.version >= r.version
        }
        _ => false,
    };
    cached.filter(|_| current)
}

/// Takes the pessimistic lease `name` (or goes on under the one the
/// previous handler here handed over, if fresh enough); `None` if it is
/// held elsewhere or the store did not answer. Without a handed lease,
/// what the previous handler saved (`cached`) may predate another
/// process's write: it is dropped.
async fn leased(
    rt: &Arc<Runtime>,
    name: String,
    handed: Option<HeldLease>,
    cached: &mut Option<LoadedInstance>,
) -> Option<NamedLeaseGuard> {
    let backend = rt.leases();
    // A lease left by the previous handler under another name (the
    // starter of a new instance held its correlation value's; this
    // message finds the instance by its id) is released, or it would
    // stay held for its TTL.
    let handed = match handed {
        Some(other) if other.name != name => {
            let _ = backend.release_named_lease(&other.name, &other.token).await;
            None
        }
        handed => handed,
    };
    if handed.is_none() {
        *cached = None;
    }
    // A handed lease fresh enough is used as it is.
    let since = handed.as_ref().map(|l| l.since);
    let fresh = since.is_some_and(|at| at.elapsed() < rt.lease_ttl() / 2);
    let was_handed = handed.is_some();
    let token = handed
        .map(|l| l.token)
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    let held = fresh
        || matches!(
            backend.named_lease(&name, &token, rt.lease_ttl()).await,
            Ok(true)
        );
    if !held {
        if was_handed {
            // Not renewed (the store failed to answer): let it go
            // rather than leave it held for its TTL.
            let _ = backend.release_named_lease(&name, &token).await;
        }
        return None;
    }
    Some(NamedLeaseGuard {
        rt: rt.clone(),
        name,
        token,
        since: match (fresh, since) {
            (true, Some(at)) => at,
            _ => tokio::time::Instant::now(),
        },
    })
}

/// Runs `work` (the dispatch), keeping the message (and the pessimistic
/// lease) alive while the handler and its conflict re-runs take their
/// time, so no other worker takes the message over meanwhile.
async fn kept_alive<T>(
    rt: &Runtime,
    delivery: &Delivery,
    lease: Option<&NamedLeaseGuard>,
    limits: Option<&HeldLimits>,
    work: impl Future<Output = T>,
) -> T {
    let keep_alive = async {
        loop {
            tokio::time::sleep(rt.heartbeat_every()).await;
            let _ = rt.backend.touch(delivery).await;
            if let Some(limits) = limits {
                limits.renew(rt.lease_ttl(), rt.heartbeat_every()).await;
            }
            if let Some(lease) = lease {
                let _ = rt
                    .leases()
                    .named_lease(&lease.name, &lease.token, rt.lease_ttl())
                    .await;
            }
        }
    };
    tokio::select! {
        done = work => done,
        never = keep_alive => never,
    }
}

/// Leaves the next handler of the instance in this process what it starts
/// from: the instance as this one `saved` it and, if one waits and this
/// one went well, the pessimistic lease (released otherwise).
async fn hand_over(
    rt: &Runtime,
    local: Option<&mut InstanceGuard<'_>>,
    lease: Option<NamedLeaseGuard>,
    saved: Option<LoadedInstance>,
    ok: bool,
) {
    let mut handover = Cached {
        instance: saved,
        lease: None,
    };
    if let Some(mut lease) = lease {
        let (name, token) = (
            std::mem::take(&mut lease.name),
            std::mem::take(&mut lease.token),
        );
        match local.as_ref().is_some_and(|l| l.has_waiters()) && ok {
            // The next handler of the instance here goes on under it.
            true => {
                handover.lease = Some(HeldLease {
                    name,
                    token,
                    since: lease.since,
                })
            }
            // Release inline; the guard's spawned release is for abnormal
            // exits.
            false => {
                let _ = rt.leases().release_named_lease(&name, &token).await;
            }
        }
    }
    if let Some(local) = local {
        local.set_cached(handover);
    }
}

/// How long a message whose write an endpoint refused (full) stays away.
const ENDPOINT_FULL_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// The `process` label of a message for a process manager this engine
/// does not run (the name comes from the message: not a label).
pub(super) const UNKNOWN: &str = "unknown";

/// Counts a dispatched message's outcome: in the engine's
/// `ProcessMetrics` and, with the `metrics` feature, as metrics (a
/// timeout delivered, a message parked on the dead-letter queue).
fn counted(rt: &Runtime, process: &'static str, envelope: &Envelope, outcome: &Dispatched) {
    rt.metrics.count(process, outcome);
    if envelope.kind == EnvelopeKind::Timeout {
        let late = envelope
            .due_ms
            .map(|due| crate::model::task::Timestamp::now().0.saturating_sub(due));
        crate::metrics::timeout_fired(process, late.map(std::time::Duration::from_millis));
    }
    let parked = match outcome {
        Dispatched::DeadLettered { .. } => true,
        Dispatched::Unmatched { dead_lettered, .. } => *dead_lettered,
        Dispatched::Failed { action, .. } => *action == ErrorAction::Stop,
        _ => false,
    };
    if parked {
        crate::metrics::dead_lettered(DeadLetterKind::Process);
    }
}

/// Runs `work`, touching `delivery` every heartbeat so that no other
/// worker takes it over meanwhile.
async fn touching<T>(rt: &Runtime, delivery: &Delivery, work: impl Future<Output = T>) -> T {
    tokio::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = tokio::time::sleep(rt.heartbeat_every()) => {
                let _ = rt.backend.touch(delivery).await;
            }
        }
    }
}

/// A message for a process manager this worker does not run: a process
/// that runs only sagas, or an older version during a rolling deploy that
/// adds the process manager. Like a saga it does not know, it goes back
/// with growing delays for a worker that runs it, and is dead-lettered only
/// past the delivery cap.
async fn unknown(rt: &Runtime, delivery: &Delivery, envelope: &Envelope) {
    let mut known: Vec<_> = rt.processes.keys().copied().collect();
    known.sort_unstable();
    // On a partition this engine owns, no engine that runs it would ever
    // see it: it goes where every engine reads.
    match rt.placement().share(delivery).await {
        Ok(true) => {
            tracing::debug!(process = %envelope.process, "not run here; moved to the shared stream");
            return;
        }
        Ok(false) => {}
        Err(error) => tracing::debug!(%error, "moving the message to the shared stream failed"),
    }
    // Another engine runs it: back at once, as an answered delivery (not
    // counted toward the cap), for that engine to take. Only with none
    // alive (a rolling deploy that adds it) does it wait with growing
    // delays.
    match rt.runners().process_runner_alive(&envelope.process).await {
        Ok(true) => {
            tracing::debug!(process = %envelope.process, "run by another engine; handed back");
            return super::release(rt, delivery, rt.settings.lock_retry_delay).await;
        }
        Ok(false) => {}
        Err(error) => tracing::debug!(%error, "could not tell whether another engine runs it"),
    }
    let why = format!(
        "unknown process manager `{}` (this worker runs [{}])",
        envelope.process,
        known.join(", ")
    );
    if delivery.deliveries <= rt.settings.max_deliveries {
        let delay = super::another_version_delay(delivery.deliveries);
        tracing::warn!(?delay, "{why}; handed back for a worker that runs it");
        if let Err(error) = rt.backend.defer(delivery, delay).await {
            tracing::debug!(%error, "handing the message back failed; it is redelivered after the visibility timeout");
        }
        return;
    }
    rt.metrics.count_dead_lettered(UNKNOWN);
    let reason = format!(
        "{why}; no worker that runs it took the message in {} deliveries: requeue it once one is deployed",
        delivery.deliveries - 1
    );
    super::dead_letter(rt, delivery, reason, None).await
}

/// Moves `delivery` to the partition of the instance it is for (by id:
/// the envelope names it from then on) or of the value it may create one
/// under, if the backend keeps it elsewhere; `true` if moved.
async fn forward(
    rt: &Runtime,
    delivery: &Delivery,
    envelope: &Envelope,
    target: &Target,
) -> Result<bool, BackendError> {
    let to = match target {
        Target::Id(id) => ForwardTo::Instance(id),
        Target::Value(value) => ForwardTo::Value(value),
        // It writes no instance: whatever it sends goes on from here.
        Target::Unknown(_) => return Ok(false),
    };
    rt.placement().forward(delivery, envelope, to).await
}

/// Which instance a message is for, as far as can be told before its
/// handler runs: what both the in-process lock and the pessimistic lease
/// are named after.
enum Target {
    /// This instance.
    Id(String),
    /// None holds this value yet: the message may create one, and its
    /// racing starters queue on the value.
    Value(String),
    /// Several or unknown (a message to fan out, or an ambiguous one): it
    /// writes no instance itself.
    Unknown(String),
}

impl Target {
    fn local_name(&self, process: &str) -> Option<String> {
        match self {
            Target::Id(id) => Some(format!("{process}\0{id}")),
            Target::Value(value) => Some(format!("{process}\0\0{value}")),
            Target::Unknown(_) => None,
        }
    }

    fn lease_name(&self, process: &str) -> String {
        match self {
            Target::Id(id) => format!("pm-lock:{process}:{id}"),
            Target::Value(key) | Target::Unknown(key) => format!("pm-lock:{process}:new:{key}"),
        }
    }
}

/// Resolves a message's instance: by its id where the message names it
/// (a timeout, a copy of a fanned-out message, a correlation id), else by
/// the read that came with the message, else by a lookup of the value.
async fn target(
    pm: &dyn ErasedProcess,
    backend: &dyn ProcessBackend,
    delivery: &Delivery,
    envelope: &Envelope,
) -> Result<Target, BackendError> {
    let process = &envelope.process;
    let def = pm.definition();
    let key = || {
        pm.message_key(&envelope.message_type, &envelope.payload)
            .ok()
            .flatten()
            .unwrap_or_default()
    };
    let Some(handler) = def.handler(&envelope.message_type) else {
        return Ok(Target::Unknown(String::new()));
    };
    let field = match handler.correlation {
        Correlation::Field { state_field, .. } => state_field,
        // Correlated by id, the instance's id is the key itself, whether or
        // not the instance exists yet.
        Correlation::Id => return Ok(Target::Id(key())),
        Correlation::Instance => {
            return Ok(Target::Id(envelope.instance_id.clone().unwrap_or_default()))
        }
    };
    let value = key();
    if def.is_shared(field) {
        let many = matches!(handler.kind, HandlerKind::Handles { many: true, .. });
        if let (true, Some(id)) = (many, &envelope.instance_id) {
            return Ok(Target::Id(id.clone()));
        }
        let ids = dispatch::holders(backend, process, field, &value).await?;
        return Ok(match ids.as_slice() {
            [id] => Target::Id(id.clone()),
            [] => Target::Value(value),
            _ => Target::Unknown(value),
        });
    }
    let read = delivery
        .instance
        .as_deref()
        .filter(|l| l.key == value && l.key_field.as_deref() == Some(field));
    let found = match read {
        Some(read) => read.instance.as_ref().map(|i| i.id.clone()),
        None => backend
            .process_find(process, field, &value)
            .await?
            .map(|i| i.id),
    };
    Ok(match found {
        Some(id) => Target::Id(id),
        None => Target::Value(value),
    })
}

/// Releases a pessimistic lease however handling ends (including the
/// future being dropped at shutdown).
struct NamedLeaseGuard {
    rt: Arc<Runtime>,
    name: String,
    token: String,
    /// When it was taken or last renewed (before the handler ran).
    since: tokio::time::Instant,
}

impl Drop for NamedLeaseGuard {
    fn drop(&mut self) {
        if self.name.is_empty() {
            return; // released already
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let rt = self.rt.clone();
            let (name, token) = (
                std::mem::take(&mut self.name),
                std::mem::take(&mut self.token),
            );
            let release = async move {
                let _ = rt.leases().release_named_lease(&name, &token).await;
            };
            self.rt.tasks.spawn_on(release, &handle);
        }
    }
}
