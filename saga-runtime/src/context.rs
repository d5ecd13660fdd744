//! [`StepContext`]: what a running step knows about its execution.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::task::TaskId;

/// Passed to every step and compensation that asks for it.
#[derive(Debug, Clone)]
pub struct StepContext {
    pub(crate) task_id: TaskId,
    pub(crate) saga: &'static str,
    pub(crate) step: &'static str,
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
            attempt,
            trace_id: String::new(),
            token: CancellationToken::new(),
        }
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

    /// `{task_id}:{step}:{attempt}`: unique per attempt. Pass it to external
    /// APIs that accept an idempotency key (payment providers do) so that a
    /// retried side effect happens once.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}:{}", self.task_id, self.step, self.attempt)
    }

    /// Whether cancellation of the task was requested.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Completes when cancellation of the task is requested. Use it in a
    /// `tokio::select!` around long work; returning early (an error, or an
    /// output) lets the engine compensate sooner.
    pub fn cancelled(&self) -> impl Future<Output = ()> + Send + '_ {
        self.token.cancelled()
    }

    /// The underlying token, to hand to code that takes one.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.token
    }
}
