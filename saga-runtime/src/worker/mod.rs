//! Workers: the loop that takes messages off the queue and the background
//! duties (timers, housekeeping) that keep a deployment healthy.
//!
//! Everything that runs lives here:
//!
//! - [`run`] (this file): receive, route by kind, cap poison messages;
//! - `runtime`: what the engine and its workers share (the backend and the
//!   coordination it offers or this process stands in for, the registered
//!   definitions, settings, breakers, running tasks' tokens);
//! - `saga/`: advance one saga task as far as one delivery may, driving
//!   the pure `saga::state_machine` (attempt, call, commit, breaker,
//!   versions this engine does not run);
//! - `lease`: keep a task's lease and message alive while a step runs;
//! - `isolation`: a message recovered from a worker that died runs alone,
//!   so that its crash costs no other message a delivery;
//! - `process/`: deliver one message to a process manager, driving the
//!   pure `process::machine` (dispatch, the handler's run, batching,
//!   instance locks, counters);
//! - `limits`: flow control (`#[limit]`) around a step or a handler: ask
//!   for a grant, wait in line, release the slot;
//! - `partitions`: this engine's share of the process-manager partitions;
//! - `endpoint`: an endpoint consumer's loop;
//! - `timers`: move due retries and timeouts onto the queue;
//! - `housekeeping`: retention (expired tasks, dead letters, idle consumers);
//! - `transports`, `bridge`, `relay`: brokers in (a route's deliveries
//!   into the store) and out (an endpoint's messages to the broker), each
//!   duty under a named lease (`held_lease`) so that one engine does it.

pub(crate) mod bridge;
pub(crate) mod endpoint;
mod held_lease;
mod housekeeping;
pub(crate) mod isolation;
mod lease;
pub(crate) mod limits;
pub(crate) mod partitions;
pub(crate) mod process;
mod relay;
pub(crate) mod runtime;
mod saga;
mod timers;
pub(crate) mod transports;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::task::JoinSet;

pub(crate) use housekeeping::run as housekeeping;
pub(crate) use partitions::run as partitions;
pub(crate) use timers::run as timers;

use crate::backend::{Delivery, Interest, Locked, TakenLease, WorkItem};
use crate::metrics::DeadLetterKind;
use runtime::Runtime;

/// How long a worker with free slots (but more than half busy) waits for
/// more to free up before it reads.
const BATCH_WINDOW: Duration = Duration::from_millis(2);

/// Time a handling that outlived the shutdown grace gets to record where it
/// stopped (an interrupted attempt's commit) before it is dropped.
const HANDOVER: Duration = Duration::from_secs(10);

