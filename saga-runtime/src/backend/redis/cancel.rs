//! Cancellation requests: the flag, the wake-up message and who asked, in
//! one script (`cancel.lua`); and their announcements, as a stream.

use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};

use super::scripts as s;
use super::{corrupt, RedisBackend};
use crate::backend::{BackendError, QueueMessage, WorkItem};
use crate::model::task::{AuditEntry, TaskId, Timestamp, AUDIT_LOG_CAP};

/// A stored cancellation flag (`<ms>|<token>`; plain `<ms>` is accepted).
pub(super) fn cancel_time(stored: Option<String>) -> Option<Timestamp> {
    let stored = stored?;
    let ms = stored.split('|').next()?;
    ms.parse().ok().map(Timestamp)
}

impl RedisBackend {
    /// `cancel.lua`: the request, with `entry` appended to the audit log.
    pub(super) async fn cancel_request(
        &self,
        id: TaskId,
        token: &str,
        wake: &QueueMessage,
        entry: Option<&AuditEntry>,
    ) -> Result<Option<Timestamp>, BackendError> {
        let k = self.keys();
        let audit_entries = entry
            .map(|e| serde_json::to_string(e).map_err(corrupt))
            .into_iter()
            .collect::<Result<_, _>>()?;
        let previous = self
            .call(&s::Cancel {
                cancel: k.cancel(id),
                task: k.task(id),
                queue: k.queue(k.partition_of(id)),
                audit: k.audit(id),
                at_ms: Timestamp::now().0,
                token,
                channel: k.cancel_channel(),
                id: id.to_string(),
                wake: WorkItem::Saga(wake.clone()).encode(),
                audit_cap: AUDIT_LOG_CAP,
                audit_entries,
            })
            .await?;
        Ok(cancel_time(previous))
    }

    /// The ids of tasks whose cancellation is announced, from any process
    /// ([`TaskStore::cancellations`](crate::backend::TaskStore::cancellations)).
    pub(super) fn cancellation_stream(&self) -> BoxStream<'static, TaskId> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let server = self.shared.server.clone();
        let channel = self.keys().cancel_channel();
        // Resubscribes after a disconnect; ends when the receiver is dropped.
        tokio::spawn(async move {
            loop {
                // Connected afresh on every attempt: the primary may have
                // moved, a cluster node may have died.
                match server.pubsub().await {
                    Ok(mut pubsub) => {
                        if pubsub.subscribe(&channel).await.is_ok() {
                            let mut messages = pubsub.on_message();
                            loop {
                                // The receiver gone (the engine stopped),
                                // this task ends at once: it holds the
                                // server, whose sentinel poller lives as
                                // long as anything does.
                                let msg = tokio::select! {
                                    msg = messages.next() => msg,
                                    _ = tx.closed() => return,
                                };
                                let Some(msg) = msg else { break };
                                let Ok(text) = msg.get_payload::<String>() else {
                                    continue;
                                };
                                if let Ok(id) = text.parse::<TaskId>() {
                                    if tx.send(id).is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                    }
                    Err(error) => {
                        tracing::debug!(%error, "cancellation subscription failed; retrying")
                    }
                }
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
    }
}
