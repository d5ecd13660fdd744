//! Endpoints, on every store: a consumer killed mid-handler leaves its
//! message to another process's consumer (not before the claim time) and
//! the settled endpoint is trimmed. The caps (a write past one refused
//! whole, a log of exactly its newest) are `tests/outbox.rs`'s, on memory
//! too.
//!
//! What only Redis has (a plain Redis client consuming the documented
//! stream, the loss of a consumer group, the blocking read after a
//! restart, consumers piling up in the group) is in
//! `tests/endpoint_redis.rs`; the outbox in `tests/outbox.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use saga_runtime::prelude::*;

use crate::common::endpoint_shop::{order, SendInvoice, Shop};
use crate::common::stores::ScenarioStore;
use crate::common::until;

/// An engine running `Shop` on the store, as another process would.
async fn shop<S: ScenarioStore>(store: &S, workers: usize) -> Engine {
    Engine::builder()
        .backend_arc(store.backend(Duration::from_secs(2)).await)
        .process_manager(Shop)
        .workers(workers)
        .build()
        .await
        .unwrap()
}

pub async fn a_consumer_killed_mid_handler_leaves_its_message_to_another_and_the_endpoint_is_trimmed<
    S: ScenarioStore,
>() {
    let store = S::start();
    let engine = shop(&store, 2).await;
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let doomed = engine
        .consumer("invoicing")
        .visibility_timeout(Duration::from_millis(600))
        .spawn(move |_| {
            s.fetch_add(1, Ordering::SeqCst);
            async { std::future::pending().await }
        });
    engine.publish(order(1)).await.unwrap();
    until("the first consumer took it", async || {
        started.load(Ordering::SeqCst) == 1
    })
    .await;
    doomed.abort(); // like SIGKILL: nothing settled, nothing touched again

    // Another process's consumer.
    let survivor = shop(&store, 0).await;
    let done = Arc::new(Mutex::new(Vec::new()));
    let d = done.clone();
    let took_over = Instant::now();
    survivor
        .consumer("invoicing")
        .visibility_timeout(Duration::from_millis(600))
        .spawn(move |m| {
            let d = d.clone();
            async move {
                let invoice: SendInvoice = m.decode()?;
                d.lock().unwrap().push((invoice.order, m.deliveries));
                Ok(())
            }
        });
    until("taken over", async || !done.lock().unwrap().is_empty()).await;
    println!("taken over after {:?}", took_over.elapsed());
    assert!(
        took_over.elapsed() >= Duration::from_millis(300),
        "not before the visibility timeout"
    );
    assert_eq!(*done.lock().unwrap(), [("o-1".to_owned(), 2)]);
    for n in 2..5 {
        engine.publish(order(n)).await.unwrap();
    }
    until("all handled", async || done.lock().unwrap().len() == 4).await;
    let endpoints = store.backend(Duration::from_secs(2)).await.processes();
    let endpoints = endpoints.expect("a process-manager store");
    until("trimmed", async || {
        endpoints
            .endpoint_messages("invoicing")
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    survivor.shutdown().await;
    engine.shutdown().await;
}
