//! Flow-control limits as a worker applies them: asked before an attempt
//! (or a handler) starts, the slots it got held while it runs (renewed
//! with the task's lease), freed as soon as it ends, and the waiters a
//! freed slot was reserved for woken.
//!
//! A step's limits are asked in a fixed order, concurrency-only ones
//! first: a request refused by a later limit gives back the slots the
//! earlier ones granted, and asking the rate limits last means a refusal
//! by a slot spends no token.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::backend::{BackendError, LimitCause, LimitDecision, LimitRequest, QueueMessage};
use crate::error::Error;
use crate::limit::{LimitConfig, LimitSpec};
use crate::metrics;
use crate::process::ProcessDefinition;
use crate::saga::SagaDefinition;
use crate::worker::runtime::Runtime;
use std::collections::BTreeMap;

/// One concurrency slot an attempt holds.
struct Slot {
    name: &'static str,
    key: Option<String>,
    holder: String,
    config: LimitConfig,
}

/// The slots one attempt holds. Dropped, it frees them (in the
/// background): however the attempt ends, its slots do not wait out
/// their expiry.
pub(crate) struct HeldLimits {
    rt: Arc<Runtime>,
    slots: Vec<Slot>,
}

/// A limit that said "not now".
#[derive(Debug, Clone)]
pub(crate) struct NotNow {
    pub limit: &'static str,
    pub key: Option<String>,
    pub retry_after: Duration,
    pub ahead: u64,
    pub cause: LimitCause,
}

/// Who asks, and how to wake it.
pub(crate) struct Asker<'a> {
    /// Stable across its parks: the task and step (or the message and
    /// handler).
    pub waiter: &'a str,
    /// What a freed slot's wake carries: the message the parked task will
    /// wait as; `None` for one that does not queue.
    pub wake: Option<String>,
}

impl HeldLimits {
    /// Holds nothing.
    pub fn none(rt: &Arc<Runtime>) -> Self {
        HeldLimits {
            rt: rt.clone(),
            slots: Vec::new(),
        }
    }

    /// Asks every limit of `specs` for a start, in order; the first
    /// refusal gives back what the others granted.
    pub async fn acquire(
        rt: &Arc<Runtime>,
        specs: &'static [LimitSpec],
        input: &Value,
        asker: Asker<'_>,
    ) -> Result<Result<HeldLimits, NotNow>, BackendError> {
        let mut held = HeldLimits::none(rt);
        let hold_for = rt.lease_ttl();
        for spec in ordered(specs) {
            let key = match spec.key.map(|key| (key.of)(input)) {
                // An input that does not decode fails its step anyway,
                // before it calls anyone: not held up by a key it lacks.
                Some(Err(why)) => {
                    tracing::debug!(limit = spec.name, %why, "no limit key; not limited");
                    continue;
                }
                Some(Ok(key)) => Some(key),
                None => None,
            };
            let holder = uuid::Uuid::new_v4().simple().to_string();
            let request = LimitRequest {
                limit: spec.name,
                key: key.as_deref(),
                config: spec.config(),
                holder: &holder,
                waiter: asker.waiter,
                hold_for,
                wake: asker.wake.as_deref(),
            };
            let acquired = rt.limits().limit_acquire(&request).await;
            let slot = Slot {
                name: spec.name,
                key: key.clone(),
                holder,
                config: spec.config(),
            };
            let acquired = match acquired {
                Ok(acquired) => acquired,
                Err(error) => {
                    // The grant may have landed with its reply lost:
                    // released by token with the others (a release of a
                    // slot never granted frees nothing).
                    if spec.concurrency.is_some() {
                        held.slots.push(slot);
                    }
                    return Err(error);
                }
            };
            wake(rt, acquired.wake);
            match acquired.decision {
                LimitDecision::Granted => {
                    if spec.concurrency.is_some() {
                        held.slots.push(slot);
                    }
                }
                LimitDecision::Wait {
                    retry_after,
                    ahead,
                    cause,
                } => {
                    metrics::limit_waited(spec.name, cause);
                    return Ok(Err(NotNow {
                        limit: spec.name,
                        key,
                        retry_after,
                        ahead,
                        cause,
                    }));
                }
            }
        }
        Ok(Ok(held))
    }

