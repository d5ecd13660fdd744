//! Feature `otel`: one trace per task across steps, retries and engines,
//! and process-manager messages continuing the trace of what sent them;
//! checked on the span tree an in-process exporter collects.
//!
//! One test in its own binary: the tracing subscriber is global, since
//! the engines' workers run on the runtime's threads.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::ops_sagas::Stuck;
use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry::Value as OtelValue;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use saga_runtime::backend::memory::MemoryBackend;
use saga_runtime::backend::Backend;
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};
use tracing_subscriber::layer::SubscriberExt;

/// Three steps; step one runs only on engine `a`, two and three only on
/// `b` (the other engine's attempt fails and is retried), so the task
/// hops between engines.
struct Hop {
    engine: &'static str,
}

impl Hop {
    fn work(&self, wanted: &str) -> Result<(), StepError> {
        let _span = tracing::info_span!("work", engine = self.engine).entered();
        match self.engine == wanted {
            true => Ok(()),
            false => Err(StepError::transient(format!("not on {}", self.engine))),
        }
    }
}

#[saga(name = "hop")]
impl Hop {
    #[saga_step(1)]
    #[retry_policy(max_retries = 50, backoff = constant, base_delay_ms = 1)]
    async fn one(&self, n: u32) -> Result<u32, StepError> {
        self.work("a").map(|()| n)
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 50, backoff = constant, base_delay_ms = 1)]
    async fn two(&self, n: u32) -> Result<u32, StepError> {
        self.work("b").map(|()| n)
    }

    #[saga_step(3)]
    #[retry_policy(max_retries = 50, backoff = constant, base_delay_ms = 1)]
    async fn three(&self, n: u32) -> Result<u32, StepError> {
        self.work("b").map(|()| n)
    }
}

#[derive(Message, Serialize, Deserialize)]
struct Ordered {
    order: u64,
}

