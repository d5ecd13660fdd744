//! [`Consumer`]: runs a handler for each message of an endpoint.

use std::future::Future;
use std::time::Duration;

use super::Engine;
use crate::error::{Error, StepError};
use crate::model::endpoint::EndpointMessage;
use crate::policy::{BackoffKind, RetryPolicy};
use crate::worker::endpoint::ConsumerSpec;

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
    spec: ConsumerSpec,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("endpoint", &self.spec.endpoint)
            .field("group", &self.spec.group)
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
            spec: ConsumerSpec {
                endpoint: endpoint.to_owned(),
                group: "consumers".to_owned(),
                retry: RetryPolicy::new(3, BackoffKind::Exponential, 200),
                max_deliveries: 5,
                handler_timeout: Duration::from_secs(30),
                visibility: Duration::from_secs(30),
                concurrency: 1,
            },
        }
    }
}

impl Consumer {
    /// The consumer group: each message goes to one consumer of each
    /// group. Give each service that reads the endpoint its own.
    pub fn group(mut self, group: &str) -> Self {
        self.spec.group = group.to_owned();
        self
    }

    /// Retries of a handler that fails with a transient error (default: 3,
    /// exponential from 200 ms); then the message is dead-lettered.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.spec.retry = policy;
        self
    }

    /// Deliveries after which a message that was never settled (its
    /// handler killed the process, or never returned) is dead-lettered
    /// instead of handled again (default 5).
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.spec.max_deliveries = n.max(1);
        self
    }

    /// How long one handler call may run (default 30 s): longer counts as
    /// a transient failure.
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.spec.handler_timeout = timeout;
        self
    }

    /// How long a message may go untouched before another consumer takes
    /// it over (default 30 s). A live consumer touches its message every
    /// third of it, however long the handler and its retries take.
    pub fn visibility_timeout(mut self, timeout: Duration) -> Self {
        self.spec.visibility = timeout.max(Duration::from_millis(30));
        self
    }

    /// Messages handled at once (default 1; each by its own consumer).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.spec.concurrency = n.max(1);
        self
    }

    /// Handles messages until the engine shuts down. An invalid endpoint
    /// or group name is an error at once.
    pub async fn run<F, Fut>(self, handler: F) -> Result<(), Error>
    where
        F: Fn(EndpointMessage) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StepError>> + Send + 'static,
    {
        crate::name::check("endpoint name", &self.spec.endpoint).map_err(Error::Config)?;
        crate::name::check("consumer group", &self.spec.group).map_err(Error::Config)?;
        crate::worker::endpoint::run(self.engine.rt.clone(), self.spec, handler).await?;
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
}