    /// Whether it holds a slot of limit `name`.
    pub fn holds(&self, name: &str) -> bool {
        self.slots.iter().any(|s| s.name == name)
    }

    /// Frees the slots now, waiting for the store: for a task whose next
    /// step asks the same limit, which must find its own slot freed.
    pub async fn release(mut self) {
        for slot in std::mem::take(&mut self.slots) {
            free(&self.rt, slot).await;
        }
    }

    /// Renews the slots for `hold_for` more (the heartbeat's beat), all at
    /// once and for at most `within` (the beat must not miss the lease's
    /// deadline for a slow limit store). A slot found lost (it expired:
    /// the beat came too late) is counted: the attempt runs on, beyond the
    /// limit.
    pub async fn renew(&self, hold_for: Duration, within: Duration) {
        let renewals = self.slots.iter().map(|slot| async move {
            let renewed = self
                .rt
                .limits()
                .limit_renew(slot.name, slot.key.as_deref(), &slot.holder, hold_for)
                .await;
            (slot, renewed)
        });
        let Ok(all) = tokio::time::timeout(within, futures::future::join_all(renewals)).await
        else {
            tracing::debug!("renewing limit slots timed out; will retry");
            return;
        };
        for (slot, renewed) in all {
            match renewed {
                Ok(true) => {}
                Ok(false) => {
                    metrics::limit_slot_lost(slot.name);
                    tracing::warn!(limit = slot.name, key = ?slot.key, "a running attempt's limit slot expired before it was renewed; the limit may be exceeded by one until it ends");
                }
                Err(error) => {
                    tracing::debug!(%error, limit = slot.name, "renewing a limit slot failed; will retry")
                }
            }
        }
    }
}

/// Frees one slot and wakes whom it went to.
async fn free(rt: &Arc<Runtime>, slot: Slot) {
    let released = rt
        .limits()
        .limit_release(slot.name, slot.key.as_deref(), &slot.holder, slot.config)
        .await;
    match released {
        Ok(released) => wake(rt, released.wake),
        Err(error) => {
            tracing::debug!(%error, limit = slot.name, "freeing a limit slot failed; it expires on its own")
        }
    }
}

impl Drop for HeldLimits {
    fn drop(&mut self) {
        let slots = std::mem::take(&mut self.slots);
        if slots.is_empty() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let rt = self.rt.clone();
        let release = async move {
            for slot in slots {
                free(&rt, slot).await;
            }
        };
        self.rt.tasks.spawn_on(release, &handle);
    }
}

/// `waiter` stops waiting for `spec` (in the background): its place in
/// line, a slot reserved for it and its booked token go to the next.
pub(crate) fn leave(
    rt: &Arc<Runtime>,
    spec: &'static LimitSpec,
    key: Option<String>,
    waiter: String,
) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let task = rt.clone();
    let go = async move {
        let left = task
            .limits()
            .limit_leave(spec.name, key.as_deref(), &waiter, spec.config())
            .await;
        match left {
            Ok(left) => wake(&task, left.wake),
            Err(error) => {
                tracing::debug!(%error, limit = spec.name, "leaving a limit's line failed; the place lapses on its own")
            }
        }
    };
    rt.tasks.spawn_on(go, &handle);
}

