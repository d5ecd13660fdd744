//! A handle whose calls ride out an unreachable backend for a short,
//! fixed time instead of the whole client retry policy: an HTTP request
//! must answer before the proxy in front of it gives up (a typical proxy
//! waits 30 to 60 s), while a worker or a program calling the engine may
//! well wait a minute for Redis to come back.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::Engine;
use crate::backend::BackendError;
use crate::error::Error;

/// The first pause between tries; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between tries.
const MAX_PAUSE: Duration = Duration::from_secs(1);

impl Engine {
    /// The same engine, whose calls give up with [`Error::Unavailable`]
    /// once the backend stayed unreachable for `budget` (each try is cut
    /// off at the budget too), instead of riding out the whole
    /// [client retry policy](crate::EngineBuilder::client_retry).
    ///
    /// A call cut off in flight may or may not have been applied, as when
    /// its reply is lost: every engine call is idempotent or says what it
    /// found (a start with a key finds its task, a cancellation answers
    /// `AlreadyCancelled`).
    pub fn with_retry_budget(&self, budget: Duration) -> Engine {
        Engine {
            budget: Some(budget),
            ..self.clone()
        }
    }

    /// Runs `call` until it succeeds, fails for good, or the backend stayed
    /// unreachable for this handle's budget, else the client retry policy.
    pub(crate) async fn retrying<T, F, Fut>(
        &self,
        operation: &'static str,
        call: F,
    ) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, BackendError>>,
    {
        match self.budget {
            None => self.rt.retrying(operation, call).await,
            Some(budget) => within(budget, operation, call).await,
        }
    }
}

/// Runs `call` until it succeeds, fails for good, or `budget` is spent.
async fn within<T, F, Fut>(
    budget: Duration,
    operation: &'static str,
    mut call: F,
) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, BackendError>>,
{
    let deadline = Instant::now() + budget;
    let mut pause = FIRST_PAUSE;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let error = match tokio::time::timeout_at(deadline, call()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) if error.is_transient() => error,
            Ok(Err(error)) => return Err(error.into()),
            Err(_) => BackendError::unavailable(format!("no answer within {budget:?}")),
        };
        let now = Instant::now();
        // A dropped connection is only noticed when used, and the failure
        // sets up a fresh one: the second try goes at once.
        let wait = if attempts == 1 { Duration::ZERO } else { pause };
        if now + wait >= deadline {
            return Err(Error::Unavailable {
                operation,
                attempts,
                source: error,
            });
        }
        tracing::debug!(operation, %error, ?wait, "backend unavailable; retrying");
        if attempts > 1 {
            pause = (pause * 2).min(MAX_PAUSE);
        }
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn a_budget_ends_the_retries_on_time() {
        let tries = AtomicU32::new(0);
        let started = Instant::now();
        let result: Result<(), Error> = within(Duration::from_secs(3), "task", || async {
            tries.fetch_add(1, Ordering::Relaxed);
            Err(BackendError::unavailable(
                "Connection refused (os error 111)",
            ))
        })
        .await;
        let took = started.elapsed();
        assert!(matches!(
            result,
            Err(Error::Unavailable {
                operation: "task",
                ..
            })
        ));
        assert!(took <= Duration::from_secs(3), "{took:?}");
        assert!(took >= Duration::from_secs(2), "gave up early: {took:?}");
        assert!(tries.load(Ordering::Relaxed) >= 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_hangs_is_cut_off_at_the_budget() {
        let started = Instant::now();
        let result: Result<(), Error> = within(Duration::from_secs(2), "task", || {
            std::future::pending::<Result<(), BackendError>>()
        })
        .await;
        assert!(matches!(result, Err(Error::Unavailable { .. })));
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_not_retried() {
        let tries = AtomicU32::new(0);
        let result: Result<(), Error> = within(Duration::from_secs(2), "task", || async {
            tries.fetch_add(1, Ordering::Relaxed);
            Err(BackendError::Misconfigured("x".into()))
        })
        .await;
        assert!(matches!(result, Err(Error::Backend(_))));
        assert_eq!(tries.load(Ordering::Relaxed), 1);
    }
}
