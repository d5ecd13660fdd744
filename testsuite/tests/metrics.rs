//! The Prometheus metrics (feature `metrics`) on the in-memory backend: a
//! step that fails once and is retried, a task that compensates, a circuit
//! breaker that opens, dead letters, a process manager with a timeout and
//! an unmatched message, the queue gauges, and the `GET /metrics` route.
//!
//! One test in its own binary: the recorder is the process's global one
//! (the engine's workers run on tokio's threads, which a thread-local
//! recorder would not see), so nothing else may record beside it.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::prometheus::sample;
use saga_runtime::backend::memory::MemoryBackend;
use saga_runtime::backend::WorkQueue;
use saga_runtime::metrics::PrometheusHandle;
use saga_runtime::prelude::*;
use saga_runtime::{DeadLetterFilter, Intervention};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `reserve` fails once (for input 1), then succeeds; `charge` declines 13
/// for good, so that task compensates `reserve`.
#[derive(Default)]
struct Orders {
    failed_once: AtomicBool,
}

#[saga(name = "metrics-orders")]
impl Orders {
    #[saga_step(1)]
    #[retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 10)]
    async fn reserve(&self, n: u32) -> Result<u32, StepError> {
        if n == 1 && !self.failed_once.swap(true, Ordering::SeqCst) {
            return Err(StepError::transient("busy"));
        }
        Ok(n)
    }

    #[compensate(reserve)]
    async fn release(&self, _n: u32) -> Result<(), StepError> {
        Ok(())
    }

    #[saga_step(2)]
    async fn charge(&self, n: u32) -> Result<u32, StepError> {
        if n == 13 {
            return Err(StepError::permanent("declined"));
        }
        Ok(n)
    }
}

/// Always down: its breaker opens at the first failure, and the task
/// after that is refused without a call. Both are dead-lettered.
struct Down;

#[saga(name = "metrics-breaker")]
impl Down {
    #[saga_step(1)]
    #[retry_policy(max_retries = 0, backoff = constant, base_delay_ms = 0, on_exhausted = dead_letter)]
    #[circuit_breaker(failure_threshold = 1, duration_secs = 600)]
    async fn call(&self, _n: u32) -> Result<u32, StepError> {
        Err(StepError::transient("connection refused"))
    }
}

#[derive(Message, Serialize, Deserialize)]
struct Opened {
    #[correlation_id]
    door: String,
}

#[derive(Message, Serialize, Deserialize)]
struct Knocked {
    #[correlation_id]
    door: String,
}

#[derive(Message, Serialize, Deserialize)]
struct CloseAgain;

#[derive(Default, Serialize, Deserialize)]
struct Door {
    open: bool,
}

struct Doors;

#[process_manager(name = "metrics-doors", state = Door)]
impl Doors {
    #[starts]
    async fn opened(
        &self,
        _msg: Opened,
        state: &mut Door,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.open = true;
        ctx.request_timeout(Duration::from_millis(20), CloseAgain);
        Ok(())
    }

    #[handles]
    async fn knocked(
        &self,
        _msg: Knocked,
        _state: &mut Door,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        Ok(())
    }

    #[timeout]
    async fn close_again(
        &self,
        _t: CloseAgain,
        state: &mut Door,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.open = false;
        ctx.mark_complete();
        Ok(())
    }
}

