//! Feature `otel`: `saga_runtime::otel::otlp` ships a task's spans to an
//! OpenTelemetry collector over OTLP/HTTP. The collector here is a local
//! HTTP server that keeps what it receives.
//!
//! In its own binary: the tracing subscriber is global. (The second test
//! makes its spans with the tracer itself, without a subscriber.)

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderMap;
use common::ops_sagas::Fine;
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
    tokio::task::spawn_blocking(move || {
        provider.force_flush()?;
        provider.shutdown_with_timeout(Duration::from_secs(5))
    })
    .await
    .unwrap()
    .expect("every span was delivered");

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

/// With no collector listening, the spans are lost, and `shutdown` says
/// so (the SDK alone answers `Ok`) naming the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_that_reach_no_collector_are_reported_lost() {
    use saga_runtime::otel::opentelemetry::trace::{Span as _, Tracer as _};

    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}/v1/traces");
    let provider = saga_runtime::otel::otlp(&endpoint, "otlp-lost").unwrap();
    let tracer = provider.tracer("otlp-lost");
    for _ in 0..3 {
        tracer.start("lost").end();
    }
    let error = tokio::task::spawn_blocking(move || {
        let _ = provider.force_flush();
        let dropped = provider.spans_dropped();
        (dropped, provider.shutdown().unwrap_err())
    })
    .await
    .unwrap();
    assert_eq!(error.0, 3, "every span of the failed batch is counted");
    let text = error.1.to_string();
    assert!(text.contains("3 span(s)"), "{text}");
    assert!(text.contains(&endpoint), "{text}");
}
