//! Which step rows a task write must send.
//!
//! A task's steps are rows of their own, so a write that changed one step
//! need send and write only that one. The worker hands the backend the
//! whole task, not what changed; what changed is told by comparing each
//! step with the stored one. The stored one is known here for the tasks
//! this process wrote or loaded last: every write of a task's record is
//! made under its lease and bumps its version, so the steps stored under a
//! version this process saw are the ones it saw. For any other version (another
//! process wrote the task since) every step is sent: the cache only saves
//! work, it is never needed to be right.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use super::corrupt;
use crate::backend::BackendError;
use crate::model::task::{TaskId, TaskInstance};
use crate::util::Unpoisoned;

/// Tasks remembered at most: a task in flight is written every step, and
/// 65,536 in flight in one process is far beyond a worker's concurrency.
const CAPACITY: usize = 65_536;

/// The steps of the tasks this process wrote or loaded last, as hashes of
/// their stored JSON, by task and version.
#[derive(Default)]
pub(super) struct StepCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    tasks: HashMap<TaskId, (u64, Vec<u64>)>,
    /// Insertion order, to forget the oldest.
    order: VecDeque<TaskId>,
}

/// The step rows of one write: `[[idx, record], ..]` as JSON text, and the
/// hashes of every step, to remember once the write lands.
pub(super) struct Changed {
    pub rows: String,
    pub hashes: Vec<u64>,
}

fn hash(json: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    json.hash(&mut hasher);
    hasher.finish()
}

impl StepCache {
    /// The step rows a write of `task` (based on `task.version`) sends.
    pub fn changed(&self, task: &TaskInstance) -> Result<Changed, BackendError> {
        let stored = self.stored(task.id, task.version);
        let mut rows = String::from("[");
        let mut hashes = Vec::with_capacity(task.steps.len());
        for (idx, step) in task.steps.iter().enumerate() {
            let json = serde_json::to_string(step).map_err(corrupt)?;
            let h = hash(&json);
            if stored.as_ref().and_then(|s| s.get(idx)) != Some(&h) {
                if rows.len() > 1 {
                    rows.push(',');
                }
                rows.push_str(&format!("[{idx},{json}]"));
            }
            hashes.push(h);
        }
        rows.push(']');
        Ok(Changed { rows, hashes })
    }

    /// Remembers the steps of `id` as stored under `version`.
    pub fn remember(&self, id: TaskId, version: u64, hashes: Vec<u64>) {
        let mut inner = self.inner.locked();
        if inner.tasks.insert(id, (version, hashes)).is_none() {
            inner.order.push_back(id);
            while inner.order.len() > CAPACITY {
                if let Some(old) = inner.order.pop_front() {
                    inner.tasks.remove(&old);
                }
            }
        }
    }

    /// Remembers the steps of a task as loaded.
    pub fn loaded(&self, task: &TaskInstance) {
        let hashes = task
            .steps
            .iter()
            .filter_map(|s| serde_json::to_string(s).ok())
            .map(|json| hash(&json))
            .collect();
        self.remember(task.id, task.version, hashes);
    }

    /// Forgets a task (it ended, or was removed).
    pub fn forget(&self, id: TaskId) {
        let mut inner = self.inner.locked();
        inner.tasks.remove(&id);
    }

    fn stored(&self, id: TaskId, version: u64) -> Option<Vec<u64>> {
        let inner = self.inner.locked();
        inner
            .tasks
            .get(&id)
            .filter(|(v, _)| *v == version)
            .map(|(_, hashes)| hashes.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task() -> TaskInstance {
        TaskInstance::new("s", json!(1), [("a".to_owned(), 1), ("b".to_owned(), 2)])
    }

    #[test]
    fn an_unknown_version_sends_every_step_a_known_one_only_what_changed() {
        let cache = StepCache::default();
        let mut t = task();
        let all = cache.changed(&t).unwrap();
        assert_eq!(
            serde_json::from_str::<Vec<serde_json::Value>>(&all.rows)
                .unwrap()
                .len(),
            2
        );
        cache.remember(t.id, t.version + 1, all.hashes);
        t.version += 1;
        assert_eq!(cache.changed(&t).unwrap().rows, "[]", "nothing changed");
        t.steps[1].attempt_count = 1;
        let one: Vec<serde_json::Value> =
            serde_json::from_str(&cache.changed(&t).unwrap().rows).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0][0], 1, "the second step's row");
        t.version += 5;
        let again: Vec<serde_json::Value> =
            serde_json::from_str(&cache.changed(&t).unwrap().rows).unwrap();
        assert_eq!(again.len(), 2, "a version this process did not see");
    }
}