/// The limits in the order they are asked: concurrency-only first, then
/// concurrency with a rate (a refused slot spends no token), rate-only
/// last, so that a refusal by a slot spends no token anywhere.
fn ordered(specs: &'static [LimitSpec]) -> impl Iterator<Item = &'static LimitSpec> {
    let mut all: Vec<&'static LimitSpec> = specs.iter().collect();
    all.sort_by_key(|s| (s.rate.is_some(), s.concurrency.is_none()));
    all.into_iter()
}

/// What a parked saga task's wake carries: the message it waits as.
pub(crate) fn wake_of(message: &QueueMessage) -> String {
    serde_json::to_string(message).unwrap_or_default()
}

/// Wakes the waiters a freed slot was reserved for (in the background). A
/// waiter whose park is not written yet (it asked a moment ago) is tried
/// again shortly; one that never parks lets its reservation expire.
fn wake(rt: &Arc<Runtime>, wakes: Vec<String>) {
    if wakes.is_empty() {
        return;
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let backend = rt.backend.clone();
    let deliver = async move {
        for raw in wakes {
            // A process-manager message has nothing to wake: it looks
            // again on its own.
            let Ok(message) = serde_json::from_str::<QueueMessage>(&raw) else {
                continue;
            };
            // A park's commit may land up to a second late (its write
            // rides out a dropped connection): keep trying past that.
            for delay_ms in [0u64, 20, 100, 500, 1000] {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                match backend.wake(&message).await {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(error) => {
                        tracing::debug!(%error, task_id = %message.task_id, "waking a parked task failed")
                    }
                }
            }
        }
    };
    rt.tasks.spawn_on(deliver, &handle);
}

/// A limit's declarations, gathered by name.
pub(crate) struct Declared {
    pub config: LimitConfig,
    pub keyed: bool,
    pub unkeyed: bool,
    pub used_by: Vec<String>,
}

/// Gathers the limits of `sagas` and `processes` by name; a name declared
/// with two configurations is an error naming both places.
pub(crate) fn declared<'a>(
    sagas: impl IntoIterator<Item = &'a SagaDefinition>,
    processes: impl IntoIterator<Item = &'a ProcessDefinition>,
) -> Result<BTreeMap<&'static str, Declared>, Error> {
    let mut uses: Vec<(String, &'static LimitSpec)> = Vec::new();
    for def in sagas {
        for step in def.steps {
            uses.extend(
                step.limits
                    .iter()
                    .map(|l| (format!("{}.{}", def.name, step.name), l)),
            );
        }
    }
    for def in processes {
        for handler in def.handlers {
            let at = format!("{}.{}", def.name, handler.method);
            uses.extend(handler.limits.iter().map(|l| (at.clone(), l)));
        }
    }
    let mut by_name: BTreeMap<&'static str, Declared> = BTreeMap::new();
    for (at, spec) in uses {
        let entry = by_name.entry(spec.name).or_insert_with(|| Declared {
            config: spec.config(),
            keyed: false,
            unkeyed: false,
            used_by: Vec::new(),
        });
        if entry.config != spec.config() {
            return Err(Error::Config(format!(
                "limit `{}` is declared with {} on {} but with {} on {at}: every use of a limit \
                 name must declare the same concurrency and rate (they spend one budget)",
                spec.name,
                entry.config,
                entry.used_by.join(", "),
                spec.config()
            )));
        }
        entry.keyed |= spec.key.is_some();
        entry.unkeyed |= spec.key.is_none();
        if !entry.used_by.contains(&at) {
            entry.used_by.push(at);
        }
    }
    // Sorted: the sagas come from a map, and what `engine.limits()` and
    // `GET /api/limits` show must not change order from run to run.
    for entry in by_name.values_mut() {
        entry.used_by.sort();
    }
    Ok(by_name)
}

/// Samples the use of every unkeyed concurrency limit this engine declares
/// (the housekeeping beat): one backend call each.
pub(crate) async fn sample(rt: &Runtime) {
    let Ok(declared) = declared(
        rt.sagas.all(),
        rt.processes.values().map(|p| p.definition()),
    ) else {
        return;
    };
    for (name, d) in declared {
        let Some(capacity) = d.config.concurrency.filter(|_| d.unkeyed) else {
            continue;
        };
        match rt.limits().limit_usage(name, None, d.config).await {
            Ok(usage) => metrics::limit_in_use(name, usage.in_use, capacity),
            Err(error) => tracing::debug!(%error, limit = name, "sampling a limit failed"),
        }
    }
}
