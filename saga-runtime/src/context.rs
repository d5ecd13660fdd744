//! [`StepContext`]: what a running step knows about its execution.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::model::task::TaskId;

/// Passed to every step and compensation that asks for it.
#[derive(Debug, Clone)]
pub struct StepContext {
    pub(crate) task_id: TaskId,
    pub(crate) saga: &'static str,
    pub(crate) step: &'static str,
    /// The step the call belongs to: `step` for a step, the step it
    /// undoes for a compensation.
    pub(crate) of_step: &'static str,
    pub(crate) attempt: u32,
    pub(crate) trace_id: String,
    pub(crate) token: CancellationToken,
}

impl StepContext {
    /// A context for calling a step by hand (unit tests of step bodies).
    pub fn detached(task_id: TaskId, saga: &'static str, step: &'static str, attempt: u32) -> Self {
        StepContext {
            task_id,
            saga,
            step,
            of_step: step,
            attempt,
            trace_id: String::new(),
            token: CancellationToken::new(),
        }
    }

    /// The same detached context for compensation `self.step()` of
    /// `step`: what [`step_idempotency_key`](Self::step_idempotency_key)
    /// then names.
    pub fn for_compensation_of(mut self, step: &'static str) -> Self {
        self.of_step = step;
        self
    }

    /// The task being executed.
    pub fn task_id(&self) -> TaskId {
        self.task_id
    }

    /// The saga's name.
    pub fn saga(&self) -> &'static str {
        self.saga
    }

    /// The step's (or compensation's) method name.
    pub fn step(&self) -> &'static str {
        self.step
    }

    /// The 1-based attempt number (persisted, so it keeps counting across
    /// crashes and redeliveries).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The task's trace id.
    pub fn trace_id(&self) -> &str {
        &self.trace_id
    }

    /// `{task_id}:{step}`: the same for every attempt of this step (or
    /// compensation) of this task. Hand it to external APIs that accept an
    /// idempotency key (payment providers do): when an attempt times out
    /// after the charge went through, the retry carries the same key and the
    /// provider recognises it instead of charging twice.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}", self.task_id, self.step)
    }

    /// `{task_id}:{step}` of the step this call belongs to: in a step, the
    /// same as [`idempotency_key`](Self::idempotency_key); in a
    /// compensation, the key its step handed to the services it called,
    /// to find and undo what the step did by it. That is what a
    /// compensation taking [`Outcome`](crate::Outcome) needs for
    /// `Outcome::Unknown`: the step's output was lost, its key was not.
    ///
    /// Not the compensation's own key: its own requests (a refund) carry
    /// [`idempotency_key`](Self::idempotency_key), because a service that
    /// honours idempotency keys answers a second, different request under
    /// the first one's key with the first one's answer or an error (Stripe
    /// compares the parameters and refuses).
    pub fn step_idempotency_key(&self) -> String {
        format!("{}:{}", self.task_id, self.of_step)
    }

    /// `{task_id}:{step}:{attempt}`: unique per attempt (the engine's own
    /// guard that one attempt number runs at most once). Use it to tell
    /// attempts apart in logs, not as an external idempotency key.
    pub fn attempt_key(&self) -> String {
        format!("{}:{}:{}", self.task_id, self.step, self.attempt)
    }

    /// Whether this attempt was asked to stop: the task was cancelled, or
    /// the attempt ran past its timeout.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Completes when this attempt is asked to stop: the task was
    /// cancelled, or the attempt ran past its timeout. Use it in a
    /// `tokio::select!` around long work and return soon after: the attempt
    /// has a short grace (`EngineBuilder::stop_grace`) before it is dropped.
    pub fn cancelled(&self) -> impl Future<Output = ()> + Send + '_ {
        self.token.cancelled()
    }

    /// The underlying token, to hand to code that takes one.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.token
    }
}