#[derive(Message, Serialize, Deserialize)]
struct Packed {
    order: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Order {
    order: u64,
}

/// Handles `Ordered` and publishes `Packed`, which `Shipping` handles.
struct Packing;

#[process_manager(name = "packing", state = Order)]
impl Packing {
    #[starts]
    #[correlate(state.order = msg.order)]
    async fn ordered(
        &self,
        msg: Ordered,
        _state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.publish(Packed { order: msg.order });
        ctx.mark_complete();
        Ok(())
    }
}

struct Shipping;

#[process_manager(name = "shipping", state = Order)]
impl Shipping {
    #[starts]
    #[correlate(state.order = msg.order)]
    async fn packed(
        &self,
        _msg: Packed,
        _state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.mark_complete();
        Ok(())
    }
}

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a OtelValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn attr_is(span: &SpanData, key: &str, value: &str) -> bool {
    attr(span, key).is_some_and(|v| v.as_str() == value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_per_task_across_engines_and_messages() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("otel-test")));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let engine = |name: &'static str| {
        Engine::builder()
            .saga(Hop { engine: name })
            .saga(Stuck)
            .process_manager(Packing)
            .process_manager(Shipping)
            .backend_arc(backend.clone())
            .workers(1)
            .build()
    };
    let a = engine("a").await.unwrap();
    let b = engine("b").await.unwrap();

    // Started inside the caller's span: the task joins the caller's trace.
    let request = tracing::info_span!("request");
    let id = {
        let _entered = request.enter();
        a.start::<Hop>(1).await.unwrap()
    };
    let task = tokio::time::timeout(Duration::from_secs(30), a.wait(id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    let stuck = b.start::<Stuck>(1).await.unwrap();
    let stuck = a.wait(stuck).await.unwrap();
    assert_eq!(stuck.status, TaskStatus::CompensationFailed);

    let publisher = tracing::info_span!("publisher");
    {
        let _entered = publisher.enter();
        a.publish(Ordered { order: 7 }).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.process_instances::<Shipping>().await.unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "shipping never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop((request, publisher));
    a.shutdown().await;
    b.shutdown().await;
    let spans = exporter.get_finished_spans().unwrap();
    let named = |name: &'static str| spans.iter().filter(move |s| s.name == name);

    // The task: request -> saga_task_started -> every attempt.
    let request = named("request").next().expect("the caller's span");
    let trace = request.span_context.trace_id();
    assert_eq!(
        task.trace_id,
        trace.to_string(),
        "the task's trace is the caller's"
    );
    let started = named("saga_task_started")
        .find(|s| attr_is(s, "saga", "hop"))
        .expect("the start span");
    assert_eq!(started.span_context.trace_id(), trace);
    assert_eq!(started.parent_span_id, request.span_context.span_id());
    let attempts: Vec<&SpanData> = named("saga_step")
        .filter(|s| attr_is(s, "saga", "hop"))
        .collect();
    assert_eq!(
        attempts.len() as u32,
        task.steps.iter().map(|s| s.attempt_count).sum::<u32>(),
        "one span per attempt"
    );
    for attempt in &attempts {
        assert_eq!(attempt.span_context.trace_id(), trace);
        assert_eq!(attempt.parent_span_id, started.span_context.span_id());
    }
    // Each step's work ran on both engines or on its own, all in the trace.
    let work: Vec<&SpanData> = named("work")
        .filter(|w| w.span_context.trace_id() == trace)
        .collect();
    let engines_of = |step: &str| {
        let ids: Vec<SpanId> = attempts
            .iter()
            .filter(|s| attr_is(s, "step", step))
            .map(|s| s.span_context.span_id())
            .collect();
        let mut engines: Vec<String> = work
            .iter()
            .filter(|w| ids.contains(&w.parent_span_id))
            .map(|w| attr(w, "engine").unwrap().as_str().into_owned())
            .collect();
        engines.sort();
        engines.dedup();
        engines
    };
    let succeeded_on = |step: &str, engine: &str| {
        let last = attempts
            .iter()
            .filter(|s| attr_is(s, "step", step))
            .max_by_key(|s| s.start_time)
            .unwrap();
        work.iter().any(|w| {
            w.parent_span_id == last.span_context.span_id() && attr_is(w, "engine", engine)
        })
    };
    assert!(succeeded_on("one", "a") && succeeded_on("two", "b") && succeeded_on("three", "b"));
    let hopped = ["one", "two", "three"]
        .iter()
        .any(|step| engines_of(step).len() == 2);
    assert!(
        hopped || engines_of("one") != engines_of("two"),
        "the task ran on both engines"
    );

    // A failed compensation records the trace's id.
    let failed = &stuck.steps[0];
    let stuck_trace = named("saga_task_started")
        .find(|s| attr_is(s, "saga", "stuck"))
        .unwrap()
        .span_context
        .trace_id();
    assert_eq!(
        failed.trace_id.as_deref(),
        Some(stuck_trace.to_string().as_str())
    );
    assert!(named("saga_step")
        .filter(|s| attr_is(s, "saga", "stuck"))
        .all(|s| s.span_context.trace_id() == stuck_trace));

    // publisher -> packing's handling -> shipping's handling, one trace.
    let publisher = named("publisher").next().unwrap();
    let packing = named("process_message")
        .find(|s| attr_is(s, "process", "packing"))
        .expect("packing handled it");
    let shipping = named("process_message")
        .find(|s| attr_is(s, "process", "shipping"))
        .expect("shipping handled it");
    assert_eq!(
        packing.span_context.trace_id(),
        publisher.span_context.trace_id()
    );
    assert_eq!(packing.parent_span_id, publisher.span_context.span_id());
    assert_eq!(
        shipping.span_context.trace_id(),
        publisher.span_context.trace_id()
    );
    assert_eq!(shipping.parent_span_id, packing.span_context.span_id());
}
