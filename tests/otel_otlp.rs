//! Feature `otel`: `saga_runtime::otel::otlp` ships a task's spans to an
//! OpenTelemetry collector over OTLP/HTTP. The collector here is a local
//! HTTP server that keeps what it receives.
//!
//! One test in its own binary: the tracing subscriber is global.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderMap;
use common::ops_sagas::Fine;
use opentelemetry::trace::TracerProvider as _;
use saga_runtime::prelude::*;
use tracing_subscriber::layer::SubscriberExt;

/// What the collector received: (content type, body) per request.
type Received = Arc<Mutex<Vec<(String, Bytes)>>>;

async fn collector() -> (String, Received) {
    let received = Received::default();
    let keep = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let keep = keep.clone();
            async move {
                let kind = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                keep.lock().unwrap().push((kind, body));
                // An empty ExportTraceServiceResponse.
                ([("content-type", "application/x-protobuf")], Bytes::new())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (endpoint, received)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_spans_reach_the_collector() {
    let (endpoint, received) = collector().await;
    let provider = saga_runtime::otel::otlp(&endpoint, "otlp-test").unwrap();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("otlp-test"));
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();

    let engine = Engine::builder().saga(Fine).build().await.unwrap();
    let id = engine.start::<Fine>(1).await.unwrap();
    let task = engine.wait(id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    engine.shutdown().await;
    let flushed = tokio::task::spawn_blocking(move || {
        let flushed = provider.force_flush();
        let _ = provider.shutdown_with_timeout(Duration::from_secs(5));
        flushed
    })
    .await
    .unwrap();
    flushed.unwrap();

    let received = received.lock().unwrap();
    assert!(!received.is_empty(), "nothing was exported");
    let body: Vec<u8> = received
        .iter()
        .inspect(|(kind, _)| assert_eq!(kind, "application/x-protobuf"))
        .flat_map(|(_, body)| body.to_vec())
        .collect();
    assert!(contains(&body, b"otlp-test"), "the service name");
    assert!(contains(&body, b"saga_task_started"));
    assert!(contains(&body, b"saga_step"));
    assert!(
        contains(&body, &hex(&task.trace_id)),
        "the spans carry the task's trace id"
    );
}
