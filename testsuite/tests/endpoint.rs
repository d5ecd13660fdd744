//! Endpoint consumers on the in-memory backend: acknowledged once and
//! trimmed, retried with backoff (exactly, on a paused clock), dead-lettered
//! on a permanent error, garbage, or after the delivery cap, and a hung
//! handler keeps its message from other consumers.

mod common;

use common::until;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use saga_runtime::backend::memory::MemoryBackend;
use saga_runtime::backend::{Backend, ProcessCommit, Settle};
use saga_runtime::endpoint::EndpointMessage;
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

#[derive(Message, Serialize, Deserialize)]
struct OrderPlaced {
    #[correlation_id]
    order: String,
    amount: u32,
}

#[derive(Debug, Clone, PartialEq, Message, Serialize, Deserialize)]
struct SendInvoice {
    #[correlation_id]
    order: String,
    amount: u32,
}

#[derive(Default, Serialize, Deserialize)]
struct Placed {
    amount: u32,
}

struct Shop;

#[process_manager(name = "shop", state = Placed)]
impl Shop {
    #[starts]
    async fn placed(
        &self,
        msg: OrderPlaced,
        state: &mut Placed,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.amount = msg.amount;
        ctx.send(
            "invoicing",
            SendInvoice {
                order: msg.order,
                amount: msg.amount,
            },
        );
        Ok(())
    }
}

async fn engine(backend: Arc<dyn Backend>, workers: usize) -> Engine {
    Engine::builder()
        .backend_arc(backend)
        .process_manager(Shop)
        .workers(workers)
        .build()
        .await
        .unwrap()
}

/// Writes `raw` to the endpoint `invoicing` as a process manager's commit
/// would.
async fn send_raw(backend: &Arc<dyn Backend>, raw: &str) {
    let commit = ProcessCommit {
        endpoints: vec![("invoicing".into(), raw.into())],
        ..ProcessCommit::new(None, Settle::Nothing)
    };
    let store = backend.clone().processes().expect("a process store");
    store
        .process_commit("shop", commit)
        .await
        .unwrap()
        .expect("written");
}

fn invoice(order: &str) -> String {
    EndpointMessage {
        v: 1,
        message_id: format!("m-{order}"),
        message_type: "SendInvoice".into(),
        from: "shop".into(),
        correlation_id: Some(order.into()),
        headers: Default::default(),
        sent_at: 0,
        payload: serde_json::json!({"order": order, "amount": 1}),
        deliveries: 0,
    }
    .encode()
}

