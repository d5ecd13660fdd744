//! Running a handler: bounded by the handler timeout, its panics caught;
//! what it did is the machine's to judge (`process::machine`).

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use serde_json::Value;

use super::dispatch::DispatchEnv;
use crate::process::{Envelope, ErasedProcess, Handled, ProcessContext, ProcessError};

/// Runs `pm`'s handler of `envelope` on `state` (`None`: a new instance),
/// bounded by the handler timeout; a panic or a timeout is an error.
pub(super) async fn run_handler(
    pm: &dyn ErasedProcess,
    env: &DispatchEnv<'_>,
    envelope: &Envelope,
    state: Option<Value>,
    ctx: &mut ProcessContext,
) -> Result<Handled, ProcessError> {
    let created = state.is_none();
    let run = pm.handle_json(
        &envelope.message_type,
        envelope.payload.clone(),
        state,
        created,
        ctx,
    );
    let run = tokio::time::timeout(env.handler_timeout, AssertUnwindSafe(run).catch_unwind());
    let result = match run.await {
        Ok(result) => result,
        Err(_) => Ok(Err(ProcessError::new(format!(
            "handler timed out after {} and was dropped",
            humantime::format_duration(env.handler_timeout)
        )))),
    };
    let result = result.unwrap_or_else(|panic| {
        let text = crate::worker::panic_message(&*panic);
        Err(ProcessError::new(format!("handler panicked: {text}")))
    });
    match (result, ctx.error.take()) {
        (Ok(_), Some(error)) => Err(ProcessError::new(error)),
        (result, _) => result,
    }
}
