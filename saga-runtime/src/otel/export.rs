//! The OTLP/HTTP exporter [`otlp`] builds, wrapped so that lost spans are
//! seen: the SDK's batch processor drops a batch its exporter fails on and
//! its `shutdown` still answers `Ok`, so an application with no collector
//! would lose every span without a word.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::util::Unpoisoned;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanExporter};

/// A tracer provider that exports to an OTLP/HTTP collector (see [`otlp`])
/// and keeps count of the spans it could not deliver.
#[derive(Debug, Clone)]
pub struct Otlp {
    provider: SdkTracerProvider,
    report: Arc<Report>,
}

/// Why spans were not delivered, from [`Otlp::shutdown`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtlpError {
    /// Batches failed to export: the collector was unreachable or refused
    /// them.
    #[error(
        "{dropped} span(s) in {batches} batch(es) could not be exported to {endpoint} \
         (is an OTLP/HTTP collector listening there?); last error: {last_error}"
    )]
    Dropped {
        /// The collector's URL.
        endpoint: String,
        /// How many spans were lost.
        dropped: u64,
        /// In how many failed exports.
        batches: u64,
        /// What the last failed export said.
        last_error: String,
    },
    /// The provider's own shutdown failed (already shut down, or its last
    /// flush timed out).
    #[error("shutting the OTLP exporter down: {0}")]
    Shutdown(#[from] OTelSdkError),
}

/// Builds a tracer provider exporting spans as OTLP protobuf over HTTP to
/// `endpoint` (a collector's `/v1/traces`; plain `http://`), batched on a
/// background thread, with the resource's `service.name` set to
/// `service`. Give its [`tracer`](Otlp::tracer) to a
/// `tracing_opentelemetry` layer (see the module docs), and call
/// [`shutdown`](Otlp::shutdown) before the process exits so that the last
/// batch is sent and lost spans are reported.
pub fn otlp(endpoint: &str, service: &str) -> Result<Otlp, opentelemetry_otlp::ExporterBuildError> {
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(endpoint)
        .build()?;
    let report = Arc::new(Report {
        endpoint: endpoint.to_owned(),
        dropped: AtomicU64::new(0),
        batches: AtomicU64::new(0),
        last_error: Mutex::new(String::new()),
    });
    let exporter = Reporting {
        inner: exporter,
        report: report.clone(),
    };
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service.to_owned())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    Ok(Otlp { provider, report })
}

impl Otlp {
    /// A tracer for a `tracing_opentelemetry` layer.
    pub fn tracer(&self, name: impl Into<Cow<'static, str>>) -> SdkTracer {
        self.provider.tracer(name)
    }

    /// The SDK's provider, for what this type does not offer.
    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// How many spans could not be exported so far.
    pub fn spans_dropped(&self) -> u64 {
        self.report.dropped.load(Ordering::Relaxed)
    }

    /// Exports what is buffered now (blocking: call it from a blocking
    /// thread in async code); an error if this or an earlier export lost
    /// spans.
    pub fn force_flush(&self) -> Result<(), OtlpError> {
        self.provider.force_flush()?;
        self.report.check()
    }

    /// Sends the last batch and stops the exporter (blocking, at most
    /// 5 s): an error if any span was lost since the start, so that a
    /// deployment without a reachable collector does not pass for a traced
    /// one.
    pub fn shutdown(&self) -> Result<(), OtlpError> {
        self.shutdown_with_timeout(Duration::from_secs(5))
    }

    /// [`shutdown`](Self::shutdown) with another bound on the last flush.
    pub fn shutdown_with_timeout(&self, timeout: Duration) -> Result<(), OtlpError> {
        let stopped = self.provider.shutdown_with_timeout(timeout);
        self.report.check()?;
        Ok(stopped?)
    }
}

/// What the exporter could not deliver.
#[derive(Debug)]
struct Report {
    endpoint: String,
    dropped: AtomicU64,
    batches: AtomicU64,
    last_error: Mutex<String>,
}

impl Report {
    fn failed(&self, spans: usize, error: &OTelSdkError) {
        let spans = u64::try_from(spans).unwrap_or(u64::MAX);
        let dropped = self.dropped.fetch_add(spans, Ordering::Relaxed) + spans;
        let batches = self.batches.fetch_add(1, Ordering::Relaxed) + 1;
        *self.last_error.locked() = error.to_string();
        // Logged at the 1st, 2nd, 4th, 8th, ... failure: an outage of the
        // collector is seen at once without one line per batch.
        if batches.is_power_of_two() {
            tracing::warn!(
                endpoint = %self.endpoint,
                %error,
                dropped,
                batches,
                "spans could not be exported to the OTLP collector"
            );
        }
    }

    fn check(&self) -> Result<(), OtlpError> {
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped == 0 {
            return Ok(());
        }
        Err(OtlpError::Dropped {
            endpoint: self.endpoint.clone(),
            dropped,
            batches: self.batches.load(Ordering::Relaxed),
            last_error: self.last_error.locked().clone(),
        })
    }
}

/// The SDK's exporter, counting the spans of every batch it fails on.
#[derive(Debug)]
struct Reporting<E> {
    inner: E,
    report: Arc<Report>,
}

impl<E: SpanExporter> SpanExporter for Reporting<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let spans = batch.len();
        let report = self.report.clone();
        let exported = self.inner.export(batch);
        async move {
            let result = exported.await;
            if let Err(error) = &result {
                report.failed(spans, error);
            }
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}
