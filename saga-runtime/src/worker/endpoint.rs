//! An endpoint's consumer at work ([`Engine::consumer`](crate::Engine::consumer)):
//! receive, run the handler with its retries while keeping the message,
//! settle or dead-letter it, trim what every group has settled.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;

use super::runtime::Runtime;
use crate::backend::{BackendError, EndpointDelivery, Endpoints, ProcessBackend};
use crate::error::{Error, StepError};
use crate::model::endpoint::EndpointMessage;
use crate::policy::{Backoff, RetryPolicy};

/// How long a consumer waits for a message before looking again (and at
/// shutdown).
const BLOCK: Duration = Duration::from_secs(1);
/// How often a busy consumer removes what every group has settled (an
/// idle one does it at once).
const TRIM_EVERY: Duration = Duration::from_secs(5);

/// What a consumer reads and how it treats its messages (the settings of
/// [`Consumer`](crate::endpoint::Consumer)).
#[derive(Debug, Clone)]
pub(crate) struct ConsumerSpec {
    pub endpoint: String,
    pub group: String,
    pub retry: RetryPolicy,
    pub max_deliveries: u32,
    pub handler_timeout: Duration,
    pub visibility: Duration,
    pub concurrency: usize,
}

/// One consumer loop of `spec`, named `name`, with the engine's runtime.
#[derive(Clone)]
pub(crate) struct EndpointConsumer {
    rt: Arc<Runtime>,
    endpoints: Arc<dyn ProcessBackend>,
    spec: ConsumerSpec,
}

/// Runs `spec.concurrency` consumers until the engine shuts down; each
/// leaves the group when it stops.
pub(crate) async fn run<F, Fut>(
    rt: Arc<Runtime>,
    spec: ConsumerSpec,
    handler: F,
) -> Result<(), BackendError>
where
    F: Fn(EndpointMessage) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), StepError>> + Send + 'static,
{
    let endpoints = rt.process_store()?;
    let this = EndpointConsumer {
        rt,
        endpoints,
        spec,
    };
    let loops = (0..this.spec.concurrency).map(|n| {
        let (this, handler) = (this.clone(), handler.clone());
        let name = format!("{}-{n}", this.rt.instance);
        this.rt.tasks.clone().track_future(async move {
            this.consume(&name, handler).await;
            // Leave the group rather than stay in it for ever; one that
            // could not (it held a message) is removed once idle.
            let left = this
                .backend()
                .endpoint_leave(&this.spec.endpoint, &this.spec.group, &name)
                .await;
            if let Err(error) = left {
                tracing::debug!(endpoint = %this.spec.endpoint, %error, "could not leave the group");
            }
        })
    });
    futures::future::join_all(loops).await;
    Ok(())
}

impl EndpointConsumer {
    fn backend(&self) -> &dyn Endpoints {
        &*self.endpoints
    }

