//! [`Consumer`]: runs a handler for each message of an endpoint.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

use super::EndpointMessage;
use crate::backend::{EndpointDelivery, Endpoints};
use crate::engine::Engine;
use crate::error::{Error, StepError};
use crate::policy::{Backoff, BackoffKind, RetryPolicy};

/// How long a consumer waits for a message before looking again (and at
/// shutdown).
const BLOCK: Duration = Duration::from_secs(1);
/// How often a busy consumer removes what every group has settled (an
/// idle one does it at once).
const TRIM_EVERY: Duration = Duration::from_secs(5);

/// A consumer of an endpoint: [`Engine::consumer`]. Configure, then
/// [`run`](Self::run) (or [`spawn`](Self::spawn)) with the handler.
///
/// ```no_run
/// # use saga_runtime::prelude::*;
/// # #[derive(Message, serde::Serialize, serde::Deserialize)] struct SendInvoice { order: String }
/// # async fn run(engine: Engine) -> Result<(), saga_runtime::Error> {
/// engine
///     .consumer("invoicing")
///     .group("billing")
///     .run(|message| async move {
///         let invoice: SendInvoice = message.decode()?;
///         println!("invoice for {}", invoice.order);
///         Ok(())
///     })
///     .await
/// # }
/// ```
#[derive(Clone)]
#[must_use = "a consumer does nothing until `run` or `spawn`"]
pub struct Consumer {
    engine: Engine,
    endpoint: String,
    group: String,
    retry: RetryPolicy,
    max_deliveries: u32,
    handler_timeout: Duration,
    visibility: Duration,
    concurrency: usize,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("endpoint", &self.endpoint)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// A consumer of the endpoint `endpoint` (see [`crate::endpoint`]), in
    /// the group `consumers` unless [`group`](Consumer::group) says
    /// otherwise.
    pub fn consumer(&self, endpoint: &str) -> Consumer {
        Consumer {
            engine: self.clone(),
            endpoint: endpoint.to_owned(),
            group: "consumers".to_owned(),
            retry: RetryPolicy::new(3, BackoffKind::Exponential, 200),
            max_deliveries: 5,
            handler_timeout: Duration::from_secs(30),
            visibility: Duration::from_secs(30),
            concurrency: 1,
        }
    }
}

impl Consumer {
    /// The consumer group: each message goes to one consumer of each
    /// group. Give each service that reads the endpoint its own.
    pub fn group(mut self, group: &str) -> Self {
        self.group = group.to_owned();
        self
    }

