//! This engine's share of the process-manager partitions (see the Redis
//! backend's `partitions`): which partition streams its workers read.
//!
//! The share is renewed every heartbeat and trusted only for the TTL it was
//! granted for: an engine that cannot reach the backend stops reading the
//! partitions it can no longer prove it owns, since another engine may own
//! them by then.
//!
//! A partition balanced to another engine is handed over only once this
//! one is done with it, so that the other reads the next message of an
//! instance only after this one handled the previous: each renewal names
//! the partitions to keep (renewed, no longer read) though balanced away:
//! those of the last grant (a read may have begun on it just before this
//! renewal), of the read in progress, and of the messages being handled.
//! A partition is kept so at most [`KEEP_LEASES`] TTLs (a handler that
//! blocks its thread must not keep the newcomer out for ever; versioning
//! settles what overlaps then). A shutdown keeps them the same way until
//! its messages are done, then leaves.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::util::Unpoisoned;
use crate::worker::runtime::Runtime;

/// What this engine owns, as last granted.
pub(crate) struct Ownership {
    /// The first grant, which the workers wait for before their first read
    /// (else they would start on the shared stream alone).
    first: OnceCell<()>,
    state: Mutex<Grant>,
    /// How many messages of each partition this engine's workers handle.
    busy: [AtomicU32; 64],
    /// The partitions of the read in progress (the worker loops of an
    /// engine read one at a time: `Runtime::reading`).
    reading: AtomicU64,
    /// Since when each partition is kept though balanced away.
    kept: Mutex<[Option<Instant>; 64]>,
}

/// How many TTLs a partition balanced away is kept at most for its
/// messages in flight.
const KEEP_LEASES: u32 = 10;

impl Default for Ownership {
    fn default() -> Self {
        Ownership {
            first: OnceCell::new(),
            state: Mutex::default(),
            busy: std::array::from_fn(|_| AtomicU32::new(0)),
            reading: AtomicU64::new(0),
            kept: Mutex::new([None; 64]),
        }
    }
}

/// A worker loop's turn to read (`Runtime::reading`), held until the
/// messages it read are counted in their partitions: meanwhile the
/// partitions it reads count as in use.
pub(crate) struct ReadTurn<'a> {
    rt: &'a Runtime,
    _turn: tokio::sync::MutexGuard<'a, ()>,
}

impl<'a> ReadTurn<'a> {
    pub(crate) fn new(rt: &'a Runtime, turn: tokio::sync::MutexGuard<'a, ()>) -> Self {
        ReadTurn { rt, _turn: turn }
    }

    /// Records the partitions this read covers.
    pub(crate) fn reads(&self, partitions: u64) {
        self.rt
            .partitions
            .reading
            .store(partitions, Ordering::Release);
    }
}

impl Drop for ReadTurn<'_> {
    /// Before the turn passes (its fields drop after this).
    fn drop(&mut self) {
        self.rt.partitions.reading.store(0, Ordering::Release);
    }
}

/// One message being handled: counted in [`Ownership::busy`] in the
/// partition it was read from and in the one the next message of what it
/// is for goes to (the same, but for a message moved or read from a
/// stream every engine reads), until dropped.
pub(crate) struct Busy {
    rt: Arc<Runtime>,
    partitions: [Option<usize>; 2],
}