/// Pulls messages until the engine shuts down, working on up to
/// `worker_concurrency` of them at once, each as a task of its own.
///
/// With more than half of its slots busy it waits a moment
/// ([`BATCH_WINDOW`]) for more to free up before it reads, up to the number
/// free: under load reads come in batches (one round trip for several
/// messages), and a slot left free beside long steps is filled all the
/// same once the moment is over.
///
/// On shutdown the read in flight is let finish (it returns within the
/// receive wait) and whatever it got is handed back; the messages being
/// worked on finish within the grace period or are handed back: a message
/// a leaving worker took must not wait out the visibility timeout.
pub(crate) async fn run(rt: Arc<Runtime>, name: String) {
    let consumer = format!("{}-{name}", rt.instance);
    let mut backoff = ErrorBackoff::default();
    let mut interest = Interest {
        sagas: !rt.sagas.is_empty(),
        processes: !rt.processes.is_empty(),
        process_partitions: 0,
    };
    let limit = rt.settings.worker_concurrency.max(1);
    let mut running: JoinSet<u64> = JoinSet::new();
    // What is being worked on, to hand back if the shutdown grace runs
    // out; keyed by a number of this loop's (a message delivered twice to
    // this consumer must not stand for the other).
    let mut holding: HashMap<u64, Arc<Delivery>> = HashMap::new();
    let mut taken = 0u64;
    while !rt.shutdown.is_cancelled() {
        let window = tokio::time::sleep(BATCH_WINDOW);
        tokio::pin!(window);
        let mut window_over = false;
        while running.len() >= limit || (running.len() > limit / 2 && !window_over) {
            tokio::select! {
                done = running.join_next() => settled(&mut holding, done),
                _ = &mut window, if !window_over => window_over = true,
                _ = rt.shutdown.cancelled() => break,
            }
        }
        if rt.shutdown.is_cancelled() {
            break;
        }
        // A message recovered from a dead worker runs alone: no new one
        // is read meanwhile (it would only be handed back).
        tokio::select! {
            _ = isolation::settled(&rt) => {}
            _ = rt.shutdown.cancelled() => break,
        }
        // Held until the messages read have their tickets.
        let Some(reading) = read_turn(&rt, &mut interest, &mut running, &mut holding).await else {
            break;
        };
        let free = limit - running.len();
        let receive = rt.backend.receive_many(
            &consumer,
            interest,
            rt.settings.receive_wait,
            free,
            running.len(),
        );
        tokio::pin!(receive);
        // A read is never dropped half-way (what it took would wait out
        // the visibility timeout); the work in flight is reaped meanwhile.
        let received = loop {
            tokio::select! {
                received = &mut receive => break received,
                done = running.join_next(), if !running.is_empty() => settled(&mut holding, done),
            }
        };
        match received {
            // An empty read is a success too: the backend answered.
            Ok(deliveries) if deliveries.is_empty() => backoff.reset(),
            Ok(deliveries) if rt.shutdown.is_cancelled() => {
                hand_back_all(&rt, &deliveries).await;
            }
            Ok(deliveries) => {
                backoff.reset();
                for delivery in deliveries {
                    taken += 1;
                    // Decided here, before the next read: nothing is read
                    // beside a recovered message that is to run alone.
                    let ticket = isolation::ticket(&rt, &delivery);
                    // Its place among its instance's messages, taken in the
                    // order read (see `process::lanes`).
                    let target = process::routed_by(&rt, &delivery);
                    let lane = process::lane(&rt, target.as_ref());
                    // Its partitions stay this engine's until it is done.
                    let busy = partitions::busy(&rt, &delivery, target.as_ref());
                    drop(target);
                    let (delivery, lease) = split_lease(delivery);
                    let delivery = Arc::new(delivery);
                    holding.insert(taken, delivery.clone());
                    let places = (ticket, lane, busy);
                    running.spawn(work(rt.clone(), delivery, lease, places, taken));
                }
            }
            Err(error) => {
                drop(reading);
                let delay = backoff.next();
                tracing::warn!(%error, ?delay, "receiving a message failed; retrying");
                tokio::select! {
                    _ = rt.shutdown.cancelled() => {}
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    // A running step is stopped by its own handling once the grace is over
    // (and its interruption committed); this is the backstop for anything
    // else that would hold the shutdown up.
    let settings = &rt.settings;
    let backstop = settings.shutdown_grace + settings.stop_grace + HANDOVER;
    let drained = tokio::time::timeout(backstop, async {
        while let Some(done) = running.join_next().await {
            settled(&mut holding, Some(done));
        }
    })
    .await;
    if drained.is_err() {
        running.abort_all();
        while running.join_next().await.is_some() {}
        let left: Vec<Delivery> = holding.into_values().map(Arc::unwrap_or_clone).collect();
        tracing::warn!(
            messages = left.len(),
            "shutdown grace period over; handing the messages back"
        );
        hand_back_all(&rt, &left).await;
    }
    if let Err(error) = rt.backend.leave(&consumer).await {
        tracing::warn!(%error, "handing back this worker's buffered messages failed; they are redelivered after the visibility timeout");
    }
}

/// This loop's turn to read (`Runtime::reading`), for an engine that
/// runs process managers (`Some(None)` for one that does not), with the
/// partitions it reads now in `interest`; `None`: the engine is shutting
/// down. The work in flight goes on meanwhile.
async fn read_turn<'a>(
    rt: &'a Runtime,
    interest: &mut Interest,
    running: &mut JoinSet<u64>,
    holding: &mut HashMap<u64, Arc<Delivery>>,
) -> Option<Option<partitions::ReadTurn<'a>>> {
    if !interest.processes {
        return Some(None);
    }
    let turn = tokio::select! {
        biased;
        _ = rt.shutdown.cancelled() => return None,
        guard = rt.reading.lock() => partitions::ReadTurn::new(rt, guard),
    };
    // What changed while this loop waited for its turn.
    while let Some(done) = running.try_join_next() {
        settled(holding, Some(done));
    }
    tokio::select! {
        _ = isolation::settled(rt) => {}
        _ = rt.shutdown.cancelled() => return None,
    }
    // The partitions owned now, not before the wait; counted as being
    // read until the messages read are counted in theirs.
    interest.process_partitions = partitions::owned(rt).await;
    turn.reads(interest.process_partitions);
    Some(Some(turn))
}

/// Takes the task loaded with a delivery's lease out of it: the message's
/// handling gets the lease with the task (`lease`, moved, not copied),
/// and the delivery keeps the lease alone, which is all that handing it
/// back on a shutdown or a wait needs. Copying the task (every step's
/// record, their stored copies) for each message cost more than anything
/// else the worker does with it.
fn split_lease(mut delivery: Delivery) -> (Delivery, Option<TakenLease>) {
    let lease = delivery.lease.take();
    delivery.lease = lease.as_ref().map(|lease| match lease {
        TakenLease::Busy => TakenLease::Busy,
        TakenLease::Held {
            locked,
            requested_at,
            ttl,
        } => TakenLease::Held {
            locked: Box::new(Locked {
                lease: locked.lease.clone(),
                task: None,
                cancel_requested: locked.cancel_requested,
            }),
            requested_at: *requested_at,
            ttl: *ttl,
        },
    });
    (delivery, lease)
}

/// Works on one message as a task of its own; returns `n`. `lease` is
/// the one taken with the delivery, with its task ([`split_lease`]).
async fn work(
    rt: Arc<Runtime>,
    delivery: Arc<Delivery>,
    lease: Option<TakenLease>,
    (ticket, lane, _busy): (
        isolation::Ticket,
        Option<process::Ticket>,
        Option<partitions::Busy>,
    ),
    n: u64,
) -> u64 {
    // A message recovered from a worker that died runs alone, so that a
    // message that crashes its process costs no other one a delivery.
    let Some((_turn, delivery)) = isolation::turn(&rt, delivery, ticket).await else {
        return n;
    };
    // One that waited let go of its lease (`isolation::turn`).
    let lease = lease.filter(|_| delivery.lease.is_some());
    // A panic anywhere in handling (user code outside a step, a bug of
    // ours) must not end the worker: the process would look alive and
    // handle nothing.
    if let Err(panic) = AssertUnwindSafe(handle(&rt, &delivery, lease, lane))
        .catch_unwind()
        .await
    {
        panicked(&rt, &delivery, &panic_message(&*panic)).await;
    }
    n
}

/// The size of the future spawned for each message (the engine's tests
/// hold it small: see `the_future_spawned_per_message_stays_small`).
#[cfg(test)]
pub(crate) fn message_future_size(rt: Arc<Runtime>, delivery: Arc<Delivery>) -> usize {
    let ticket = isolation::ticket(&rt, &delivery);
    std::mem::size_of_val(&work(rt, delivery, None, (ticket, None, None), 1))
}

fn settled(
    holding: &mut HashMap<u64, Arc<Delivery>>,
    done: Option<Result<u64, tokio::task::JoinError>>,
) {
    if let Some(Ok(n)) = done {
        holding.remove(&n);
    }
}

/// Hands messages back unhandled (the engine is stopping), with any task
/// lease taken with them.
async fn hand_back_all(rt: &Runtime, deliveries: &[Delivery]) {
    for delivery in deliveries {
        release(rt, delivery, Duration::ZERO).await;
        if let Some(TakenLease::Held { locked, .. }) = &delivery.lease {
            let _ = rt.backend.unlock(&locked.lease).await;
        }
    }
}

/// Doubling delays between failed receives, from 50 ms to 5 s; back to
/// 50 ms as soon as the backend answers.
#[derive(Debug)]
struct ErrorBackoff(Duration);

impl Default for ErrorBackoff {
    fn default() -> Self {
        ErrorBackoff(Duration::from_millis(50))
    }
}

impl ErrorBackoff {
    fn reset(&mut self) {
        *self = ErrorBackoff::default();
    }

    fn next(&mut self) -> Duration {
        let delay = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(5));
        delay
    }
}

async fn handle(
    rt: &Arc<Runtime>,
    delivery: &Delivery,
    lease: Option<TakenLease>,
    lane: Option<process::Ticket>,
) {
    let item = match &delivery.item {
        Ok(item) => item,
        Err(reason) => return dead_letter(rt, delivery, reason.clone(), None).await,
    };
    // Each path boxed: a future is as large as its largest path, and the
    // one holding both (about 14 kB) was copied whole by every spawn and
    // every stage change of its task, which cost more than a saga step's
    // own work. Boxed, a message pays one allocation of its own path.
    match item {
        WorkItem::Saga(message) => Box::pin(saga::handle(rt, delivery, message, lease)).await,
        WorkItem::Process(envelope) => {
            Box::pin(process::handle(rt, delivery, envelope, lane)).await
        }
    }
}

/// The delay before a message this worker cannot handle (another version
/// can) comes back: 1 s, 2 s, 4 s, ... up to 5 minutes, by delivery.
fn another_version_delay(deliveries: u32) -> Duration {
    Duration::from_secs(1 << deliveries.saturating_sub(1).min(8)).min(Duration::from_secs(300))
}

/// A panic while handling a message (not in a step: that is a failed
/// attempt) is a bug, ours or in user code around the steps, and likely to
/// happen again: the message goes back as an *unanswered* delivery, so
/// that one that panics every time reaches the delivery cap and is
/// dead-lettered instead of looping.
async fn panicked(rt: &Arc<Runtime>, delivery: &Delivery, what: &str) {
    if delivery.deliveries > rt.settings.max_deliveries {
        // Counted with the process managers' outcomes only if it is
        // theirs (`ProcessMetrics` counted saga messages here too).
        if let Ok(WorkItem::Process(envelope)) = &delivery.item {
            let process = rt
                .processes
                .get_key_value(envelope.process.as_str())
                .map_or(process::UNKNOWN, |(name, _)| *name);
            rt.metrics.count_dead_lettered(process);
        }
        let reason = format!(
            "handling the message panicked on each of its last deliveries ({} in all): {what}",
            delivery.deliveries - 1
        );
        // A saga task is parked with its message, so that it ends.
        let task = match &delivery.item {
            Ok(WorkItem::Saga(message)) => {
                let parked = AssertUnwindSafe(saga::park(rt, delivery, message, &reason))
                    .catch_unwind()
                    .await;
                if let Ok(Ok(true)) = parked {
                    return;
                }
                Some(message.task_id)
            }
            _ => None,
        };
        return dead_letter(rt, delivery, reason, task).await;
    }
    tracing::error!(message = %delivery.id, panic = what, "handling the message panicked; it is handed back");
    if let Err(error) = rt
        .backend
        .defer(delivery, rt.settings.lock_retry_delay)
        .await
    {
        tracing::debug!(%error, "handing the message back failed; it is redelivered after the visibility timeout");
    }
}

pub(crate) use crate::util::panic_message;

/// Parks a message on the dead-letter queue, on its own.
async fn dead_letter(
    rt: &Runtime,
    delivery: &Delivery,
    reason: String,
    task: Option<crate::model::task::TaskId>,
) {
    tracing::error!(message = %delivery.id, %reason, "dead-lettering message");
    match rt.backend.dead_letter(delivery, &reason, task).await {
        Ok(()) => crate::metrics::dead_lettered(match &delivery.item {
            Ok(WorkItem::Saga(_)) => DeadLetterKind::Saga,
            Ok(WorkItem::Process(_)) => DeadLetterKind::Process,
            Err(_) => DeadLetterKind::Undecodable,
        }),
        Err(error) => {
            tracing::warn!(%error, "dead-lettering failed; the message will be redelivered")
        }
    }
}

/// Hands a message back for redelivery after `delay`. A failed release is
/// retried briefly: left pending, the message would wait out the
/// visibility timeout and count as a delivery that was never answered.
async fn release(rt: &Runtime, delivery: &Delivery, delay: Duration) {
    for attempt in 0..3u32 {
        match rt.backend.release(delivery, delay).await {
            Ok(()) => return,
            Err(error) => {
                tracing::debug!(%error, attempt, "handing a message back failed");
                tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
            }
        }
    }
    tracing::warn!(message = %delivery.id, "could not hand the message back; it is redelivered after the visibility timeout");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_backoff_doubles_to_five_seconds_and_resets() {
        let mut b = ErrorBackoff::default();
        let delays: Vec<u128> = (0..9).map(|_| b.next().as_millis()).collect();
        assert_eq!(delays, [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next(), Duration::from_millis(50));
    }
}
