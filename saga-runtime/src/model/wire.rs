//! The wire format of the work queue: what one queue entry carries.
//!
//! Backends store entries as the bytes [`WorkItem::encode`] gives and hand
//! [`WorkItem::decode`]'s result to the engine, which routes it; they never
//! look inside. The format is JSON so that an operator can read a queue with
//! `redis-cli`, and stable across releases: entries outlive deploys.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::envelope::Envelope;
use crate::model::task::TaskId;

/// A saga message: "advance task `task_id` of saga `saga`".
///
/// The task record decides what advancing means; `seq` lets a worker tell a
/// stale duplicate (whose effect is already recorded) from the live message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QueueMessage {
    /// The task.
    pub task_id: TaskId,
    /// The saga the task belongs to.
    pub saga: String,
    /// The task's sequence number when this message was enqueued.
    pub seq: u64,
}

/// One entry of the work queue.
// A work item is decoded once per delivery and moved along, never held in
// bulk: boxing the envelope would cost an allocation per message for
// nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum WorkItem {
    /// Advance a saga task.
    Saga(QueueMessage),
    /// Deliver a message (or a timeout) to a process manager.
    Process(Envelope),
}

impl WorkItem {
    /// The entry's bytes on the queue (JSON).
    // Plain structs of strings, numbers and a JSON value: serde_json cannot
    // fail on them (it fails only on maps with non-string keys and on
    // failing `Serialize` impls, which these do not have).
    #[allow(clippy::expect_used)]
    pub fn encode(&self) -> String {
        match self {
            WorkItem::Saga(m) => serde_json::to_string(m),
            WorkItem::Process(e) => serde_json::to_string(e),
        }
        .expect("queue messages always serialize")
    }

    /// Decodes an entry; the error says what is wrong with it, for the
    /// dead-letter queue.
    pub fn decode(bytes: &[u8]) -> Result<WorkItem, String> {
        if let Some(message) = SagaEntry::fast(bytes) {
            return Ok(WorkItem::Saga(message));
        }
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            let e = super::decode::without_values(&e.to_string());
            format!("malformed message (not JSON): {e}")
        })?;
        if value.get("process").is_some() {
            // Where and what kind, not the values: this is a dead letter's reason.
            return super::decode::decode(value)
                .map(WorkItem::Process)
                .map_err(|e| format!("malformed process-manager envelope: {e}"));
        }
        super::decode::decode(value)
            .map(WorkItem::Saga)
            .map_err(|e| {
                format!(
                "malformed message (expected a saga message {{\"task_id\", \"saga\", \"seq\"}} \
                 or a process-manager envelope): {e}"
            )
            })
    }

    /// The task a saga message is for.
    pub fn task_id(&self) -> Option<TaskId> {
        match self {
            WorkItem::Saga(m) => Some(m.task_id),
            WorkItem::Process(_) => None,
        }
    }
}

/// A saga message read straight from its bytes: what every delivery of a
/// step is, decoded without building a [`Value`] first (a third of the
/// cost of reading a delivery). Anything this does not read cleanly (a
/// `process` key, null included; a duplicate or missing field; not an
/// object) goes the general way, which gives the same result or the error.
#[derive(Deserialize)]
struct SagaEntry {
    task_id: TaskId,
    saga: String,
    seq: u64,
    #[serde(default, rename = "process", deserialize_with = "present")]
    has_process: bool,
}

impl SagaEntry {
    fn fast(bytes: &[u8]) -> Option<QueueMessage> {
        match serde_json::from_slice::<SagaEntry>(bytes) {
            Ok(entry) if !entry.has_process => Some(QueueMessage {
                task_id: entry.task_id,
                saga: entry.saga,
                seq: entry.seq,
            }),
            _ => None,
        }
    }
}

/// Whether a field is there at all (`null` included): its value skipped.
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(deserializer).map(|_| true)
}

impl From<QueueMessage> for WorkItem {
    fn from(m: QueueMessage) -> Self {
        WorkItem::Saga(m)
    }
}

impl From<Envelope> for WorkItem {
    fn from(e: Envelope) -> Self {
        WorkItem::Process(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::envelope::EnvelopeKind;

    #[test]
    fn entries_round_trip_and_garbage_says_why() {
        let saga = WorkItem::Saga(QueueMessage {
            task_id: TaskId::new(),
            saga: "s".into(),
            seq: 3,
        });
        assert_eq!(WorkItem::decode(saga.encode().as_bytes()).unwrap(), saga);
        let pm = WorkItem::Process(Envelope {
            message_id: "m".into(),
            process: "p".into(),
            message_type: "T".into(),
            payload: serde_json::json!({"a": 1}),
            kind: EnvelopeKind::Message,
            instance_id: None,
            generation: None,
            failures: 0,
            key: None,
            key_field: None,
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            due_ms: None,
            hops: 0,
            hold_until: None,
        });
        assert_eq!(WorkItem::decode(pm.encode().as_bytes()).unwrap(), pm);
        let e = WorkItem::decode(b"{not json").unwrap_err();
        assert!(e.starts_with("malformed message (not JSON)"), "{e}");
        let e = WorkItem::decode(b"{\"task_id\": 1}").unwrap_err();
        assert!(e.contains("expected a saga message"), "{e}");
        let e = WorkItem::decode(b"{\"process\": 1}").unwrap_err();
        assert!(e.starts_with("malformed process-manager envelope"), "{e}");
        assert!(WorkItem::decode(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn the_fast_path_leaves_what_it_cannot_read_to_the_general_one() {
        let id = TaskId::new();
        let expected = WorkItem::Saga(QueueMessage {
            task_id: id,
            saga: "s".into(),
            seq: 2,
        });
        // Unknown fields ignored; a duplicate keeps the last value.
        let extra = format!(r#"{{"task_id":"{id}","saga":"x","seq":2,"saga":"s","more":[1]}}"#);
        assert!(SagaEntry::fast(extra.as_bytes()).is_none());
        assert_eq!(WorkItem::decode(extra.as_bytes()).unwrap(), expected);
        let plain = format!(r#"{{"task_id":"{id}","saga":"s","seq":2,"more":[1]}}"#);
        assert!(SagaEntry::fast(plain.as_bytes()).is_some());
        assert_eq!(WorkItem::decode(plain.as_bytes()).unwrap(), expected);
        // A `process` key, even null, makes it an envelope.
        let null = format!(r#"{{"task_id":"{id}","saga":"s","seq":2,"process":null}}"#);
        assert!(SagaEntry::fast(null.as_bytes()).is_none());
        let e = WorkItem::decode(null.as_bytes()).unwrap_err();
        assert!(e.starts_with("malformed process-manager envelope"), "{e}");
    }
}