    /// Retries of a handler that fails with a transient error (default: 3,
    /// exponential from 200 ms); then the message is dead-lettered.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Deliveries after which a message that was never settled (its
    /// handler killed the process, or never returned) is dead-lettered
    /// instead of handled again (default 5).
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n.max(1);
        self
    }

    /// How long one handler call may run (default 30 s): longer counts as
    /// a transient failure.
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = timeout;
        self
    }

    /// How long a message may go untouched before another consumer takes
    /// it over (default 30 s). A live consumer touches its message every
    /// third of it, however long the handler and its retries take.
    pub fn visibility_timeout(mut self, timeout: Duration) -> Self {
        self.visibility = timeout.max(Duration::from_millis(30));
        self
    }

    /// Messages handled at once (default 1; each by its own consumer).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Handles messages until the engine shuts down. An invalid endpoint
    /// or group name is an error at once.
    pub async fn run<F, Fut>(self, handler: F) -> Result<(), Error>
    where
        F: Fn(EndpointMessage) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StepError>> + Send + 'static,
    {
        crate::name::check("endpoint name", &self.endpoint).map_err(Error::Config)?;
        crate::name::check("consumer group", &self.group).map_err(Error::Config)?;
        let loops = (0..self.concurrency).map(|n| {
            let (this, handler) = (self.clone(), handler.clone());
            let name = format!("{}-{n}", self.engine.rt.instance);
            self.engine.rt.tasks.track_future(async move {
                this.consume(&name, handler).await;
                // Leave the group rather than stay in it for ever; one that
                // could not (it held a message) is removed once idle.
                let left = this
                    .backend()
                    .endpoint_leave(&this.endpoint, &this.group, &name)
                    .await;
                if let Err(error) = left {
                    tracing::debug!(endpoint = %this.endpoint, %error, "could not leave the group");
                }
            })
        });
        futures::future::join_all(loops).await;
        Ok(())
    }

    /// [`run`](Self::run) in a task of its own; it stops when the engine
    /// shuts down (and [`Engine::shutdown`] waits for it).
    pub fn spawn<F, Fut>(self, handler: F) -> tokio::task::JoinHandle<Result<(), Error>>
    where
        F: Fn(EndpointMessage) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StepError>> + Send + 'static,
    {
        let tasks = self.engine.rt.tasks.clone();
        tasks.spawn(self.run(handler))
    }

    fn backend(&self) -> &dyn Endpoints {
        &*self.engine.rt.backend
    }

    async fn consume<F, Fut>(&self, consumer: &str, handler: F)
    where
        F: Fn(EndpointMessage) -> Fut,
        Fut: Future<Output = Result<(), StepError>>,
    {
        let shutdown = self.engine.rt.shutdown.clone();
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
                    &self.endpoint, &self.group, consumer, self.visibility, BLOCK,
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
                    tracing::warn!(endpoint = %self.endpoint, %error, "endpoint read failed");
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
                    let grace = self.engine.rt.settings.shutdown_grace;
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
                    tracing::warn!(endpoint = %self.endpoint, message = %delivery.id, %error, "could not settle a message")
                }
            }
        }
    }

    /// Removes what every group has settled.
    async fn trim(&self, settled: &mut bool, at: &mut tokio::time::Instant) {
        *settled = false;
        *at = tokio::time::Instant::now();
        let idle = self.engine.rt.settings.idle_consumers;
        if let Err(error) = self.backend().endpoint_trim(&self.endpoint, idle).await {
            tracing::debug!(endpoint = %self.endpoint, %error, "trim failed");
        }
    }

    async fn settle(&self, d: &EndpointDelivery, dead: Option<&str>) -> Result<(), Error> {
        self.engine
            .retrying("endpoint settle", || {
                self.backend()
                    .endpoint_settle(&self.endpoint, &self.group, d, dead)
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
        if delivery.deliveries > self.max_deliveries {
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
        let mut schedule = self.retry.schedule(0);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let call = handler(message.clone());
            let call =
                tokio::time::timeout(self.handler_timeout, AssertUnwindSafe(call).catch_unwind());
            let outcome = self.touching(consumer, delivery, call).await;
            let error = match outcome {
                Ok(Ok(Ok(()))) => return None,
                Ok(Ok(Err(e))) if !e.is_transient() => {
                    return Some(format!("permanent error: {e}"));
                }
                Ok(Ok(Err(e))) => e.to_string(),
                Ok(Err(panic)) => format!(
                    "handler panicked: {}",
                    crate::worker::panic_message(&*panic)
                ),
                Err(_) => format!(
                    "handler timed out after {}",
                    humantime::format_duration(self.handler_timeout)
                ),
            };
            let Some(delay) = schedule.next_backoff() else {
                return Some(format!("failed {attempts} times; last: {error}"));
            };
            tracing::warn!(endpoint = %self.endpoint, message = %message.message_id, %error, ?delay, "endpoint handler failed; retrying");
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
        let every = self.visibility / 3;
        loop {
            tokio::select! {
                done = &mut work => return done,
                _ = tokio::time::sleep(every) => {
                    let touched = self
                        .backend()
                        .endpoint_touch(&self.endpoint, &self.group, consumer, &delivery.id)
                        .await;
                    if let Err(error) = touched {
                        tracing::warn!(endpoint = %self.endpoint, %error, "could not keep a message");
                    }
                }
            }
        }
    }
}