    async fn consume<F, Fut>(&self, consumer: &str, handler: F)
    where
        F: Fn(EndpointMessage) -> Fut,
        Fut: Future<Output = Result<(), StepError>>,
    {
        let shutdown = self.rt.shutdown.clone();
        let mut trimmed = tokio::time::Instant::now();
        let mut settled = false;
        let mut failures = 0u32;
        while !shutdown.is_cancelled() {
            if settled && trimmed.elapsed() >= TRIM_EVERY {
                self.trim(&mut settled, &mut trimmed).await;
            }
            let received = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = self.backend().endpoint_receive(
                    &self.spec.endpoint, &self.spec.group, consumer, self.spec.visibility, BLOCK,
                ) => r,
            };
            let delivery = match received {
                Ok(Some(d)) => d,
                // Idle: a good time to trim.
                Ok(None) if settled => {
                    self.trim(&mut settled, &mut trimmed).await;
                    continue;
                }
                Ok(None) => continue,
                Err(error) => {
                    // The store is away: wait a little longer each time,
                    // up to the read's own block time.
                    failures += 1;
                    let pause = Duration::from_millis(50 * u64::from(failures.min(20)));
                    tracing::warn!(endpoint = %self.spec.endpoint, %error, "endpoint read failed");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(pause) => continue,
                    }
                }
            };
            failures = 0;
            // A shutdown lets the handler finish within the engine's
            // shutdown grace; past it the message is left unsettled, and
            // another consumer takes it after the visibility timeout.
            let handled = self.handle(consumer, &delivery, &handler);
            tokio::pin!(handled);
            let dead = tokio::select! {
                dead = &mut handled => dead,
                _ = shutdown.cancelled() => {
                    let grace = self.rt.settings.shutdown_grace;
                    match tokio::time::timeout(grace, &mut handled).await {
                        Ok(dead) => dead,
                        Err(_) => return,
                    }
                }
            };
            match self.settle(&delivery, dead.as_deref()).await {
                Ok(()) => {
                    settled = true;
                    if dead.is_some() {
                        crate::metrics::dead_lettered(crate::metrics::DeadLetterKind::Endpoint);
                    }
                }
                // Not settled: it comes back after the visibility timeout.
                Err(error) => {
                    tracing::warn!(endpoint = %self.spec.endpoint, message = %delivery.id, %error, "could not settle a message")
                }
            }
        }
    }

    /// Removes what every group has settled.
    async fn trim(&self, settled: &mut bool, at: &mut tokio::time::Instant) {
        *settled = false;
        *at = tokio::time::Instant::now();
        let idle = self.rt.settings.idle_consumers;
        if let Err(error) = self
            .backend()
            .endpoint_trim(&self.spec.endpoint, idle)
            .await
        {
            tracing::debug!(endpoint = %self.spec.endpoint, %error, "trim failed");
        }
    }

    async fn settle(&self, d: &EndpointDelivery, dead: Option<&str>) -> Result<(), Error> {
        self.rt
            .retrying("endpoint settle", || {
                self.backend()
                    .endpoint_settle(&self.spec.endpoint, &self.spec.group, d, dead)
            })
            .await
    }

    /// Runs the handler (with its retries) on one delivery, keeping the
    /// message touched meanwhile; `Some(reason)` to dead-letter it.
    async fn handle<F, Fut>(
        &self,
        consumer: &str,
        delivery: &EndpointDelivery,
        handler: &F,
    ) -> Option<String>
    where
        F: Fn(EndpointMessage) -> Fut,
        Fut: Future<Output = Result<(), StepError>>,
    {
        if delivery.deliveries > self.spec.max_deliveries {
            return Some(format!(
                "delivered {} times without being settled: its handler kills the consumer or never returns",
                delivery.deliveries
            ));
        }
        let mut message = match EndpointMessage::parse(&delivery.raw) {
            Ok(m) => m,
            Err(reason) => return Some(format!("malformed message: {reason}")),
        };
        message.deliveries = delivery.deliveries;
        let mut schedule = self.spec.retry.schedule(0);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let call = handler(message.clone());
            let call = tokio::time::timeout(
                self.spec.handler_timeout,
                AssertUnwindSafe(call).catch_unwind(),
            );
            let outcome = self.touching(consumer, delivery, call).await;
            let error = match outcome {
                Ok(Ok(Ok(()))) => return None,
                Ok(Ok(Err(e))) if !e.is_transient() => {
                    return Some(format!("permanent error: {e}"));
                }
                Ok(Ok(Err(e))) => e.to_string(),
                Ok(Err(panic)) => format!("handler panicked: {}", super::panic_message(&*panic)),
                Err(_) => format!(
                    "handler timed out after {}",
                    humantime::format_duration(self.spec.handler_timeout)
                ),
            };
            let Some(delay) = schedule.next_backoff() else {
                return Some(format!("failed {attempts} times; last: {error}"));
            };
            tracing::warn!(endpoint = %self.spec.endpoint, message = %message.message_id, %error, ?delay, "endpoint handler failed; retrying");
            self.touching(consumer, delivery, tokio::time::sleep(delay))
                .await;
        }
    }

    /// Runs `work`, touching the message every third of the visibility
    /// timeout so no other consumer takes it over meanwhile.
    async fn touching<T>(
        &self,
        consumer: &str,
        delivery: &EndpointDelivery,
        work: impl Future<Output = T>,
    ) -> T {
        tokio::pin!(work);
        let every = self.spec.visibility / 3;
        loop {
            tokio::select! {
                done = &mut work => return done,
                _ = tokio::time::sleep(every) => {
                    let touched = self
                        .backend()
                        .endpoint_touch(&self.spec.endpoint, &self.spec.group, consumer, &delivery.id)
                        .await;
                    if let Err(error) = touched {
                        tracing::warn!(endpoint = %self.spec.endpoint, %error, "could not keep a message");
                    }
                }
            }
        }
    }
}
