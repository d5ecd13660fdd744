//! What a copy of a task knows about the record it was loaded from: which
//! step records the store holds as they are in the copy, so that a write
//! sends the steps that changed and not the task's whole history.
//!
//! The audit log is appended to, never rewritten: a write sends the
//! entries after [`StoredAudit`]'s count.
//!
//! A backend that keeps each step in a field (or row) of its own (Redis
//! in record layout 2) writes only [`TaskInstance::unstored_steps`]. The
//! bookkeeping is tied to the version it was taken at: every write of a
//! task is made under its lease and bumps its version, so the steps stored
//! under a version this copy saw are the ones it saw. A copy written under
//! any other version (an older copy, or one never told of its last write)
//! sends every step: the bookkeeping only saves work, it is never needed
//! to be right.

use std::fmt;

use super::{AuditEntry, StepRecord, TaskInstance};

/// Bookkeeping of [`TaskInstance::audit_stored`]: how many audit entries
/// are already stored. Two tasks compare equal whatever it says: it is
/// about the copy, not the record.
#[derive(Debug, Clone, Copy, Default)]
#[doc(hidden)]
pub struct StoredAudit(pub usize);

impl PartialEq for StoredAudit {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Bookkeeping of [`TaskInstance::steps_stored`]. Two tasks compare equal
/// whatever it says: it is about the copy, not the record.
#[derive(Clone, Default)]
#[doc(hidden)]
pub struct StoredSteps {
    /// The version the store held `steps` under; `None`: not known.
    version: Option<u64>,
    /// The step records as stored.
    steps: Vec<StepRecord>,
    /// The record keeps its steps apart from its head (Redis record
    /// layout 2): a write must keep them so.
    apart: bool,
}

impl PartialEq for StoredSteps {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Debug for StoredSteps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredSteps")
            .field("version", &self.version)
            .field("steps", &self.steps.len())
            .field("apart", &self.apart)
            .finish()
    }
}

impl TaskInstance {
    /// The audit entries a write must append: those after the ones the
    /// store holds.
    pub fn unstored_audit(&self) -> &[AuditEntry] {
        self.audit_log
            .get(self.audit_stored.0..)
            .unwrap_or_default()
    }

    /// Records that the store now holds every audit entry of this copy.
    pub fn audit_saved(&mut self) {
        self.audit_stored = StoredAudit(self.audit_log.len());
    }

    /// Records that the store holds this copy's steps under `version`
    /// (the task's version after the write that stored them, or as
    /// loaded). Copies only the steps that changed.
    /// Only for a copy of a record that keeps its steps apart: no other
    /// write reads the bookkeeping, and a backend that stores copies of
    /// the task (the in-memory one) would copy it too.
    #[doc(hidden)]
    pub fn steps_saved(&mut self, version: u64) {
        if !self.steps_stored.apart {
            return;
        }
        let known = &mut self.steps_stored;
        known.steps.truncate(self.steps.len());
        for (idx, step) in self.steps.iter().enumerate() {
            match known.steps.get_mut(idx) {
                Some(stored) if stored == step => {}
                Some(stored) => stored.clone_from(step),
                None => known.steps.push(step.clone()),
            }
        }
        known.version = Some(version);
    }

    /// The indexes of the steps a write of this copy (made under
    /// `self.version`) must send: those that differ from the stored ones,
    /// or every step when the stored ones are not known.
    #[doc(hidden)]
    pub fn unstored_steps(&self) -> Vec<usize> {
        let known = &self.steps_stored;
        if known.version != Some(self.version) {
            return (0..self.steps.len()).collect();
        }
        self.steps
            .iter()
            .enumerate()
            .filter(|(idx, step)| known.steps.get(*idx) != Some(step))
            .map(|(idx, _)| idx)
            .collect()
    }

    /// Whether the record this copy was loaded from keeps its steps apart.
    #[doc(hidden)]
    pub fn steps_apart(&self) -> bool {
        self.steps_stored.apart
    }

    /// Marks this copy as loaded from a record that keeps its steps apart
    /// (or not).
    #[doc(hidden)]
    pub fn set_steps_apart(&mut self, apart: bool) {
        self.steps_stored.apart = apart;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::task::StepStatus;
    use serde_json::json;

    fn task() -> TaskInstance {
        TaskInstance::new("s", json!(1), [("a".to_owned(), 1), ("b".to_owned(), 2)])
    }

    #[test]
    fn an_unknown_version_sends_every_step_a_known_one_only_what_changed() {
        let mut t = task();
        t.steps_saved(t.version);
        assert_eq!(t.unstored_steps(), [0, 1], "kept together: not tracked");
        t.set_steps_apart(true);
        assert_eq!(t.unstored_steps(), [0, 1], "never saved");
        t.steps_saved(t.version);
        assert!(t.unstored_steps().is_empty());
        t.steps[1].status = StepStatus::Running;
        assert_eq!(t.unstored_steps(), [1]);
        t.version += 1;
        t.steps_saved(t.version);
        assert!(t.unstored_steps().is_empty());
        // Saved under a version the copy no longer holds: every step.
        t.steps_saved(t.version + 5);
        assert_eq!(t.unstored_steps(), [0, 1]);
    }
}
