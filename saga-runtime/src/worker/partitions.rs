//! This engine's share of the process-manager partitions (see the Redis
//! backend's `partitions`): which partition streams its workers read.
//!
//! The share is renewed every heartbeat and trusted only for the TTL it was
//! granted for: an engine that cannot reach the backend stops reading the
//! partitions it can no longer prove it owns, since another engine may own
//! them by then. Each renewal names the partitions this engine still
//! handles messages of, which it keeps (unread) until they are done, even
//! when they were balanced to another engine: that engine reads the next
//! message of an instance only once this one finished the previous.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::worker::runtime::Runtime;

/// What this engine owns, as last granted.
pub(crate) struct Ownership {
    /// The first grant, which the workers wait for before their first read
    /// (else they would start on the shared stream alone).
    first: OnceCell<()>,
    state: Mutex<Grant>,
    /// How many messages of each partition this engine's workers handle.
    busy: [AtomicU32; 64],
}

impl Default for Ownership {
    fn default() -> Self {
        Ownership {
            first: OnceCell::new(),
            state: Mutex::default(),
            busy: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

/// One message of a partition being handled: counted in
/// [`Ownership::busy`] until dropped.
pub(crate) struct Busy {
    rt: Arc<Runtime>,
    partition: usize,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.rt.partitions.busy[self.partition].fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts `delivery` as in flight in its partition until the returned
/// guard drops; `None` for a message of no partition one engine reads.
pub(crate) fn busy(rt: &Arc<Runtime>, delivery: &crate::backend::Delivery) -> Option<Busy> {
    let partition = usize::from(rt.placement().owned_partition(delivery)?);
    let counter = rt.partitions.busy.get(partition)?;
    counter.fetch_add(1, Ordering::AcqRel);
    Some(Busy {
        rt: rt.clone(),
        partition,
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
        match *self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            Grant::Everything => u64::MAX,
            Grant::Owned(bits, until) if Instant::now() < until => bits,
            Grant::Owned(..) => 0,
        }
    }

    fn set(&self, grant: Grant) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = grant;
    }

    /// The partitions with a message in flight here, a bit each.
    fn busy(&self) -> u64 {
        let busy = self.busy.iter().map(|n| n.load(Ordering::Acquire) > 0);
        busy.enumerate()
            .filter(|(_, busy)| *busy)
            .fold(0, |mask, (k, _)| mask | 1 << k)
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
    match rt
        .placement()
        .process_partitions(&rt.instance, ttl(rt), rt.partitions.busy())
        .await
    {
        Ok(Some(bits)) => {
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
        .placement()
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
    if let Err(error) = rt.placement().announce_sagas(&rt.instance, runs, ttl).await {
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
    rt.partitions.set(Grant::Owned(0, Instant::now()));
    if let Err(error) = rt.placement().leave_process_partitions(&rt.instance).await {
        tracing::warn!(%error, "letting go of the process-manager partitions failed; others take them over when they expire");
    }
    let names = process_names(&rt);
    let _ = rt
        .placement()
        .announce_processes(&rt.instance, &names, None)
        .await;
}
