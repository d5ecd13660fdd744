//! Calling a step or a compensation: its timeout, its cancellation token,
//! its heartbeat, and what its result means.

use super::{sleep, Run};
use crate::backend::TaskRefusal;
use crate::context::StepContext;
use crate::error::StepError;
use crate::model::task::TaskInstance;
use crate::saga::state_machine::{Call, Outcome, Phase};
use crate::util::Unpoisoned;
use crate::worker::lease::Heartbeat;
use crate::worker::limits::HeldLimits;
use futures::FutureExt;
use serde_json::Value;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;
use tracing::Instrument;

impl Run<'_> {
    /// Calls the step (or compensation). The attempt gets the step's
    /// timeout; when it runs out, or the task is cancelled, the attempt's
    /// `ctx.cancelled()` fires and it has a short grace to return before it
    /// is dropped.
    pub(super) async fn call(
        &self,
        task: &TaskInstance,
        call: Call,
        attempt: u32,
        limits: Option<&HeldLimits>,
    ) -> Result<Outcome, TaskRefusal> {
        let step = &self.def.steps[call.idx];
        let method = call.method(self.def);
        let running = self.rt.register_running(task.id);
        // The attempt's own token: fired by its timeout, and (for a step)
        // by the task's cancellation. Compensation undoes work; cancelling
        // it would leave things half-undone, so it never sees the task's
        // cancellation.
        let attempt_token = match call.phase {
            Phase::Step => running.token.child_token(),
            Phase::Compensation => tokio_util::sync::CancellationToken::new(),
        };
        let ctx = StepContext {
            task_id: task.id,
            saga: self.def.name,
            step: method,
            of_step: step.name,
            attempt,
            trace_id: task.trace_id.clone(),
            token: attempt_token.clone(),
        };
        let span = tracing::info_span!(
            "saga_step",
            task_id = %task.id,
            saga = self.def.name,
            step = method,
            attempt,
            trace_id = %task.trace_id,
            compensation = call.phase == Phase::Compensation,
        );
        crate::otel::continue_trace(&span, task.traceparent.as_deref(), Some(&task.trace_id));
        let input = call.input(self.def, task);
        let invoke = async {
            match call.phase {
                Phase::Step => self.saga.execute_step(step.order, input, &ctx).await,
                Phase::Compensation => self
                    .saga
                    .compensate_step(step.order, input, &ctx)
                    .await
                    .map(|()| Value::Null),
            }
        }
        .instrument(span);
        // A panicking step is a failed attempt, not a dead worker.
        let invoke = AssertUnwindSafe(invoke).catch_unwind().map(|r| {
            r.unwrap_or_else(|panic| {
                Err(StepError::transient(format!(
                    "step panicked: {}",
                    crate::util::panic_message(&*panic)
                )))
            })
        });
        tokio::pin!(invoke);

        let heartbeat = Heartbeat {
            rt: self.rt,
            lease: self.lease,
            delivery: self.delivery,
            leased_at: *self.leased_at.locked(),
            cancel: &running.token,
            cancelled_at: Mutex::new(None),
            limits,
        };
        let beat = heartbeat.beat();
        tokio::pin!(beat);
        let timeout = step.timeout.unwrap_or(self.rt.settings.step_timeout);
        let cancellable = call.phase == Phase::Step;

        // The engine is shutting down and the attempt outlived the grace
        // period: stop it and hand it to another worker uncounted.
        let interrupt = async {
            self.rt.shutdown.cancelled().await;
            tokio::time::sleep(self.rt.settings.shutdown_grace).await;
        };

        enum Stop {
            TimedOut,
            Cancelled,
            Interrupted,
        }
        let stop = tokio::select! {
            result = &mut invoke => {
                return Ok(match result {
                    Ok(output) => Outcome::Succeeded(output),
                    Err(error) if cancellable && running.token.is_cancelled() => Outcome::Cancelled {
                        at: heartbeat.cancelled_at().await,
                        error: error.to_string(),
                        dropped: false,
                    },
                    Err(error) => Outcome::Failed { error: error.to_string(), kind: error.kind() },
                });
            }
            _ = sleep(timeout) => Stop::TimedOut,
            _ = running.token.cancelled(), if cancellable => Stop::Cancelled,
            _ = interrupt => Stop::Interrupted,
            lost = &mut beat => return Err(lost),
        };
        attempt_token.cancel();
        let grace = self.rt.settings.stop_grace;
        let late = tokio::select! {
            result = &mut invoke => Some(result),
            _ = tokio::time::sleep(grace) => None,
            lost = &mut beat => return Err(lost),
        };
        if late.is_none() {
            tracing::warn!(task_id = %task.id, step = method, attempt, ?grace, "the attempt ignored its cancellation; dropped");
        }
        // Dropped half-way: what it did is not known.
        let dropped = late.is_none();
        Ok(match (stop, late) {
            // It finished its work during the grace: keep the result rather
            // than redo a side effect that happened.
            (_, Some(Ok(output))) => Outcome::Succeeded(output),
            (Stop::TimedOut, _) => Outcome::TimedOut {
                after: timeout,
                dropped,
            },
            (Stop::Interrupted, _) => Outcome::Interrupted { dropped },
            (Stop::Cancelled, late) => Outcome::Cancelled {
                dropped,
                at: heartbeat.cancelled_at().await,
                error: match late {
                    Some(Err(error)) => error.to_string(),
                    _ => format!(
                        "the attempt did not stop within {} of the cancellation and was dropped",
                        humantime::format_duration(grace)
                    ),
                },
            },
        })
    }
}
