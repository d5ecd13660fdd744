//! Dead letters: parked messages, newest first, capped.

use async_trait::async_trait;

use super::MemoryBackend;
use crate::backend::{BackendError, DeadLetter, DeadLetterQuery, DeadLetters, Page};

#[async_trait]
impl DeadLetters for MemoryBackend {
    async fn dead_letters(
        &self,
        query: &DeadLetterQuery,
    ) -> Result<Page<DeadLetter>, BackendError> {
        let state = self.state();
        let parked = |id: &str| id.strip_prefix("dl-").and_then(|n| n.parse::<u64>().ok());
        let before = match &query.after {
            Some(after) => {
                Some(parked(after).ok_or_else(|| BackendError::InvalidCursor(after.clone()))?)
            }
            None => None,
        };
        let mut older = state
            .dead
            .iter()
            .rev()
            .filter(|d| before.is_none_or(|b| parked(&d.id).is_some_and(|n| n < b)));
        let items: Vec<DeadLetter> = older.by_ref().take(query.limit).cloned().collect();
        let more = older.next().is_some();
        let next = more.then(|| items.last().map(|d| d.id.clone())).flatten();
        Ok(Page { items, next })
    }

    async fn dead_letter_by_id(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        Ok(self.state().dead.iter().find(|d| d.id == id).cloned())
    }

    async fn requeue_dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        let letter = {
            let mut state = self.state();
            let index = state.dead.iter().position(|d| d.id == id);
            let letter = index.and_then(|i| state.dead.remove(i));
            if let Some(letter) = &letter {
                state.push_raw(letter.payload.clone().into_bytes());
            }
            letter
        };
        self.queue_changed();
        Ok(letter)
    }

    async fn dead_letter_count(&self) -> Result<usize, BackendError> {
        Ok(self.state().dead.len())
    }

    async fn discard_dead_letter(&self, id: &str) -> Result<bool, BackendError> {
        let mut state = self.state();
        let before = state.dead.len();
        state.dead.retain(|d| d.id != id);
        Ok(state.dead.len() < before)
    }
}
