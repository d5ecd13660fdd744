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
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::Client;
use tokio::sync::broadcast;

use crate::task::TaskId;

/// How many recently finished ids are remembered.
const RECENT: usize = 4096;

/// The finish notifications of one backend.
pub(super) struct Finished {
    tx: broadcast::Sender<TaskId>,
    recent: Mutex<Recent>,
    started: std::sync::Once,
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
            started: std::sync::Once::new(),
        })
    }

    fn seen(&self, id: TaskId) {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.ids.insert(id) {
            recent.order.push_back(id);
        }
        while recent.order.len() > RECENT {
            if let Some(old) = recent.order.pop_front() {
                recent.ids.remove(&old);
            }
        }
        drop(recent);
        let _ = self.tx.send(id);
    }

    fn finished_lately(&self, id: TaskId) -> bool {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.ids.contains(&id)
    }

    /// Waits until `id` is announced finished or `timeout` passes.
    pub async fn wait(
        self: &Arc<Self>,
        client: &Client,
        channel: &str,
        id: TaskId,
        timeout: Duration,
    ) {
        self.start(client, channel);
        let mut rx = self.tx.subscribe();
        if self.finished_lately(id) {
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

    /// Starts the subscription once; it lives as long as this value.
    fn start(self: &Arc<Self>, client: &Client, channel: &str) {
        self.started.call_once(|| {
            let weak: Weak<Finished> = Arc::downgrade(self);
            let client = client.clone();
            let channel = channel.to_owned();
            tokio::spawn(subscribe(weak, client, channel));
        });
    }
}

async fn subscribe(weak: Weak<Finished>, client: Client, channel: String) {
    loop {
        match client.get_async_pubsub().await {
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
