//! Telling waiters at once that a task finished.
//!
//! `engine.wait` would otherwise learn of a task's end by polling its
//! record, and a 3-step task that takes a millisecond would be seen done
//! tens of milliseconds later. The commit that gives a task a terminal
//! status publishes its id on one channel per deployment; each backend
//! keeps one subscription (started by the first wait, resubscribed after a
//! disconnect) and relays ids to its waiters. A finish published before a
//! waiter looked is still found: the ids seen lately are kept. Polling
//! stays as the fallback, so a lost notification (a subscription down at
//! that moment) costs the poll interval, never a wait that hangs.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::server::Server;
use futures::StreamExt;
use tokio::sync::broadcast;

use crate::model::task::TaskId;
use crate::util::Unpoisoned;

/// How many recently finished ids are remembered.
const RECENT: usize = 4096;

/// The finish notifications of one backend.
pub(super) struct Finished {
    tx: broadcast::Sender<TaskId>,
    recent: Mutex<Recent>,
    /// Whether the subscription task runs. It is spawned on the runtime of
    /// the wait that needs it; if that runtime goes away (the task is
    /// dropped with it), the next wait starts another.
    running: Arc<AtomicBool>,
}

#[derive(Default)]
struct Recent {
    order: VecDeque<TaskId>,
    ids: HashSet<TaskId>,
}

impl Finished {
    pub fn new() -> Arc<Self> {
        Arc::new(Finished {
            tx: broadcast::channel(1024).0,
            recent: Mutex::new(Recent::default()),
            running: Arc::new(AtomicBool::new(false)),
        })
    }

    fn seen(&self, id: TaskId) {
        let mut recent = self.recent.locked();
        if recent.ids.insert(id) {
            recent.order.push_back(id);
        }
        // Ids taken by a waiter stay in `order` until they age out; the
        // set stays within the bound either way.
        while recent.order.len() > RECENT {
            if let Some(old) = recent.order.pop_front() {
                recent.ids.remove(&old);
            }
        }
        drop(recent);
        let _ = self.tx.send(id);
    }

    /// Whether `id` was announced finished lately, forgetting it: a task
    /// requeued after it finished is waited for afresh, not found
    /// "finished" again and again while it runs (a waiter would spin).
    fn take_finished(&self, id: TaskId) -> bool {
        let mut recent = self.recent.locked();
        recent.ids.remove(&id)
    }

    /// Waits until `id` is announced finished or `timeout` passes.
    pub async fn wait(
        self: &Arc<Self>,
        server: &Server,
        channel: &str,
        id: TaskId,
        timeout: Duration,
    ) {
        self.start(server, channel);
        let mut rx = self.tx.subscribe();
        if self.take_finished(id) {
            return;
        }
        let announced = async {
            loop {
                match rx.recv().await {
                    Ok(done) if done == id => return,
                    Ok(_) => {}
                    // Missed some: look again.
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
                }
            }
        };
        let _ = tokio::time::timeout(timeout, announced).await;
    }

    /// Starts the subscription unless it runs; it lives as long as this
    /// value (and the runtime it was spawned on).
    fn start(self: &Arc<Self>, server: &Server, channel: &str) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak: Weak<Finished> = Arc::downgrade(self);
        let server = server.clone();
        let channel = channel.to_owned();
        let running = Running(self.running.clone());
        tokio::spawn(async move {
            let _running = running;
            subscribe(weak, server, channel).await
        });
    }
}

/// Clears the running flag however the subscription task ends: returning,
/// or dropped with its runtime.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

async fn subscribe(weak: Weak<Finished>, server: Server, channel: String) {
    loop {
        // Connected afresh on every attempt: the primary may have moved,
        // a cluster node may have died.
        match server.pubsub().await {
            Ok(mut pubsub) => {
                if pubsub.subscribe(&channel).await.is_ok() {
                    let mut messages = pubsub.on_message();
                    loop {
                        // Wake up now and then to notice that the backend
                        // is gone.
                        let next = tokio::time::timeout(Duration::from_secs(5), messages.next());
                        match next.await {
                            Ok(Some(msg)) => {
                                let Some(finished) = weak.upgrade() else {
                                    return;
                                };
                                let id = msg
                                    .get_payload::<String>()
                                    .ok()
                                    .and_then(|t| t.parse().ok());
                                if let Some(id) = id {
                                    finished.seen(id);
                                }
                            }
                            Ok(None) => break,
                            Err(_) if weak.strong_count() == 0 => return,
                            Err(_) => {}
                        }
                    }
                }
            }
            Err(error) => tracing::debug!(%error, "finish subscription failed; retrying"),
        }
        if weak.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finish_is_found_once_and_the_memory_is_bounded() {
        let finished = Finished::new();
        let id = TaskId::new();
        finished.seen(id);
        assert!(finished.take_finished(id), "announced before the wait");
        assert!(
            !finished.take_finished(id),
            "found once: a requeued task is waited for afresh"
        );
        for _ in 0..RECENT + 10 {
            finished.seen(TaskId::new());
        }
        let recent = finished.recent.lock().unwrap();
        assert!(recent.ids.len() <= RECENT && recent.order.len() <= RECENT);
    }
}
