//! Retention: expired tasks, old dead letters.

use std::collections::HashSet;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryBackend;
use crate::backend::{BackendError, Housekeeping, Housekept, Retention};
use crate::model::task::{TaskId, TaskStatus, Timestamp};

#[async_trait]
impl Housekeeping for MemoryBackend {
    async fn housekeep(&self, retention: &Retention) -> Result<Housekept, BackendError> {
        let mut state = self.state();
        let now = Instant::now();
        // A limit's key whose holders died and that nobody asked for since.
        state.sweep_limits(self.moment(now));
        let mut expired: Vec<TaskId> = state
            .expiry
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(id, _)| *id)
            .collect();
        expired.truncate(retention.batch);
        for id in &expired {
            state.remove_task(*id);
        }
        let before = state.dead.len();
        if let Some(keep) = retention.dead_letters {
            let cutoff = Timestamp::now().0.saturating_sub(keep.as_millis() as u64);
            state.dead.retain(|d| d.at.0 >= cutoff);
        }
        // Oldest first, but the letter of a task still parked stays: it is
        // what an operator requeues the task by.
        let mut excess = state.dead.len().saturating_sub(retention.dead_letters_max);
        let parked: HashSet<TaskId> = state
            .tasks
            .values()
            .filter(|t| t.status == TaskStatus::DeadLettered)
            .map(|t| t.id)
            .collect();
        state.dead.retain(|d| {
            let keep = excess == 0 || d.task_id.is_some_and(|t| parked.contains(&t));
            if !keep {
                excess -= 1;
            }
            keep
        });
        Ok(Housekept {
            tasks: expired.len(),
            dead_letters: before - state.dead.len(),
            consumers: 0,
            tallies: 0,
            relayed: 0,
        })
    }
}