/// Renders until `check` passes (the workers record an outcome just after
/// committing it, so right after `wait` it may not be there yet).
async fn eventually(handle: &PrometheusHandle, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = handle.render();
        if check(&text) {
            return text;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("{what}; the metrics are:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET path` over a real socket: (status, the headers, the body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_records_prometheus_metrics_and_serves_them() {
    let handle = saga_runtime::metrics::install().unwrap();
    saga_runtime::metrics::install().expect("installing again hands back the same recorder");

    let memory = MemoryBackend::new();
    let engine = Engine::builder()
        .backend(memory.clone())
        .saga(Orders::default())
        .saga(Down)
        .process_manager(Doors)
        // The unmatched message is neither held nor parked.
        .hold_unmatched(Duration::ZERO)
        .dead_letter_unmatched(false)
        .housekeeping_interval(Duration::from_millis(50))
        .build()
        .await
        .unwrap();

    // A step retried once, and a task that compensates.
    let retried = engine.start::<Orders>(1).await.unwrap();
    let compensated = engine.start::<Orders>(13).await.unwrap();
    assert_eq!(
        engine.wait(retried).await.unwrap().status,
        TaskStatus::Completed
    );
    assert_eq!(
        engine.wait(compensated).await.unwrap().status,
        TaskStatus::Compensated
    );
    // A breaker that opens; the next task is refused without a call.
    let mut parked = Vec::new();
    for _ in 0..2 {
        let id = engine.start::<Down>(0).await.unwrap();
        assert_eq!(
            engine.wait(id).await.unwrap().status,
            TaskStatus::DeadLettered
        );
        parked.push(id);
    }
    // An entry that decodes as nothing.
    memory.enqueue_raw(b"garbage").await.unwrap();
    // A process manager: a starting message, its timeout, and a
    // continuing message that matches no instance.
    engine
        .publish(Opened {
            door: "front".into(),
        })
        .await
        .unwrap();
    engine
        .publish(Knocked {
            door: "back".into(),
        })
        .await
        .unwrap();

    let orders = |step| [("saga", "metrics-orders"), ("step", step)];
    let text = eventually(&handle, "every outcome is recorded", |text| {
        let finished = |saga, status| {
            sample(
                text,
                "saga_tasks_finished_total",
                &[("saga", saga), ("status", status)],
            )
        };
        let process = |outcome| {
            sample(
                text,
                "saga_process_messages_total",
                &[("process", "metrics-doors"), ("outcome", outcome)],
            )
        };
        finished("metrics-orders", "completed") == Some(1.0)
            && finished("metrics-orders", "compensated") == Some(1.0)
            && finished("metrics-breaker", "dead_lettered") == Some(2.0)
            && process("handled") == Some(2.0)
            && process("unmatched") == Some(1.0)
            && sample(text, "saga_dead_letters_total", &[("kind", "undecodable")]).is_some()
    })
    .await;

    let value = |name, labels: &[(&str, &str)]| sample(&text, name, labels);
    // Step 1: three attempts (one retry) over two tasks.
    assert_eq!(
        value("saga_steps_started_total", &orders("reserve")),
        Some(3.0)
    );
    assert_eq!(
        value("saga_step_retries_total", &orders("reserve")),
        Some(1.0)
    );
    assert_eq!(
        value("saga_steps_succeeded_total", &orders("reserve")),
        Some(2.0)
    );
    let failed = |step, kind| {
        value(
            "saga_steps_failed_total",
            &[("saga", "metrics-orders"), ("step", step), ("kind", kind)],
        )
    };
    assert_eq!(failed("reserve", "transient"), Some(1.0));
    assert_eq!(failed("reserve", "permanent"), None);
    // Step 2: once per task, declined once for good.
    assert_eq!(
        value("saga_steps_started_total", &orders("charge")),
        Some(2.0)
    );
    assert_eq!(value("saga_step_retries_total", &orders("charge")), None);
    assert_eq!(
        value("saga_steps_succeeded_total", &orders("charge")),
        Some(1.0)
    );
    assert_eq!(failed("charge", "permanent"), Some(1.0));
    // Every attempt is timed, in buckets.
    let duration_count = |step| value("saga_step_duration_seconds_count", &orders(step));
    assert_eq!(duration_count("reserve"), Some(3.0));
    assert_eq!(duration_count("charge"), Some(2.0));
    assert!(text.contains("# TYPE saga_step_duration_seconds histogram"));
    assert_eq!(
        value(
            "saga_step_duration_seconds_bucket",
            &[
                ("saga", "metrics-orders"),
                ("step", "reserve"),
                ("le", "+Inf")
            ]
        ),
        Some(3.0)
    );
    // The compensated task undid `reserve`, once, successfully.
    assert_eq!(
        value("saga_compensations_total", &orders("reserve")),
        Some(1.0)
    );
    assert_eq!(
        value("saga_compensation_failures_total", &orders("reserve")),
        None
    );

    // The breaker: one call, one transition to open, two dead letters.
    let down = [("saga", "metrics-breaker"), ("step", "call")];
    assert_eq!(value("saga_steps_started_total", &down), Some(1.0));
    assert_eq!(
        value(
            "saga_circuit_breaker_transitions_total",
            &[
                ("saga", "metrics-breaker"),
                ("step", "call"),
                ("to", "open")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        value("saga_dead_letters_total", &[("kind", "saga")]),
        Some(2.0)
    );
    assert_eq!(
        value("saga_dead_letters_total", &[("kind", "undecodable")]),
        Some(1.0)
    );

    // The process manager: as `process_metrics` counts it.
    let counts = engine.process_metrics();
    assert_eq!(counts.handled.load(Ordering::Relaxed), 2);
    assert_eq!(counts.unmatched.load(Ordering::Relaxed), 1);
    assert_eq!(
        value(
            "saga_process_timeouts_fired_total",
            &[("process", "metrics-doors")]
        ),
        Some(1.0)
    );
    // ... measured against when it was due.
    assert_eq!(
        value(
            "saga_process_timeout_lateness_seconds_count",
            &[("process", "metrics-doors")]
        ),
        Some(1.0)
    );
    assert!(text.contains("# TYPE saga_process_timeout_lateness_seconds histogram"));
    assert_eq!(
        value(
            "saga_process_conflicts_total",
            &[("process", "metrics-doors")]
        ),
        None
    );
    assert!(text.contains("# HELP saga_steps_started_total Step attempts started"));

    // The queue gauges, once everything is settled.
    eventually(&handle, "the queue gauges read an empty queue", |text| {
        ["saga", "process"].iter().all(|queue| {
            sample(text, "saga_queue_depth", &[("queue", queue)]) == Some(0.0)
                && sample(
                    text,
                    "saga_queue_oldest_pending_age_seconds",
                    &[("queue", queue)],
                ) == Some(0.0)
        })
    })
    .await;

    // The route.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = saga_runtime::metrics::route(handle.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let (status, head, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert_eq!(
        sample(&body, "saga_steps_started_total", &orders("reserve")),
        Some(3.0),
        "{body}"
    );
    assert_eq!(get(addr, "/other").await.0, 404);

    // Starts: each created task once; an idempotent start that finds its
    // task is no new task.
    for _ in 0..2 {
        engine.start_with_key::<Orders>("once", 2).await.unwrap();
    }
    let started = |saga| {
        sample(
            &handle.render(),
            "saga_tasks_started_total",
            &[("saga", saga)],
        )
    };
    assert_eq!(started("metrics-orders"), Some(3.0));
    assert_eq!(started("metrics-breaker"), Some(2.0));

    // Tasks waiting for an operator, sampled on the housekeeping beat; an
    // operator's settlement counts as `resolved` and lowers the gauge, a
    // requeue counts as reopened (and its task parks again: the breaker is
    // still open).
    let awaiting = |text: &str, saga, status| {
        sample(
            text,
            "saga_tasks_awaiting_operator",
            &[("saga", saga), ("status", status)],
        )
    };
    eventually(&handle, "two dead-lettered tasks wait", |text| {
        awaiting(text, "metrics-breaker", "dead_lettered") == Some(2.0)
            && awaiting(text, "metrics-orders", "compensation_failed") == Some(0.0)
    })
    .await;
    engine
        .resolve(parked[0], Intervention::new("ana", "refunded"))
        .await
        .unwrap();
    let letter = engine
        .dead_letters(DeadLetterFilter::new())
        .await
        .unwrap()
        .letters
        .into_iter()
        .find(|l| l.task_id == Some(parked[1]))
        .expect("the second task's dead letter");
    engine
        .requeue_by(&letter.id, Intervention::new("ana", "try again"))
        .await
        .unwrap();
    let text = eventually(&handle, "the resolve and the requeue are counted", |text| {
        let finished = |status| {
            sample(
                text,
                "saga_tasks_finished_total",
                &[("saga", "metrics-breaker"), ("status", status)],
            )
        };
        finished("resolved") == Some(1.0)
            && finished("dead_lettered") == Some(3.0)
            && awaiting(text, "metrics-breaker", "dead_lettered") == Some(1.0)
    })
    .await;
    assert_eq!(
        sample(
            &text,
            "saga_tasks_reopened_total",
            &[("saga", "metrics-breaker"), ("action", "requeued")]
        ),
        Some(1.0)
    );

    engine.shutdown().await;
}