impl Drop for Busy {
    fn drop(&mut self) {
        for k in self.partitions.into_iter().flatten() {
            self.rt.partitions.busy[k].fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Counts `delivery` (routed by `target`: its process manager and what it
/// names) as in flight in its partitions until the returned guard drops;
/// `None` for a message of no partition one engine reads.
pub(crate) fn busy(
    rt: &Arc<Runtime>,
    delivery: &crate::backend::Delivery,
    target: Option<&(&str, String)>,
) -> Option<Busy> {
    let placement = rt.placement();
    let read = placement.owned_partition(delivery);
    let next = target.and_then(|(process, target)| placement.target_partition(process, target));
    let valid = |k: Option<u16>| k.map(usize::from).filter(|k| *k < 64);
    let (read, next) = (valid(read), valid(next));
    let partitions = match next == read {
        true => [read, None],
        false => [read, next],
    };
    if partitions == [None, None] {
        return None;
    }
    for k in partitions.into_iter().flatten() {
        rt.partitions.busy[k].fetch_add(1, Ordering::AcqRel);
    }
    Some(Busy {
        rt: rt.clone(),
        partitions,
    })
}

#[derive(Clone, Copy)]
enum Grant {
    /// The backend does not partition: read everything.
    Everything,
    /// These partitions (a bit each) until then.
    Owned(u64, Instant),
}

impl Default for Grant {
    fn default() -> Self {
        Grant::Owned(0, Instant::now())
    }
}

impl Ownership {
    fn now(&self) -> u64 {
        match *self.state.locked() {
            Grant::Everything => u64::MAX,
            Grant::Owned(bits, until) if Instant::now() < until => bits,
            Grant::Owned(..) => 0,
        }
    }

    fn set(&self, grant: Grant) {
        *self.state.locked() = grant;
    }

    /// The partitions with a message in flight here, a bit each.
    fn busy(&self) -> u64 {
        let busy = self.busy.iter().map(|n| n.load(Ordering::Acquire) > 0);
        busy.enumerate()
            .filter(|(_, busy)| *busy)
            .fold(0, |mask, (k, _)| mask | 1 << k)
    }

    /// The partitions read or with a message handled here now.
    fn in_use(&self) -> u64 {
        self.reading.load(Ordering::Acquire) | self.busy()
    }

    /// The partitions to keep though balanced away (see the module
    /// documentation): but those kept for `longest` already.
    fn keep(&self, longest: Duration) -> u64 {
        let granted = match *self.state.locked() {
            Grant::Owned(bits, _) => bits,
            Grant::Everything => 0,
        };
        let wanted = granted | self.in_use();
        let kept = self.kept.locked();
        let expired = kept
            .iter()
            .enumerate()
            .filter_map(|(k, since)| match since {
                Some(since) if since.elapsed() >= longest => Some(1u64 << k),
                _ => None,
            });
        wanted & !expired.fold(0, |mask, bit| mask | bit)
    }

    /// Notes which of `keep` the backend left this engine without
    /// granting them (kept since now, if not before).
    fn note_kept(&self, keep: u64, granted: u64) {
        let mut kept = self.kept.locked();
        for (k, since) in kept.iter_mut().enumerate() {
            match (keep & !granted) & (1 << k) != 0 {
                true => *since = since.or(Some(Instant::now())),
                false => *since = None,
            }
        }
    }
}

/// The partitions this engine's workers read now: after the first grant.
pub(crate) async fn owned(rt: &Runtime) -> u64 {
    rt.partitions.first.get_or_init(|| renew(rt)).await;
    rt.partitions.now()
}

/// How long a grant lasts: the task lease's TTL, so that partitions of an
/// engine that died are taken over on the scale its messages are.
fn ttl(rt: &Runtime) -> Duration {
    rt.lease_ttl()
}

/// Asks the backend for this engine's share and records the grant.
async fn renew(rt: &Runtime) {
    let asked = Instant::now();
    let keep = rt.partitions.keep(ttl(rt) * KEEP_LEASES);
    match rt
        .placement()
        .process_partitions(&rt.instance, ttl(rt), keep)
        .await
    {
        Ok(Some(bits)) => {
            rt.partitions.note_kept(keep, bits);
            let before = rt.partitions.now();
            if bits != before {
                tracing::info!(
                    owned = bits.count_ones(),
                    "process-manager partitions rebalanced"
                );
            }
            rt.partitions.set(Grant::Owned(bits, asked + ttl(rt)));
        }
        Ok(None) => rt.partitions.set(Grant::Everything),
        Err(error) => {
            tracing::warn!(%error, "renewing the process-manager partitions failed; will retry")
        }
    }
    let names = process_names(rt);
    if let Err(error) = rt
        .runners()
        .announce_processes(&rt.instance, &names, Some(ttl(rt)))
        .await
    {
        tracing::warn!(%error, "announcing the process managers this engine runs failed; will retry");
    }
}

fn process_names(rt: &Runtime) -> Vec<&'static str> {
    rt.processes.keys().copied().collect()
}

/// Every form under which this engine announces the saga versions it runs
/// (see `saga_runs`): a few per registered version.
fn saga_runs(rt: &Runtime) -> Vec<String> {
    let mut runs = Vec::new();
    for latest in rt.sagas.latest() {
        for version in rt.sagas.versions(latest.name).unwrap_or_default() {
            if let Some(saga) = rt.sagas.get(latest.name, version) {
                let def = saga.definition();
                runs.extend(crate::backend::saga_runs(
                    def.name,
                    def.version,
                    &def.fingerprint_hex(),
                ));
            }
        }
    }
    runs.sort();
    runs.dedup();
    runs
}

/// Announces the saga versions this engine runs for the next `ttl`
/// (`None`: leaving), so that an engine lacking a task's version hands
/// its message back at once and uncounted while this one runs it.
async fn announce_sagas(rt: &Runtime, runs: &[String], ttl: Option<Duration>) {
    if runs.is_empty() {
        return;
    }
    if let Err(error) = rt.runners().announce_sagas(&rt.instance, runs, ttl).await {
        tracing::warn!(%error, "announcing the saga versions this engine runs failed; will retry");
    }
}

/// Keeps this engine's share renewed (and what it runs announced) until it
/// shuts down, then lets go of it so that the others take it over at once.
pub(crate) async fn run(rt: Arc<Runtime>) {
    let runs = saga_runs(&rt);
    if rt.processes.is_empty() && runs.is_empty() {
        return;
    }
    let processes = !rt.processes.is_empty();
    if processes {
        owned(&rt).await;
    }
    announce_sagas(&rt, &runs, Some(ttl(&rt))).await;
    loop {
        tokio::select! {
            _ = rt.shutdown.cancelled() => break,
            _ = tokio::time::sleep(rt.heartbeat_every()) => {
                if processes {
                    renew(&rt).await;
                }
                announce_sagas(&rt, &runs, Some(ttl(&rt))).await;
            }
        }
    }
    announce_sagas(&rt, &runs, None).await;
    if !processes {
        return;
    }
    leave(&rt).await;
    let names = process_names(&rt);
    let _ = rt
        .runners()
        .announce_processes(&rt.instance, &names, None)
        .await;
}

/// Leaves the partitions: at once those this engine is done with, the
/// others once their messages are (the workers drain them within their
/// shutdown grace, or give them back), or after [`KEEP_LEASES`] TTLs.
async fn leave(rt: &Runtime) {
    let state = &rt.partitions.state;
    let grant = std::mem::take(&mut *state.locked());
    if let Grant::Everything = grant {
        // The backend does not partition: nothing to leave.
        return;
    }
    let until = Instant::now() + ttl(rt) * KEEP_LEASES;
    let mut busy = rt.partitions.in_use();
    loop {
        let placement = rt.placement();
        let left = placement.leave_process_partitions(&rt.instance, busy, ttl(rt));
        if let Err(error) = left.await {
            tracing::warn!(%error, "letting go of the process-manager partitions failed; others take them over when they expire");
            return;
        }
        if busy == 0 {
            return;
        }
        tokio::time::sleep(rt.heartbeat_every()).await;
        busy = match Instant::now() < until {
            true => rt.partitions.in_use(),
            false => 0,
        };
    }
}
