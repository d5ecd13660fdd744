//! Dead letters: messages parked for an operator.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

#[allow(unused_imports)] // the doc link below
use super::WorkQueue;
use super::{BackendError, Page};
use crate::model::task::{TaskId, Timestamp};

/// A message parked for manual inspection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Id to requeue or inspect it by.
    pub id: String,
    /// The raw payload as it was received, cut to the backend's size limit
    /// (see `truncated`).
    pub payload: String,
    /// Why it was parked.
    pub reason: String,
    /// The task it concerns, when the payload named one.
    pub task_id: Option<TaskId>,
    /// When it was parked.
    pub at: Timestamp,
    /// The payload's size in bytes before it was cut, when it was: a huge
    /// garbage message keeps only a prefix, and cannot be requeued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<usize>,
}

/// One page of dead letters, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterQuery {
    /// Only entries after (older than) this one.
    pub after: Option<String>,
    /// At most this many.
    pub limit: usize,
}

/// The dead-letter queue as an operator works it: page through it, look
/// at one letter, put it back on the work queue, or discard it. (Parking
/// a delivery is the work queue's: [`WorkQueue::dead_letter`].)
#[async_trait]
pub trait DeadLetters: Send + Sync + 'static {
    /// A page of parked messages, newest first.
    async fn dead_letters(&self, query: &DeadLetterQuery)
        -> Result<Page<DeadLetter>, BackendError>;

    /// One parked message.
    async fn dead_letter_by_id(&self, id: &str) -> Result<Option<DeadLetter>, BackendError>;

    /// Moves a parked message back onto the work queue, atomically; returns
    /// it, or `None` if there is no such entry.
    async fn requeue_dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, BackendError>;

    /// Removes a parked message for good; whether it was there.
    async fn discard_dead_letter(&self, id: &str) -> Result<bool, BackendError>;

    /// How many messages are parked. The default pages through
    /// [`dead_letters`](Self::dead_letters); a backend that knows its
    /// queue's length answers at once.
    async fn dead_letter_count(&self) -> Result<usize, BackendError> {
        let mut query = DeadLetterQuery {
            after: None,
            limit: 1000,
        };
        let mut count = 0;
        loop {
            let page = self.dead_letters(&query).await?;
            count += page.items.len();
            match page.next {
                Some(next) => query.after = Some(next),
                None => return Ok(count),
            }
        }
    }
}
