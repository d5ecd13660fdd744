//! The step loop: what a worker does with one message.
//!
//! A message says "advance task T". The worker takes the task's lock (or hands
//! the message back for later: it never waits), loads the task, runs the one
//! action its status calls for (the next step, with its retries; or the next
//! compensation), then commits the result, the next message and the
//! acknowledgement in one atomic write. A crash anywhere before that write
//! leaves the message unacknowledged, so it is delivered again and the action
//! resumes from what was persisted: attempt counts are written before every
//! call, and a step whose completion was recorded is never run again.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use std::sync::atomic::Ordering;

use crate::backend::{BackendError, Delivery, Lease, QueueMessage, Settle};
use crate::context::StepContext;
use crate::engine::Inner;
use crate::error::{StepError, StepErrorKind};
use crate::policy::{Backoff, OnExhausted};
use crate::process::{
    dispatch, Concurrency, Correlation, DispatchEnv, Dispatched, Envelope, ErasedProcess,
};
use crate::saga::{ErasedSaga, SagaDefinition};
use crate::task::{AuditAction, AuditEntry, StepStatus, TaskInstance, TaskStatus, Timestamp};
use futures::FutureExt;

/// Pulls messages until the engine shuts down.
pub(crate) async fn run(inner: Arc<Inner>, name: String) {
    let consumer = format!("{}-{}", std::process::id(), name);
    let mut backoff = Duration::from_millis(50);
    loop {
        let received = tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            r = inner.backend.receive(&consumer, inner.settings.receive_wait) => r,
        };
        match received {
            Ok(Some(delivery)) => {
                backoff = Duration::from_millis(50);
                let grace = async {
                    inner.shutdown.cancelled().await;
                    tokio::time::sleep(inner.settings.shutdown_grace).await;
                };
                tokio::select! {
                    _ = handle(&inner, &delivery) => {}
                    _ = grace => {
                        tracing::warn!(message = %delivery.id, "shutdown grace period over; handing the message back");
                        let _ = inner.backend.release(&delivery, Duration::ZERO).await;
                        return;
                    }
                }
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%error, "receiving a message failed; retrying");
                tokio::select! {
                    _ = inner.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Releases the lock if processing stops before the commit did (an error, or
/// the future being dropped at shutdown), so the task is not blocked for a
/// whole TTL.
struct LeaseGuard {
    inner: Arc<Inner>,
    lease: Option<Lease>,
}

impl LeaseGuard {
    fn disarm(&mut self) {
        self.lease = None;
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let (Some(lease), Ok(handle)) =
            (self.lease.take(), tokio::runtime::Handle::try_current())
        {
            let backend = self.inner.backend.clone();
            handle.spawn(async move {
                let _ = backend.unlock(&lease).await;
            });
        }
    }
}

async fn dead_letter(
    inner: &Inner,
    delivery: &Delivery,
    reason: String,
    task: Option<crate::task::TaskId>,
) {
    tracing::error!(message = %delivery.id, %reason, "dead-lettering message");
    if let Err(error) = inner.backend.dead_letter(delivery, &reason, task).await {
        tracing::warn!(%error, "dead-lettering failed; the message will be redelivered");
    }
}

async fn handle(inner: &Arc<Inner>, delivery: &Delivery) {
    let value: serde_json::Value = match serde_json::from_str(&delivery.payload) {
        Ok(v) => v,
        Err(e) => {
            let reason = format!("malformed message (not JSON): {e}");
            return dead_letter(inner, delivery, reason, None).await;
        }
    };
    if value.get("process").is_some() {
        return handle_process(inner, delivery, value).await;
    }
    let message: QueueMessage = match serde_json::from_value(value) {
        Ok(m) => m,
        Err(e) => {
            let reason = format!(
                "malformed message (expected a saga message {{\"task_id\", \"saga\", \"seq\"}} or a process-manager envelope): {e}"
            );
            return dead_letter(inner, delivery, reason, None).await;
        }
    };
    let Some(saga) = inner.sagas.get(message.saga.as_str()).cloned() else {
        let mut known: Vec<_> = inner.sagas.keys().copied().collect();
        known.sort_unstable();
        let reason = format!(
            "unknown saga `{}`: this worker runs [{}]; requeue it once a worker that knows it is deployed",
            message.saga,
            known.join(", ")
        );
        return dead_letter(inner, delivery, reason, Some(message.task_id)).await;
    };
    let backend = &inner.backend;
    let locked = match backend
        .try_lock_and_load(message.task_id, inner.settings.lock_ttl)
        .await
    {
        Ok(Some(locked)) => locked,
        Ok(None) => {
            tracing::debug!(task_id = %message.task_id, "task is locked by another worker; message handed back");
            let _ = backend
                .release(delivery, inner.settings.lock_retry_delay)
                .await;
            return;
        }
        Err(error) => {
            tracing::warn!(%error, "locking failed; message handed back");
            let _ = backend
                .release(delivery, inner.settings.lock_retry_delay)
                .await;
            return;
        }
    };
    let lease = locked.lease;
    let mut guard = LeaseGuard {
        inner: inner.clone(),
        lease: Some(lease.clone()),
    };
    let Some(task) = locked.task else {
        let reason = format!("task {} does not exist", message.task_id);
        return dead_letter(inner, delivery, reason, Some(message.task_id)).await;
    };
    if task.saga != message.saga {
        let reason = format!(
            "message names saga `{}` but task {} belongs to `{}`",
            message.saga, task.id, task.saga
        );
        return dead_letter(inner, delivery, reason, Some(task.id)).await;
    }
    if task.seq != message.seq || task.status.is_terminal() {
        tracing::debug!(task_id = %task.id, "stale duplicate message acknowledged");
        let _ = backend.ack(delivery).await;
        return;
    }
    let id = task.id;
    let token = inner.register_running(id);
    let run = Run {
        extended_at: std::sync::Mutex::new(tokio::time::Instant::now()),
        inner,
        saga: saga.as_ref(),
        def: saga.definition(),
        lease: &lease,
        delivery,
        token,
    };
    let result = run.advance(task, locked.cancel_requested).await;
    inner.unregister_running(id);
    match result {
        Ok(()) => guard.disarm(),
        Err(error) => {
            tracing::warn!(task_id = %id, %error, "could not record the outcome; the message will be redelivered");
            let _ = backend
                .release(delivery, inner.settings.lock_retry_delay)
                .await;
        }
    }
}

/// Handles one process-manager envelope.
async fn handle_process(inner: &Arc<Inner>, delivery: &Delivery, value: serde_json::Value) {
    let envelope: Envelope = match serde_json::from_value(value) {
        Ok(e) => e,
        Err(e) => {
            let reason = format!("malformed process-manager envelope: {e}");
            return dead_letter(inner, delivery, reason, None).await;
        }
    };
    let Some(pm) = inner.processes.get(envelope.process.as_str()).cloned() else {
        let mut known: Vec<_> = inner.processes.keys().copied().collect();
        known.sort_unstable();
        let reason = format!(
            "unknown process manager `{}`: this worker runs [{}]",
            envelope.process,
            known.join(", ")
        );
        inner.metrics.dead_lettered.fetch_add(1, Ordering::Relaxed);
        return dead_letter(inner, delivery, reason, None).await;
    };
    let backend = &inner.backend;
    // Pessimistic mode: one handler per instance at a time.
    let lease = if pm.definition().concurrency == Concurrency::Pessimistic {
        let name = match instance_lock_name(pm.as_ref(), backend.as_ref(), &envelope).await {
            Ok(name) => name,
            Err(error) => {
                tracing::warn!(%error, "resolving the instance failed; message handed back");
                let _ = backend
                    .release(delivery, inner.settings.lock_retry_delay)
                    .await;
                return;
            }
        };
        let token = uuid::Uuid::new_v4().simple().to_string();
        match backend
            .named_lease(&name, &token, inner.settings.lock_ttl)
            .await
        {
            Ok(true) => Some(NamedLeaseGuard {
                inner: inner.clone(),
                name,
                token,
            }),
            _ => {
                let _ = backend
                    .release(delivery, inner.settings.lock_retry_delay)
                    .await;
                return;
            }
        }
    } else {
        None
    };
    let subscribers = |t: &str| inner.subscribers(t);
    let env = DispatchEnv {
        backend: backend.as_ref(),
        subscribers: &subscribers,
        now_ms: Timestamp::now().0,
        delivery: Some(delivery),
        dead_letter_unmatched: inner.settings.dead_letter_unmatched,
    };
    let span = tracing::info_span!(
        "process_message",
        process = %envelope.process,
        message_type = %envelope.message_type,
        message_id = %envelope.message_id,
    );
    // Keep the message (and the pessimistic lease) alive while the handler
    // and its conflict re-runs take their time, so no other worker takes
    // the message over meanwhile.
    let keep_alive = async {
        loop {
            tokio::time::sleep(inner.settings.cancel_poll).await;
            let _ = backend.touch(delivery).await;
            if let Some(lease) = &lease {
                let _ = backend
                    .named_lease(&lease.name, &lease.token, inner.settings.lock_ttl)
                    .await;
            }
        }
    };
    let result = tokio::select! {
        result = dispatch(pm.as_ref(), &env, &envelope).instrument(span) => result,
        never = keep_alive => never,
    };
    if let Some(mut lease) = lease {
        // Release inline; the guard's spawned release is for abnormal exits.
        let (name, token) = (
            std::mem::take(&mut lease.name),
            std::mem::take(&mut lease.token),
        );
        let _ = backend.release_named_lease(&name, &token).await;
    }
    let m = &inner.metrics;
    match result {
        Ok(Dispatched::Handled { .. }) => m.handled.fetch_add(1, Ordering::Relaxed),
        Ok(Dispatched::Duplicate { .. }) => m.duplicates.fetch_add(1, Ordering::Relaxed),
        Ok(Dispatched::Ignored { .. }) => m.ignored.fetch_add(1, Ordering::Relaxed),
        Ok(Dispatched::Unmatched { .. }) => m.unmatched.fetch_add(1, Ordering::Relaxed),
        Ok(Dispatched::Failed { .. }) => m.failed.fetch_add(1, Ordering::Relaxed),
        Ok(Dispatched::DeadLettered { .. }) => m.dead_lettered.fetch_add(1, Ordering::Relaxed),
        Err(error) => {
            tracing::warn!(%error, "process message not recorded; it will be redelivered");
            let _ = backend
                .release(delivery, inner.settings.lock_retry_delay)
                .await;
            0
        }
    };
}

/// The pessimistic lock of the instance a message is for: the instance's
/// id when it exists, else (a message that may create it) its correlation
/// value, so that two racing starters serialise too.
async fn instance_lock_name(
    pm: &dyn ErasedProcess,
    backend: &dyn crate::backend::Backend,
    envelope: &Envelope,
) -> Result<String, BackendError> {
    let process = &envelope.process;
    if let Some(id) = &envelope.instance_id {
        return Ok(format!("pm-lock:{process}:{id}"));
    }
    let key = pm
        .message_key(&envelope.message_type, &envelope.payload)
        .ok()
        .flatten()
        .unwrap_or_default();
    let found = match pm
        .definition()
        .handler(&envelope.message_type)
        .map(|h| h.correlation)
    {
        Some(Correlation::Field { state_field, .. }) => {
            backend.process_find(process, state_field, &key).await?
        }
        _ => backend.process_load(process, &key).await?,
    };
    Ok(match found {
        Some(instance) => format!("pm-lock:{process}:{}", instance.id),
        None => format!("pm-lock:{process}:new:{key}"),
    })
}

/// Releases a pessimistic lease however handling ends (including the
/// future being dropped at shutdown).
struct NamedLeaseGuard {
    inner: Arc<Inner>,
    name: String,
    token: String,
}

impl Drop for NamedLeaseGuard {
    fn drop(&mut self) {
        if self.name.is_empty() {
            return; // released already
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let backend = self.inner.backend.clone();
            let (name, token) = (
                std::mem::take(&mut self.name),
                std::mem::take(&mut self.token),
            );
            handle.spawn(async move {
                let _ = backend.release_named_lease(&name, &token).await;
            });
        }
    }
}

/// Moves due timeouts (and delayed retries) onto the queue while this
/// engine holds the poller lease, so that pollers in many processes do not
/// all scan. Delivery is exactly-once per schedule entry even without the
/// lease: the backend moves each entry atomically.
pub(crate) async fn poll_timeouts(inner: Arc<Inner>) {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let lease_ttl = (inner.settings.timeout_poll * 20).max(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            _ = tokio::time::sleep(inner.settings.timeout_poll) => {}
        }
        match inner
            .backend
            .named_lease("timeout-poller", &token, lease_ttl)
            .await
        {
            Ok(true) => loop {
                match inner
                    .backend
                    .process_release_due(Timestamp::now().0, 256)
                    .await
                {
                    Ok(256) => continue,
                    Ok(_) => break,
                    Err(error) => {
                        tracing::warn!(%error, "releasing due timeouts failed; will retry");
                        break;
                    }
                }
            },
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, "timeout poller lease failed; will retry"),
        }
    }
}

/// What a run of attempts ended with.
enum Attempted {
    Succeeded(Value),
    Cancelled(String),
    Exhausted {
        error: String,
        invalid_payload: bool,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Step,
    Compensation,
}

struct Run<'a> {
    /// When the lease was last taken or extended.
    extended_at: std::sync::Mutex<tokio::time::Instant>,
    inner: &'a Arc<Inner>,
    saga: &'a dyn ErasedSaga,
    def: &'static SagaDefinition,
    lease: &'a Lease,
    delivery: &'a Delivery,
    token: CancellationToken,
}

impl Run<'_> {
    async fn advance(
        &self,
        mut task: TaskInstance,
        cancel: Option<Timestamp>,
    ) -> Result<(), BackendError> {
        let mut settle_reason = None;
        let mut before_decision = None;
        if task.cancelled_at.is_none()
            && matches!(task.status, TaskStatus::Pending | TaskStatus::Running)
        {
            if let Some(at) = cancel {
                self.begin_cancel(&mut task, at);
            }
        }
        match task.status {
            TaskStatus::Pending | TaskStatus::Running => {
                (settle_reason, before_decision) = self.run_next_step(&mut task).await?;
            }
            TaskStatus::Compensating => self.compensate_next(&mut task).await?,
            _ => {}
        }
        let guarded = before_decision.is_some();
        match self.commit(task, settle_reason, guarded).await {
            // Cancellation was requested after the step finished and before
            // this commit: it wins over completing or failing the task. The
            // step's own result stands; its completed steps are compensated.
            Err(BackendError::CancelRequested { at, .. }) => {
                let mut task = before_decision.expect("only guarded commits are refused");
                self.begin_cancel(&mut task, at);
                self.commit(task, None, false).await
            }
            other => other,
        }
    }

    /// Writes the outcome, the next message and the acknowledgement at once.
    async fn commit(
        &self,
        mut task: TaskInstance,
        dead_letter: Option<String>,
        unless_cancelled: bool,
    ) -> Result<(), BackendError> {
        let next = (!task.status.is_terminal()).then(|| {
            task.seq += 1;
            QueueMessage {
                task_id: task.id,
                saga: task.saga.clone(),
                seq: task.seq,
            }
            .to_payload()
        });
        let settle = match &dead_letter {
            Some(reason) => Settle::DeadLetter(self.delivery, reason),
            None => Settle::Ack(self.delivery),
        };
        self.inner
            .backend
            .commit(&task, self.lease, next.as_deref(), settle, unless_cancelled)
            .await?;
        if task.status.is_terminal() {
            tracing::info!(task_id = %task.id, saga = self.def.name, status = %task.status, "task finished");
        }
        Ok(())
    }

    fn begin_cancel(&self, task: &mut TaskInstance, at: Timestamp) {
        task.cancelled_at = Some(at);
        task.audit(
            AuditEntry::new(AuditAction::CancellationRequested).trace(&task.trace_id.clone()),
        );
        self.finish_or_compensate(task);
    }

    /// Moves to `Compensating` if a completed step has a compensation, else
    /// straight to the final status.
    fn finish_or_compensate(&self, task: &mut TaskInstance) {
        if self.next_compensable(task).is_some() {
            task.set_status(TaskStatus::Compensating);
        } else if task.cancelled_at.is_some() {
            task.set_status(TaskStatus::Cancelled);
        } else {
            task.set_status(TaskStatus::Compensated);
        }
    }

    /// The last completed step that has a compensation (or whose compensation
    /// was interrupted by a crash).
    fn next_compensable(&self, task: &TaskInstance) -> Option<usize> {
        task.steps.iter().enumerate().rev().find_map(|(i, rec)| {
            let has = self
                .def
                .steps
                .get(i)
                .is_some_and(|d| d.compensation.is_some());
            (has && matches!(rec.status, StepStatus::Completed | StepStatus::Compensating))
                .then_some(i)
        })
    }

    /// Runs the next step. Returns a dead-letter reason when the task is
    /// parked, and, when the step's outcome ends the running phase
    /// (completed, failed, compensating), the task as it was just before that
    /// decision: the commit is then refused if cancellation was requested,
    /// and cancellation is applied to that copy instead.
    async fn run_next_step(
        &self,
        task: &mut TaskInstance,
    ) -> Result<(Option<String>, Option<TaskInstance>), BackendError> {
        let Some(idx) = task
            .steps
            .iter()
            .position(|s| s.status != StepStatus::Completed)
        else {
            task.set_status(TaskStatus::Completed);
            return Ok((None, None));
        };
        let input = match idx {
            0 => task.input.clone(),
            _ => task.steps[idx - 1].output.clone().unwrap_or(Value::Null),
        };
        let step_def = &self.def.steps[idx];
        let outcome = self.attempts(task, idx, Phase::Step, input).await?;
        let name = step_def.name;
        match outcome {
            Attempted::Succeeded(output) => {
                let rec = &mut task.steps[idx];
                rec.status = StepStatus::Completed;
                rec.completed_at = Some(Timestamp::now());
                rec.output = Some(output.clone());
                let attempt = rec.attempt_count;
                task.audit(
                    AuditEntry::new(AuditAction::StepCompleted)
                        .step(name)
                        .attempt(attempt)
                        .worker(&self.delivery.consumer),
                );
                // A cancellation that arrived during the step: the keep-alive
                // relays it to the token within a poll interval; before the
                // last step completes the task, ask the backend too (one read
                // per task), so an accepted cancellation is never overtaken
                // by completion.
                let last = idx + 1 == task.steps.len();
                let cancel = if self.token.is_cancelled() {
                    self.inner.backend.cancel_requested(task.id).await?
                } else {
                    None
                };
                if let Some(at) = cancel {
                    self.begin_cancel(task, at);
                    Ok((None, None))
                } else if last {
                    let before = task.clone();
                    task.output = Some(output);
                    task.set_status(TaskStatus::Completed);
                    Ok((None, Some(before)))
                } else {
                    task.set_status(TaskStatus::Running);
                    Ok((None, None))
                }
            }
            Attempted::Cancelled(error) => {
                let rec = &mut task.steps[idx];
                rec.status = StepStatus::Failed;
                rec.error = Some(format!("cancelled: {error}"));
                let attempt = rec.attempt_count;
                task.audit(
                    failed(
                        Phase::Step,
                        name,
                        attempt,
                        &format!("cancelled: {error}"),
                        None,
                        true,
                    )
                    .worker(&self.delivery.consumer),
                );
                let at = self
                    .inner
                    .backend
                    .cancel_requested(task.id)
                    .await?
                    .unwrap_or_else(Timestamp::now);
                self.begin_cancel(task, at);
                Ok((None, None))
            }
            Attempted::Exhausted {
                error,
                invalid_payload,
            } => {
                let trace_id = task.trace_id.clone();
                let rec = &mut task.steps[idx];
                rec.status = StepStatus::Failed;
                rec.error = Some(error.clone());
                rec.trace_id = Some(trace_id);
                task.error = Some(format!("step `{name}` failed: {error}"));
                let action = if invalid_payload {
                    OnExhausted::DeadLetter
                } else {
                    step_def.retry.on_exhausted
                };
                let before = Some(task.clone());
                match action {
                    OnExhausted::Compensate => {
                        self.finish_or_compensate(task);
                        Ok((None, before))
                    }
                    OnExhausted::Fail => {
                        task.set_status(TaskStatus::Failed);
                        Ok((None, before))
                    }
                    OnExhausted::DeadLetter => {
                        let reason = format!("saga `{}` step `{name}`: {error}", self.def.name);
                        task.audit(
                            AuditEntry::new(AuditAction::DeadLettered)
                                .step(name)
                                .error(&reason),
                        );
                        task.set_status(TaskStatus::DeadLettered);
                        Ok((Some(reason), before))
                    }
                }
            }
        }
    }

    /// Runs the next compensation, in reverse step order.
    async fn compensate_next(&self, task: &mut TaskInstance) -> Result<(), BackendError> {
        let Some(idx) = self.next_compensable(task) else {
            self.finish_or_compensate(task);
            return Ok(());
        };
        let output = task.steps[idx].output.clone().unwrap_or(Value::Null);
        let step_name = self.def.steps[idx].name;
        match self
            .attempts(task, idx, Phase::Compensation, output)
            .await?
        {
            Attempted::Succeeded(_) => {
                let rec = &mut task.steps[idx];
                rec.status = StepStatus::Compensated;
                let attempt = rec.compensation_attempts;
                task.audit(
                    AuditEntry::new(AuditAction::StepCompensated)
                        .step(step_name)
                        .attempt(attempt)
                        .worker(&self.delivery.consumer),
                );
                if self.next_compensable(task).is_none() {
                    self.finish_or_compensate(task);
                }
            }
            Attempted::Cancelled(error) | Attempted::Exhausted { error, .. } => {
                let trace_id = task.trace_id.clone();
                let rec = &mut task.steps[idx];
                rec.status = StepStatus::CompensationFailed;
                rec.compensation_error = Some(error.clone());
                rec.trace_id = Some(trace_id.clone());
                let details = json!({
                    "step": step_name,
                    "error": error,
                    "trace_id": trace_id,
                    "attempt_count": rec.attempt_count,
                    "compensation_attempts": rec.compensation_attempts,
                });
                let attempts = rec.compensation_attempts;
                tracing::error!(
                    task_id = %task.id, saga = self.def.name, step = step_name, %trace_id, %error,
                    "compensation FAILED; manual intervention required"
                );
                task.error = Some(format!(
                    "compensation of step `{step_name}` failed: {error}"
                ));
                task.audit(
                    AuditEntry::new(AuditAction::CompensationFailed)
                        .step(step_name)
                        .attempt(attempts)
                        .error(&error)
                        .trace(&trace_id)
                        .details(details.to_string()),
                );
                task.set_status(TaskStatus::CompensationFailed);
            }
        }
        Ok(())
    }

    /// Calls a step (or its compensation) under its retry policy, circuit
    /// breaker and idempotency guard, persisting each attempt before the call.
    async fn attempts(
        &self,
        task: &mut TaskInstance,
        idx: usize,
        phase: Phase,
        input: Value,
    ) -> Result<Attempted, BackendError> {
        let step_def = &self.def.steps[idx];
        let (policy, method) = match (phase, &step_def.compensation) {
            (Phase::Compensation, Some(c)) => (c.retry, c.name),
            _ => (step_def.retry, step_def.name),
        };
        let breaker = match phase {
            Phase::Step => self.inner.breaker(self.def.name, step_def),
            Phase::Compensation => None,
        };
        let token = match phase {
            Phase::Step => self.token.clone(),
            // Compensation undoes work; cancelling it would leave things
            // half-undone, so it never sees the task's cancellation.
            Phase::Compensation => CancellationToken::new(),
        };
        loop {
            let rec = &task.steps[idx];
            let used = match phase {
                Phase::Step => rec.attempt_count - rec.retry_base,
                Phase::Compensation => rec.compensation_attempts,
            };
            if used > policy.max_retries {
                // A worker died during the last allowed attempt.
                let last_error = match phase {
                    Phase::Step => &rec.error,
                    Phase::Compensation => &rec.compensation_error,
                };
                return Ok(Attempted::Exhausted {
                    error: last_error.clone().unwrap_or_else(|| {
                        format!("retries exhausted: attempt {used} did not report back")
                    }),
                    invalid_payload: false,
                });
            }
            let permit = match breaker.as_deref().map(|b| b.try_acquire()) {
                Some(Err(open)) => {
                    let error = format!("{open}");
                    task.audit(
                        AuditEntry::new(AuditAction::CircuitOpen)
                            .step(method)
                            .error(&error),
                    );
                    return Ok(Attempted::Exhausted {
                        error,
                        invalid_payload: false,
                    });
                }
                Some(Ok(permit)) => Some(permit),
                None => None,
            };

            // Persist the attempt before the call, so a crash does not reset it.
            let rec = &mut task.steps[idx];
            let attempt = match phase {
                Phase::Step => {
                    rec.attempt_count += 1;
                    rec.status = StepStatus::Running;
                    rec.started_at.get_or_insert_with(Timestamp::now);
                    rec.attempt_count
                }
                Phase::Compensation => {
                    rec.compensation_attempts += 1;
                    rec.status = StepStatus::Compensating;
                    rec.compensation_attempts
                }
            };
            if phase == Phase::Step && task.status == TaskStatus::Pending {
                task.set_status(TaskStatus::Running);
            }
            let key = format!("{}:{}:{}", task.id, method, attempt);
            let (version, claimed) = self
                .inner
                .backend
                .save_and_claim(task, self.lease, &key, self.inner.settings.idempotency_ttl)
                .await?;
            task.version = version;

            let failure = if !claimed {
                // Someone else started this attempt number: a duplicate
                // delivery, or a worker whose lease expired. We hold the
                // lease now, so that execution is stale; never run the same
                // attempt twice. A step skips to the next attempt number
                // without spending its retry budget (the skipped attempt did
                // not fail here); a compensation counts it as failed.
                drop(permit);
                task.audit(
                    AuditEntry::new(AuditAction::DuplicateAttempt)
                        .step(method)
                        .attempt(attempt),
                );
                if phase == Phase::Step {
                    task.steps[idx].retry_base += 1;
                    continue;
                }
                format!("idempotency key {key} was already claimed; attempt counted as failed instead of running twice")
            } else {
                let ctx = StepContext {
                    task_id: task.id,
                    saga: self.def.name,
                    step: method,
                    attempt,
                    trace_id: task.trace_id.clone(),
                    token: token.clone(),
                };
                let span = tracing::info_span!(
                    "saga_step",
                    task_id = %task.id,
                    saga = self.def.name,
                    step = method,
                    attempt,
                    trace_id = %task.trace_id,
                    compensation = phase == Phase::Compensation,
                );
                let call = async {
                    match phase {
                        Phase::Step => {
                            self.saga
                                .execute_step(step_def.order, input.clone(), &ctx)
                                .await
                        }
                        Phase::Compensation => self
                            .saga
                            .compensate_step(step_def.order, input.clone(), &ctx)
                            .await
                            .map(|()| Value::Null),
                    }
                }
                .instrument(span);
                // A panicking step is a failed attempt, not a dead worker.
                let call = std::panic::AssertUnwindSafe(call).catch_unwind().map(|r| {
                    r.unwrap_or_else(|panic| {
                        Err(StepError::transient(format!(
                            "step panicked: {}",
                            panic_message(&*panic)
                        )))
                    })
                });
                let result = tokio::select! {
                    r = call => r,
                    lost = self.keep_alive() => return Err(lost),
                };
                let error = match result {
                    Ok(value) => {
                        if let Some(p) = permit {
                            p.success();
                        }
                        return Ok(Attempted::Succeeded(value));
                    }
                    Err(error) => error,
                };
                let text = error.to_string();
                match phase {
                    Phase::Step => task.steps[idx].error = Some(text.clone()),
                    Phase::Compensation => task.steps[idx].compensation_error = Some(text.clone()),
                }
                if error.kind() == StepErrorKind::InvalidPayload {
                    return Ok(Attempted::Exhausted {
                        error: text,
                        invalid_payload: true,
                    });
                }
                if phase == Phase::Step && token.is_cancelled() {
                    return Ok(Attempted::Cancelled(text));
                }
                match (permit, error.is_transient()) {
                    (Some(p), true) => p.failure(),
                    // A permanent error proves the endpoint answered.
                    (Some(p), false) => p.success(),
                    (None, _) => {}
                }
                if !error.is_transient() {
                    task.audit(
                        failed(phase, method, attempt, &text, None, true)
                            .worker(&self.delivery.consumer),
                    );
                    return Ok(Attempted::Exhausted {
                        error: text,
                        invalid_payload: false,
                    });
                }
                text
            };

            let Some(delay) = policy.schedule(used).next_backoff() else {
                task.audit(
                    failed(phase, method, attempt, &failure, None, false)
                        .worker(&self.delivery.consumer),
                );
                return Ok(Attempted::Exhausted {
                    error: failure,
                    invalid_payload: false,
                });
            };
            task.audit(
                failed(phase, method, attempt, &failure, Some(delay), false)
                    .worker(&self.delivery.consumer),
            );
            tracing::debug!(task_id = %task.id, step = method, attempt, ?delay, error = %failure, "attempt failed; retrying");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = token.cancelled() => return Ok(Attempted::Cancelled(format!("while waiting to retry after: {failure}"))),
                lost = self.keep_alive() => return Err(lost),
            }
        }
    }

    /// Keeps the lease and the message alive while a step runs or waits, and
    /// relays cancellation requested in another process. Completes only when
    /// the lease is lost.
    async fn keep_alive(&self) -> BackendError {
        let settings = &self.inner.settings;
        let tick = (settings.lock_ttl / 3)
            .min(settings.cancel_poll)
            .max(Duration::from_millis(10));
        loop {
            tokio::time::sleep(tick).await;
            match self
                .inner
                .backend
                .heartbeat(self.lease, self.delivery, settings.lock_ttl)
                .await
            {
                Ok(beat) if !beat.lock_held => {
                    return BackendError::LockLost {
                        task: self.lease.task_id,
                        fence: self.lease.fence,
                    }
                }
                Ok(beat) => {
                    *self.extended_at.lock().unwrap_or_else(|p| p.into_inner()) =
                        tokio::time::Instant::now();
                    if beat.cancel_requested.is_some() {
                        self.token.cancel();
                    }
                }
                // A blip (Redis restarting): the lease has TTL to spare and
                // the next beat retries. But once the lease may have expired
                // unseen, another worker may have taken the task: stop
                // running the step rather than run it twice at once.
                Err(error) => {
                    let since = self.extended_at().elapsed();
                    if since + tick >= settings.lock_ttl {
                        tracing::warn!(%error, ?since, "heartbeats failing for a whole lease; abandoning the step");
                        return BackendError::LockLost {
                            task: self.lease.task_id,
                            fence: self.lease.fence,
                        };
                    }
                    tracing::warn!(%error, "heartbeat failed; will retry");
                }
            }
        }
    }

    fn extended_at(&self) -> tokio::time::Instant {
        *self.extended_at.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn failed(
    phase: Phase,
    step: &str,
    attempt: u32,
    error: &str,
    retry_in: Option<Duration>,
    permanent: bool,
) -> AuditEntry {
    let retry_in_ms = retry_in.map(|d| d.as_millis() as u64);
    let action = match phase {
        Phase::Step => AuditAction::AttemptFailed {
            retry_in_ms,
            permanent,
        },
        Phase::Compensation => AuditAction::CompensationAttemptFailed { retry_in_ms },
    };
    AuditEntry::new(action)
        .step(step)
        .attempt(attempt)
        .error(error)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}
