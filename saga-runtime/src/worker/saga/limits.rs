//! A step's flow-control limits, asked before its attempt is recorded: a
//! step that must wait is parked (`Outcome::LimitWait`) without an attempt,
//! so the wait spends neither a retry nor its timeout.

use super::{Run, Stopped};
use crate::backend::{LimitCause, QueueMessage};
use crate::metrics;
use crate::model::task::{TaskInstance, TaskStatus, Timestamp};
use crate::saga::state_machine as sm;
use crate::saga::state_machine::{waiting_since, Call, Outcome, Transition, Waiting};
use crate::worker::limits::{leave, wake_of, Asker, HeldLimits};

/// How long a step waits when its limits could not be asked.
const UNREACHABLE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Run<'_> {
    /// Asks the step's limits for this attempt: the slots it holds while
    /// it runs, or the outcome that parks the task.
    pub(super) async fn limit_permit(
        &self,
        task: &TaskInstance,
        call: Call,
    ) -> Result<Result<HeldLimits, Outcome>, Stopped> {
        // (Never `Err` today: kept so that a store refusal the protocol
        // expects can be told apart later.)
        let step = &self.def.steps[call.idx];
        let waiter = format!("{}:{}", task.id, step.name);
        // The message a parked task waits as: its commit enqueues the next
        // sequence number.
        let wake = wake_of(&QueueMessage {
            task_id: task.id,
            saga: task.saga.clone(),
            seq: task.seq + 1,
        });
        let asker = Asker {
            waiter: &waiter,
            wake: Some(wake),
        };
        let input = call.input(self.def, task);
        let asked = match HeldLimits::acquire(self.rt, step.limits, &input, asker).await {
            Ok(asked) => asked,
            // The store could not be asked: wait a moment, as a limit
            // that is full would. Not an error that hands the message
            // back: a task going on from a step that completed under this
            // delivery must still commit that step (its write rides out
            // the blip), or the step would run again.
            Err(error) => {
                let limit = step.limits.first().map_or("", |s| s.name);
                tracing::warn!(%error, limit, task_id = %task.id, "asking the step's limits failed; the task waits a moment");
                return Ok(Err(Outcome::LimitWait(Waiting {
                    limit: limit.to_owned(),
                    key: None,
                    retry_after: UNREACHABLE_WAIT,
                    ahead: 0,
                    rate: false,
                })));
            }
        };
        match asked {
            Ok(held) => {
                for spec in step.limits {
                    if let Some(since) = waiting_since(task, call.idx, spec.name) {
                        let waited = Timestamp::now().0.saturating_sub(since.0);
                        metrics::limit_wait_ended(
                            spec.name,
                            std::time::Duration::from_millis(waited),
                        );
                    }
                }
                Ok(Ok(held))
            }
            Err(refused) => Ok(Err(Outcome::LimitWait(Waiting {
                limit: refused.limit.to_owned(),
                key: refused.key,
                retry_after: refused.retry_after,
                ahead: refused.ahead,
                rate: refused.cause == LimitCause::Rate,
            }))),
        }
    }
}

impl Run<'_> {
    /// Gives up the places in line of the steps that waited for a limit
    /// and no longer do: the task was cancelled (or otherwise left its
    /// running phase) while parked. Their marks are cleared with the
    /// commit that follows; a place not given up (the call fails, the
    /// worker dies) lapses with its deadline.
    pub(super) fn leave_limits(&self, task: &mut TaskInstance) {
        if matches!(task.status, TaskStatus::Pending | TaskStatus::Running) {
            return;
        }
        for (idx, rec) in task.steps.iter_mut().enumerate() {
            let Some(wait) = rec.limit_wait.take() else {
                continue;
            };
            let step = &self.def.steps[idx];
            let Some(spec) = step.limits.iter().find(|s| s.name == wait.limit) else {
                continue;
            };
            let waiter = format!("{}:{}", task.id, step.name);
            leave(self.rt, spec, wait.key, waiter);
        }
    }
}

impl Run<'_> {
    /// The transition of a step parked by its limits. A message recovered
    /// from a dead worker (it runs alone) parked here comes back as a
    /// fresh one: the step's next attempt stays the suspect, so that a
    /// crash in it is counted, not forgiven.
    pub(super) fn parked(
        &self,
        task: &mut TaskInstance,
        call: Call,
        outcome: Outcome,
    ) -> Transition {
        if self.alone() {
            let rec = &mut task.steps[call.idx];
            rec.alone_attempt = Some(rec.attempt_count + 1);
        }
        sm::on_outcome(task, self.def, call, outcome, self.worker)
    }

    /// The call is over: its slots are freed now, before the outcome is
    /// written, so that the next in line starts without waiting for it;
    /// in the background, unless the next step asks one of the same limits
    /// (it must find this step's slot free, not park behind it).
    pub(super) async fn free_limits(&self, held: Option<HeldLimits>, call: Call) {
        let Some(held) = held else {
            return;
        };
        let next = self.def.steps.get(call.idx + 1);
        match next.is_some_and(|n| n.limits.iter().any(|l| held.holds(l.name))) {
            true => held.release().await,
            false => drop(held),
        }
    }
}