async fn dead_letters(backend: &Arc<dyn Backend>) -> Vec<String> {
    let store = backend.clone().processes().expect("a process store");
    store
        .endpoint_dead_letters("invoicing")
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.reason)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_messages_reach_the_consumer_once_in_the_documented_envelope_and_are_trimmed() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let engine = engine(backend.clone(), 2).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    engine
        .consumer("invoicing")
        .group("billing")
        .spawn(move |m| {
            let sink = sink.clone();
            async move {
                let invoice: SendInvoice = m.decode()?;
                sink.lock().unwrap().push((m, invoice));
                Ok(())
            }
        });
    for n in 0..3 {
        engine
            .publish(OrderPlaced {
                order: format!("o-{n}"),
                amount: 10 * n,
            })
            .await
            .unwrap();
    }
    until("three invoices", async || seen.lock().unwrap().len() == 3).await;
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by(|a, b| a.1.order.cmp(&b.1.order));
    let (envelope, invoice) = &seen[1];
    assert_eq!(
        invoice,
        &SendInvoice {
            order: "o-1".into(),
            amount: 10
        }
    );
    assert_eq!(envelope.v, 1);
    assert_eq!(envelope.from, "shop");
    assert_eq!(envelope.message_type, "SendInvoice");
    assert_eq!(envelope.correlation_id.as_deref(), Some("o-1"));
    assert_eq!(envelope.headers["instance"], "o-1");
    assert_eq!(envelope.deliveries, 1);
    assert!(envelope.sent_at > 0);
    until("trimmed once consumed", async || {
        backend
            .clone()
            .processes()
            .unwrap()
            .endpoint_messages("invoicing")
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    assert!(dead_letters(&backend).await.is_empty());
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn transient_failures_retry_on_the_backoff_schedule_then_dead_letter() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let engine = engine(backend.clone(), 0).await;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let log = calls.clone();
    let start = Instant::now();
    engine.consumer("invoicing").spawn(move |_| {
        log.lock().unwrap().push(start.elapsed());
        async { Err(StepError::transient("the ledger is down")) }
    });
    send_raw(&backend, &invoice("a")).await;
    until("dead-lettered", async || {
        !dead_letters(&backend).await.is_empty()
    })
    .await;
    let calls = calls.lock().unwrap().clone();
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(
        gaps,
        [200, 400, 800].map(Duration::from_millis),
        "3 retries, exponential from 200 ms"
    );
    assert_eq!(
        dead_letters(&backend).await,
        ["failed 4 times; last: the ledger is down"]
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn permanent_errors_and_garbage_are_dead_lettered_at_once() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let engine = engine(backend.clone(), 0).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let count = calls.clone();
    engine.consumer("invoicing").spawn(move |m| {
        count.fetch_add(1, Ordering::SeqCst);
        async move {
            let _: OrderPlaced = m.decode()?;
            Ok(())
        }
    });
    send_raw(&backend, &invoice("a")).await;
    send_raw(&backend, "{not json").await;
    send_raw(
        &backend,
        r#"{"v": 9, "message_id": "x", "message_type": "T", "from": "f", "payload": 1}"#,
    )
    .await;
    until("three dead letters", async || {
        dead_letters(&backend).await.len() == 3
    })
    .await;
    let reasons = dead_letters(&backend).await;
    assert!(
        reasons[0].starts_with("permanent error: `SendInvoice` is not a `OrderPlaced`"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].starts_with("malformed message: not an envelope"),
        "{reasons:?}"
    );
    assert!(reasons[2].contains("envelope version 9"), "{reasons:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "garbage never reaches the handler"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_message_that_keeps_killing_its_consumer_is_dead_lettered_after_the_cap() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    send_raw(&backend, &invoice("poison")).await;
    // Five consumers take it and die before settling it.
    let visibility = Duration::from_secs(1);
    for n in 0..5 {
        let taken = backend
            .clone()
            .processes()
            .unwrap()
            .endpoint_receive(
                "invoicing",
                "consumers",
                &format!("dies-{n}"),
                visibility,
                Duration::ZERO,
            )
            .await
            .unwrap()
            .expect("the message comes back");
        assert_eq!(taken.deliveries, n + 1);
        tokio::time::sleep(visibility).await;
    }
    let engine = engine(backend.clone(), 0).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let count = calls.clone();
    engine
        .consumer("invoicing")
        .visibility_timeout(visibility)
        .spawn(move |_| {
            count.fetch_add(1, Ordering::SeqCst);
            async { Ok(()) }
        });
    until("dead-lettered", async || {
        !dead_letters(&backend).await.is_empty()
    })
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert!(dead_letters(&backend).await[0].starts_with("delivered 6 times without being settled"));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_handler_is_timed_out_and_keeps_its_message_meanwhile() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let engine = engine(backend.clone(), 0).await;
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (r, m) = (running.clone(), most.clone());
    engine
        .consumer("invoicing")
        .concurrency(2)
        .visibility_timeout(Duration::from_secs(1))
        .handler_timeout(Duration::from_secs(5))
        .retry(saga_runtime::policy::RetryPolicy::new(
            1,
            saga_runtime::policy::BackoffKind::Constant,
            2_000,
        ))
        .spawn(move |_| {
            let (r, m) = (r.clone(), m.clone());
            async move {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now, Ordering::SeqCst);
                // Never returns (dropped at the timeout).
                struct Done(Arc<AtomicUsize>);
                impl Drop for Done {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                let _done = Done(r);
                std::future::pending::<()>().await;
                Ok(())
            }
        });
    send_raw(&backend, &invoice("slow")).await;
    let start = Instant::now();
    until("dead-lettered", async || {
        !dead_letters(&backend).await.is_empty()
    })
    .await;
    assert_eq!(
        start.elapsed().as_secs(),
        12,
        "two 5 s attempts and a 2 s pause, nothing sooner"
    );
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "the other consumer never took it over"
    );
    assert_eq!(
        dead_letters(&backend).await,
        ["failed 2 times; last: handler timed out after 5s"]
    );
    engine.shutdown().await;
}

#[tokio::test]
async fn a_name_that_could_alias_keys_is_refused_at_once() {
    let engine = engine(Arc::new(MemoryBackend::new()), 0).await;
    let bad_endpoint = engine
        .consumer("invoicing:eu")
        .run(|_| async { Ok(()) })
        .await
        .unwrap_err();
    assert!(
        bad_endpoint
            .to_string()
            .contains("endpoint name `invoicing:eu` must be"),
        "{bad_endpoint}"
    );
    let bad_group = engine
        .consumer("invoicing")
        .group("")
        .run(|_| async { Ok(()) })
        .await
        .unwrap_err();
    assert!(
        bad_group.to_string().contains("consumer group `` must be"),
        "{bad_group}"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_a_running_handler_finish_within_the_grace_then_leaves_its_message() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let engine = Engine::builder()
        .backend_arc(backend.clone())
        .shutdown_grace(Duration::from_secs(10))
        .workers(0)
        .build()
        .await
        .unwrap();
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    engine
        .consumer("invoicing")
        .handler_timeout(Duration::from_secs(60))
        .visibility_timeout(Duration::from_secs(3))
        .spawn(move |_| {
            s.fetch_add(1, Ordering::SeqCst);
            std::future::pending()
        });
    send_raw(&backend, &invoice("slow")).await;
    until("started", async || started.load(Ordering::SeqCst) == 1).await;
    let stopping = Instant::now();
    engine.shutdown().await;
    assert_eq!(
        stopping.elapsed(),
        Duration::from_secs(10),
        "the grace, then no longer"
    );

    // Unsettled: another consumer takes it once it is no longer touched.
    let taken = backend
        .clone()
        .processes()
        .unwrap()
        .endpoint_receive(
            "invoicing",
            "consumers",
            "next",
            Duration::from_secs(3),
            Duration::from_secs(10),
        )
        .await
        .unwrap()
        .expect("the message comes back");
    assert_eq!(taken.deliveries, 2);
    assert!(dead_letters(&backend).await.is_empty());
}
