//! A failed handling (the handler's error, or strict routing's): what
//! `#[on_error]` is told, and the write its answer makes.

use super::{audit, due, Commit, Decision, Dispatched, Failing, Given, Handling, Settlement};
use crate::model::process::{InstanceStatus, ProcessAuditAction};
use crate::process::{ErrorAction, Failure};

impl Handling<'_> {
    /// What `#[on_error]` is asked about: this failure counts as one more
    /// of the message's.
    pub(crate) fn failure(&self, failing: &Failing) -> Failure {
        Failure {
            kind: failing.kind.clone(),
            error: failing.error.clone(),
            message_type: self.envelope.message_type.clone(),
            message_id: self.envelope.message_id.clone(),
            instance_id: failing.instance.as_ref().map(|i| i.id.clone()),
            failures: self.envelope.failures + 1,
        }
    }

    /// Carries out `#[on_error]`'s `action`. A retry is the message again
    /// (now, or scheduled) with its failure counted, and nothing else: the
    /// instance is as it was. `Skip` and `Stop` write the instance (when
    /// there is one) with the decision in its audit log; `Stop` also parks
    /// the message, so nothing is lost.
    pub(crate) fn failed(
        &self,
        failing: Failing,
        action: ErrorAction,
        given: &Given<'_>,
    ) -> Decision {
        let envelope = self.envelope;
        let Failing {
            mut instance,
            error,
            ..
        } = failing;
        let mut again = envelope.clone();
        again.failures += 1;
        let mut commit = Commit::settle(Settlement::Ack);
        match action {
            ErrorAction::Retry => commit.effects.enqueue.push(again),
            ErrorAction::RetryAfter(delay) => {
                commit
                    .effects
                    .schedule
                    .push((due(given.now_ms, delay), again));
            }
            ErrorAction::Skip => {
                if let Some(i) = instance.as_mut() {
                    let skipped = ProcessAuditAction::Skipped {
                        error: error.clone(),
                    };
                    audit(i, envelope, skipped, given.at);
                }
                commit.instance = instance;
            }
            ErrorAction::Stop => {
                if let Some(i) = instance.as_mut() {
                    i.status = InstanceStatus::Stopped;
                    let stopped = ProcessAuditAction::Stopped {
                        error: error.clone(),
                    };
                    audit(i, envelope, stopped, given.at);
                }
                commit.instance = instance;
                commit.settle = Settlement::DeadLetter(format!(
                    "process `{}` stopped after: {error}",
                    self.def.name
                ));
            }
        }
        Decision::new(commit, Dispatched::Failed { action, error })
    }
}
