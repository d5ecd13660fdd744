//! Publishing to process managers and looking at their instances.

use super::Engine;
use super::ProcessMetrics;
use crate::backend::{ProcessInstance, WorkItem};
use crate::error::Error;
use crate::process::{Envelope, EnvelopeKind, Message, ProcessManager};
use crate::saga::BoxFuture;

impl Engine {
    /// Publishes `msg` to every registered process manager that handles its
    /// type; returns how many that is (0 is logged: nothing handles it).
    // A boxed future whose type does not mention `M` (as for `cancel`): a
    // type that is not a message is then one error, at the call.
    pub fn publish<M: Message>(&self, msg: M) -> BoxFuture<'_, Result<usize, Error>> {
        let message_id = uuid::Uuid::new_v4().to_string();
        let encoded = serde_json::to_value(&msg);
        Box::pin(async move { self.publish_json(&message_id, M::TYPE, encoded?).await })
    }

    /// [`publish`](Self::publish) with the message's own id: publishing the
    /// same id twice (a producer's retry) is recognised by the instance and
    /// the duplicate changes nothing.
    pub fn publish_with_id<'a, M: Message>(
        &'a self,
        message_id: &'a str,
        msg: M,
    ) -> BoxFuture<'a, Result<usize, Error>> {
        let encoded = serde_json::to_value(&msg);
        Box::pin(async move { self.publish_json(message_id, M::TYPE, encoded?).await })
    }

    /// Publishes a message known by its type's name
    /// (`Message::TYPE`) and its JSON, with its own id: what another
    /// service sends, through the HTTP API (`POST /api/messages`) or a
    /// broker. Publishing one id twice changes nothing the second time.
    /// [`Error::UnknownMessageType`] if no process manager here handles the
    /// type; a payload that does not fit the type is dead-lettered with
    /// the reason when its handler reads it.
    pub async fn publish_raw(
        &self,
        message_id: &str,
        message_type: &str,
        payload: serde_json::Value,
    ) -> Result<usize, Error> {
        let Some((known, _)) = self.rt.routes.get_key_value(message_type) else {
            return Err(Error::UnknownMessageType(message_type.to_owned()));
        };
        self.publish_json(message_id, known, payload).await
    }

    async fn publish_json(
        &self,
        message_id: &str,
        message_type: &'static str,
        payload: serde_json::Value,
    ) -> Result<usize, Error> {
        let items = self.published(message_id, message_type, &payload);
        if items.is_empty() {
            return Ok(0);
        }
        // A retry may enqueue a message twice; the instance drops the
        // duplicate by its id.
        self.retrying("publish", || self.rt.backend.enqueue(&items))
            .await?;
        Ok(items.len())
    }

    /// The queue entries of a published message: one per process manager
    /// that handles its type (none is logged).
    pub(super) fn published(
        &self,
        message_id: &str,
        message_type: &'static str,
        payload: &serde_json::Value,
    ) -> Vec<WorkItem> {
        let subscribers = self.rt.subscribers(message_type);
        if subscribers.is_empty() {
            tracing::warn!(
                message_type,
                "published message has no process manager to handle it"
            );
        }
        subscribers
            .iter()
            .map(|process| {
                let (key, key_field) = match self.rt.processes.get(process) {
                    Some(pm) => crate::process::routing_key(pm.as_ref(), message_type, payload),
                    None => (None, None),
                };
                WorkItem::Process(Envelope {
                    traceparent: crate::otel::current(),
                    due_ms: None,
                    hops: 0,
                    hold_until: None,
                    message_id: message_id.to_owned(),
                    process: (*process).to_owned(),
                    message_type: message_type.to_owned(),
                    payload: payload.clone(),
                    kind: EnvelopeKind::Message,
                    instance_id: None,
                    generation: None,
                    failures: 0,
                    key,
                    key_field,
                })
            })
            .collect()
    }

    /// The instance `id` of process manager `P`.
    pub async fn process_instance<P: ProcessManager>(
        &self,
        id: &str,
    ) -> Result<Option<ProcessInstance>, Error> {
        let processes = self.rt.processes()?;
        self.retrying("process_instance", || processes.process_load(P::NAME, id))
            .await
    }

    /// The instance of `P` whose correlated state field `field` is `value`.
    pub async fn find_process<P: ProcessManager>(
        &self,
        field: &str,
        value: &str,
    ) -> Result<Option<ProcessInstance>, Error> {
        let processes = self.rt.processes()?;
        self.retrying("find_process", || {
            processes.process_find(P::NAME, field, value)
        })
        .await
    }

    /// The state of instance `id` of `P`, decoded.
    pub async fn process_state<P: ProcessManager>(
        &self,
        id: &str,
    ) -> Result<Option<P::State>, Error> {
        match self.process_instance::<P>(id).await? {
            Some(instance) => {
                P::decode_state(instance.state)
                    .map(Some)
                    .map_err(|e| Error::InvalidState {
                        process: P::NAME,
                        reason: e.to_string(),
                    })
            }
            None => Ok(None),
        }
    }

    /// Every instance of `P`.
    pub async fn process_instances<P: ProcessManager>(
        &self,
    ) -> Result<Vec<ProcessInstance>, Error> {
        let processes = self.rt.processes()?;
        self.retrying("process_instances", || processes.process_list(P::NAME))
            .await
    }

    /// Process-manager counters of this engine.
    pub fn process_metrics(&self) -> &ProcessMetrics {
        &self.rt.metrics
    }
}
