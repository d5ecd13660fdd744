//! Trace context carried with tasks and messages, so that one task is one
//! trace however many steps, retries and processes it takes, and a
//! process manager's handling continues the trace of the message that
//! caused it.
//!
//! With the feature `otel` and a `tracing-opentelemetry` layer installed,
//! starting a task opens a `saga_task_started` span (a child of the
//! caller's span, if any); its trace id becomes the task's
//! [`trace_id`](crate::TaskInstance::trace_id) and its W3C `traceparent`
//! is stored with the task. Every attempt's `saga_step` span, on any
//! engine, is made its child. A task started without a trace context (by
//! a process without the layer) still gets one trace: its attempts are
//! children of a parent derived from its trace id. Messages published to
//! process managers carry the publisher's `traceparent`, and the
//! `process_message` span that handles them continues it; what a handler
//! publishes or schedules carries the handler's.
//!
//! Without the feature every function here does nothing, and trace ids
//! are random ids that still correlate log lines.
//!
//! `otlp` (feature `otel`) builds a tracer provider that ships the spans
//! to an OpenTelemetry collector over OTLP/HTTP, for applications that have
//! no exporter set up yet (the guide shows it wired into a subscriber).
//! It counts what it could not export: `Otlp::shutdown` fails when spans
//! were lost, and the first failures are logged. The OpenTelemetry crates
//! it is built with are re-exported here, so that the layer and the tracer
//! come from one version.

use crate::model::task::TaskInstance;

/// The OpenTelemetry crates this one is built with (feature `otel`), so
/// that your `tracing_opentelemetry::layer()` and the tracer [`otlp`]
/// returns come from the same versions: two versions of `opentelemetry` in
/// one build compile, and their spans silently go nowhere.
#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub use {opentelemetry, opentelemetry_sdk, tracing_opentelemetry};

#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub use export::{otlp, Otlp, OtlpError};

#[cfg(feature = "otel")]
mod export;

/// The `traceparent` of the current span, when it has a valid
/// OpenTelemetry context.
pub(crate) fn current() -> Option<String> {
    imp::traceparent(&tracing::Span::current())
}

/// Opens the task's trace: see the module docs.
pub(crate) fn begin_task(task: &mut TaskInstance) {
    let span = tracing::info_span!(
        "saga_task_started",
        task_id = %task.id,
        saga = %task.saga,
    );
    if let Some(parent) = imp::traceparent(&span) {
        if let Some(trace_id) = parent.split('-').nth(1) {
            task.trace_id = trace_id.to_owned();
        }
        task.traceparent = Some(parent);
    }
}

/// Makes `span` (not yet entered) a child of `parent`, a `traceparent`;
/// without one, of a parent derived from `trace_id` so that it still
/// lands in the task's trace.
pub(crate) fn continue_trace(span: &tracing::Span, parent: Option<&str>, trace_id: Option<&str>) {
    imp::continue_trace(span, parent, trace_id)
}

#[cfg(feature = "otel")]
mod imp {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::Context;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    pub(super) fn traceparent(span: &tracing::Span) -> Option<String> {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        sc.is_valid().then(|| {
            format!(
                "00-{}-{}-{:02x}",
                sc.trace_id(),
                sc.span_id(),
                sc.trace_flags().to_u8()
            )
        })
    }

    pub(super) fn continue_trace(
        span: &tracing::Span,
        parent: Option<&str>,
        trace_id: Option<&str>,
    ) {
        // A span no subscriber records has no context to set: skip the
        // parsing (most of a step's tracing cost when tracing is off).
        if span.is_disabled() {
            return;
        }
        let remote = parent
            .and_then(parse)
            .or_else(|| trace_id.and_then(derived));
        if let Some(remote) = remote {
            let _ = span.set_parent(Context::new().with_remote_span_context(remote));
        }
    }

    /// `00-<trace id>-<span id>-<flags>`.
    fn parse(traceparent: &str) -> Option<SpanContext> {
        let mut parts = traceparent.split('-');
        let (_version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let flags = u8::from_str_radix(flags, 16).ok()?;
        context(trace, span, TraceFlags::new(flags))
    }

    /// A parent in the trace `trace_id` (32 hex digits), for a task that
    /// was started without a trace context.
    fn derived(trace_id: &str) -> Option<SpanContext> {
        context(trace_id, trace_id.get(..16)?, TraceFlags::SAMPLED)
    }

    fn context(trace: &str, span: &str, flags: TraceFlags) -> Option<SpanContext> {
        let sc = SpanContext::new(
            TraceId::from_hex(trace).ok()?,
            SpanId::from_hex(span).ok()?,
            flags,
            true,
            TraceState::default(),
        );
        sc.is_valid().then_some(sc)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn traceparents_parse_and_bad_ones_do_not() {
            let sc = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
            assert_eq!(
                sc.trace_id().to_string(),
                "4bf92f3577b34da6a3ce929d0e0e4736"
            );
            assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
            assert!(sc.is_sampled() && sc.is_remote());
            assert!(parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
            assert!(parse("garbage").is_none());
            let derived = derived("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
            assert_eq!(derived.span_id().to_string(), "4bf92f3577b34da6");
        }
    }
}

#[cfg(not(feature = "otel"))]
mod imp {
    pub(super) fn traceparent(_: &tracing::Span) -> Option<String> {
        None
    }

    pub(super) fn continue_trace(_: &tracing::Span, _: Option<&str>, _: Option<&str>) {}
}
