//! Process managers on a private PostgreSQL (a server per test): a real
//! process manager that correlates a message by a state field, times out,
//! counts a tally and feeds an endpoint consumer; a tally checked by many
//! checkers at once; an endpoint consumer that dies mid-handler; an
//! endpoint's cap; and a timer poller that leaves an idle database alone.
//! The process-manager scenarios every store passes (contention from two
//! engines, racing starters, a deleted instance's late duplicates and
//! stale timeouts, unreadable records, restarts) are in
//! `tests/engine_process.rs`.
//!
//! Beside the engines' own timer poller (its lease is proven in
//! tests/coordination_postgres.rs), the tests move due timeouts
//! themselves ([`drive_timers`]), as a racing poller would.
//! Moving each due timeout once however many pollers race is the store's
//! part, and is what this exercises.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::postgres_server::TestPostgres;
use common::until;
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::{Endpoints, InstanceStatus, ProcessCommit, ProcessStore, Settle};
use saga_runtime::engine::Checked;
use saga_runtime::prelude::*;
use saga_runtime::process::{Envelope, EnvelopeKind};
use saga_runtime::task::Timestamp;
use sagas_tests::batch::{Batch, BatchStarted, Batches};
use serde::{Deserialize, Serialize};

/// A backend on `pg` in schema `schema`.
async fn backend(pg: &TestPostgres, schema: &str) -> PostgresBackend {
    let config = PostgresConfig {
        schema: schema.into(),
        visibility_timeout: Duration::from_secs(2),
        poll_interval: Duration::from_millis(50),
        ..PostgresConfig::default()
    };
    PostgresBackend::connect_url(&pg.url(), config)
        .await
        .expect("connect to the test server")
}

/// Moves due timeouts every 20 ms, as the engine's timer poller would with
/// the `timers` lease; stops when the returned handle is dropped.
fn drive_timers(backend: PostgresBackend) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let _ = backend.process_release_due(Timestamp::now().0, 256).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

// ---------------------------------------------------------------------------
// An order: placed (starts it, by its id), paid (correlated by the
// customer, a state field), picked (a tally of its items), reminded (a
// timeout); it sends an invoice to the `invoicing` endpoint.

#[derive(Message, Serialize, Deserialize)]
struct OrderPlaced {
    #[correlation_id]
    order: String,
    customer: String,
    items: u32,
    remind_after_ms: u64,
}

#[derive(Message, Serialize, Deserialize)]
struct PaymentReceived {
    customer: String,
    amount: u32,
}

#[derive(Debug, Message, Serialize, Deserialize)]
struct SendInvoice {
    #[correlation_id]
    order: String,
    items: u32,
}

#[derive(Message, Serialize, Deserialize)]
struct Remind;

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Order {
    customer: String,
    paid: u32,
    picking: Option<TallyRef>,
    picked: u32,
    reminded: u32,
}

struct Fulfilment;

#[process_manager(name = "fulfilment", state = Order)]
impl Fulfilment {
    #[starts]
    async fn placed(
        &self,
        msg: OrderPlaced,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.customer = msg.customer;
        let items = (0..msg.items).map(|i| i.to_string());
        state.picking = Some(ctx.open_tally("picking", items).reference());
        ctx.request_timeout(Duration::from_millis(msg.remind_after_ms), Remind);
        ctx.send(
            "invoicing",
            SendInvoice {
                order: msg.order,
                items: msg.items,
            },
        );
        Ok(())
    }

    #[handles]
    #[correlate(state.customer = msg.customer)]
    async fn paid(
        &self,
        msg: PaymentReceived,
        state: &mut Order,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.paid += msg.amount;
        Ok(())
    }

    #[handles]
    async fn picked(
        &self,
        _msg: TallyCompleted,
        state: &mut Order,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.picked += 1;
        Ok(())
    }

    #[timeout]
    async fn remind(
        &self,
        _t: Remind,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.reminded += 1;
        if state.picked > 0 && state.paid > 0 {
            ctx.mark_complete();
        }
        Ok(())
    }
}

async fn order(engine: &Engine, id: &str) -> Option<Order> {
    engine.process_state::<Fulfilment>(id).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_is_correlated_timed_out_tallied_and_invoiced() {
    let pg = TestPostgres::start();
    let backend = backend(&pg, "saga").await;
    let _timers = drive_timers(backend.clone());
    let engine = Engine::builder()
        .backend(backend.clone())
        .process_manager(Fulfilment)
        .workers(2)
        .build()
        .await
        .unwrap();
    let invoices = Arc::new(Mutex::new(Vec::new()));
    let seen = invoices.clone();
    engine
        .consumer("invoicing")
        .group("billing")
        .spawn(move |m| {
            let seen = seen.clone();
            async move {
                let invoice: SendInvoice = m.decode()?;
                seen.lock().unwrap().push((invoice.order, invoice.items));
                Ok(())
            }
        });

    let placed = Instant::now();
    engine
        .publish(OrderPlaced {
            order: "o-1".into(),
            customer: "ada".into(),
            items: 3,
            remind_after_ms: 2_500,
        })
        .await
        .unwrap();
    until("the order", async || order(&engine, "o-1").await.is_some()).await;
    let scheduled = engine.process_timeouts("fulfilment", Some("o-1"), 10).await;
    assert_eq!(
        scheduled.unwrap().len(),
        1,
        "the reminder waits in its table"
    );

    // Found by the value of a state field: the correlation entry's row.
    let found = engine
        .find_process::<Fulfilment>("customer", "ada")
        .await
        .unwrap()
        .expect("found by its customer");
    assert_eq!(found.id, "o-1");
    engine
        .publish(PaymentReceived {
            customer: "ada".into(),
            amount: 30,
        })
        .await
        .unwrap();
    until("the payment", async || {
        order(&engine, "o-1").await.is_some_and(|o| o.paid == 30)
    })
    .await;

    // The invoice reached the endpoint's consumer, once.
    until("the invoice", async || !invoices.lock().unwrap().is_empty()).await;
    assert_eq!(*invoices.lock().unwrap(), [("o-1".to_owned(), 3)]);

    // The tally: checked by whoever does the work, duplicates included.
    let tally = order(&engine, "o-1").await.unwrap().picking.unwrap();
    let mut completed = 0;
    for item in ["0", "1", "1", "2", "0", "2"] {
        if let Checked::Completed { late } = engine.tally(&tally).check(item).await.unwrap() {
            assert!(!late);
            completed += 1;
        }
    }
    assert_eq!(completed, 1, "one check completed the tally");
    until("picked", async || {
        order(&engine, "o-1").await.is_some_and(|o| o.picked == 1)
    })
    .await;
    let status = engine.tally(&tally).status().await.unwrap();
    assert!(status.complete && status.checked == 3 && status.missing.is_empty());

    // The reminder comes due, and completes the order.
    until("the reminder", async || {
        engine
            .process_instance::<Fulfilment>("o-1")
            .await
            .unwrap()
            .is_some_and(|i| i.status == InstanceStatus::Completed)
    })
    .await;
    assert!(
        placed.elapsed() >= Duration::from_millis(2_400),
        "not early"
    );
    let o = order(&engine, "o-1").await.unwrap();
    assert_eq!((o.paid, o.picked, o.reminded), (30, 1, 1));
    assert!(backend.process_scheduled().await.unwrap().is_empty());
    let instance = engine
        .process_instance::<Fulfilment>("o-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        instance.version, 4,
        "placed, paid, picked, reminded: the checks wrote nothing"
    );

    // Settled by its only group, the invoice is trimmed away.
    until("trimmed", async || {
        backend
            .endpoint_messages("invoicing")
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    engine.shutdown().await;
}

// ---------------------------------------------------------------------------
// A tally checked by many checkers at once.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tally_checked_by_eight_checkers_with_duplicates_completes_exactly_once() {
    const ITEMS: u32 = 2_000;
    let pg = TestPostgres::start();
    let engine = Engine::builder()
        .backend(backend(&pg, "saga").await)
        .process_manager(Batches)
        .workers(2)
        .build()
        .await
        .unwrap();
    engine
        .publish(BatchStarted {
            batch: "big".into(),
            items: ITEMS,
            deadline_secs: None,
            poll_secs: None,
        })
        .await
        .unwrap();
    let batch = async || -> Batch {
        engine
            .process_state::<Batches>("big")
            .await
            .unwrap()
            .unwrap_or_default()
    };
    until("the batch", async || batch().await.tally.is_some()).await;
    let tally = batch().await.tally.unwrap();
    // Overlapping ranges, each item twice per checker.
    let completed = Arc::new(AtomicUsize::new(0));
    let checkers: Vec<_> = (0..8u32)
        .map(|n| {
            let (engine, tally, completed) = (engine.clone(), tally.clone(), completed.clone());
            tokio::spawn(async move {
                let from = n * ITEMS / 8;
                let to = (from + ITEMS / 4).min(ITEMS);
                for item in (from..to).chain(from..to) {
                    let checked = engine.tally(&tally).check(item.to_string()).await.unwrap();
                    if let Checked::Completed { .. } = checked {
                        completed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for checker in checkers {
        checker.await.unwrap();
    }
    // The last eighth's range ends at ITEMS: every item was checked.
    assert_eq!(completed.load(Ordering::SeqCst), 1);
    until("the completion handled", async || {
        batch().await.completions == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(batch().await.completions, 1);
    let instance = engine
        .process_instance::<Batches>("big")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(instance.status, InstanceStatus::Completed);
    assert_eq!(instance.version, 2, "the checks never wrote the instance");
    // A completed tally is kept an hour at most.
    let within = pg.psql(
        "SELECT bool_and(expires_at <= clock_timestamp() + interval '1 hour') FROM saga.tallies",
    );
    assert_eq!(within, "t");
    engine.shutdown().await;
}

// ---------------------------------------------------------------------------
// Endpoints.

#[derive(Message, Serialize, Deserialize)]
struct Placed {
    #[correlation_id]
    order: String,
}

#[derive(Default, Serialize, Deserialize)]
struct Nothing;

struct Shop;

#[process_manager(name = "shop", state = Nothing)]
impl Shop {
    #[starts]
    async fn placed(
        &self,
        msg: Placed,
        _state: &mut Nothing,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.send(
            "invoicing",
            SendInvoice {
                order: msg.order,
                items: 1,
            },
        );
        Ok(())
    }
}

async fn shop(pg: &TestPostgres, workers: usize) -> Engine {
    Engine::builder()
        .backend(backend(pg, "saga").await)
        .process_manager(Shop)
        .workers(workers)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_mid_handler_leaves_its_message_to_another_and_the_endpoint_is_trimmed() {
    let pg = TestPostgres::start();
    let engine = shop(&pg, 2).await;
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let doomed = engine
        .consumer("invoicing")
        .visibility_timeout(Duration::from_millis(600))
        .spawn(move |_| {
            s.fetch_add(1, Ordering::SeqCst);
            async { std::future::pending().await }
        });
    engine
        .publish(Placed {
            order: "o-1".into(),
        })
        .await
        .unwrap();
    until("the first consumer took it", async || {
        started.load(Ordering::SeqCst) == 1
    })
    .await;
    doomed.abort(); // like SIGKILL: nothing settled, nothing touched again

    let survivor = shop(&pg, 0).await;
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
    assert!(
        took_over.elapsed() >= Duration::from_millis(300),
        "not before the claim time"
    );
    assert_eq!(*done.lock().unwrap(), [("o-1".to_owned(), 2)]);
    for n in 2..5 {
        engine
            .publish(Placed {
                order: format!("o-{n}"),
            })
            .await
            .unwrap();
    }
    until("all handled", async || done.lock().unwrap().len() == 4).await;
    until("trimmed", async || {
        pg.psql("SELECT count(*) FROM saga.endpoint_messages") == "0"
    })
    .await;
    survivor.shutdown().await;
    engine.shutdown().await;
}

/// An endpoint nobody reads keeps its newest messages up to its cap; one
/// a group reads keeps everything the group has not settled, and refuses
/// a write past its cap instead of dropping its oldest (see
/// `tests/outbox.rs` for every store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_keeps_its_newest_messages_up_to_its_cap() {
    let pg = TestPostgres::start();
    let config = PostgresConfig {
        endpoint_max_len: 3,
        ..PostgresConfig::default()
    };
    let backend = PostgresBackend::connect_url(&pg.url(), config)
        .await
        .unwrap();
    let send = async |endpoint: &str, payloads: &[&str]| {
        let commit = ProcessCommit {
            endpoints: payloads
                .iter()
                .map(|p| (endpoint.to_owned(), p.to_string()))
                .collect(),
            ..ProcessCommit::new(None, Settle::Nothing)
        };
        backend.process_commit("pm", commit).await.unwrap()
    };
    // Read by nobody: a log of the newest three.
    send("log", &["m-1", "m-2"]).await.unwrap();
    send("log", &["m-3", "m-4", "m-5"]).await.unwrap();
    assert_eq!(
        backend.endpoint_messages("log").await.unwrap(),
        ["m-3", "m-4", "m-5"]
    );
    // Read by a group: what it holds stays, and a write past the cap is
    // refused whole.
    send("jobs", &["m-1", "m-2"]).await.unwrap();
    let idle = Duration::from_secs(60);
    let held = backend
        .endpoint_receive("jobs", "g", "c", idle, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.raw, "m-1");
    let refused = send("jobs", &["m-3", "m-4"]).await;
    assert_eq!(
        refused,
        Err(saga_runtime::backend::ProcessRefusal::EndpointFull {
            endpoint: "jobs".into()
        })
    );
    assert_eq!(
        backend.endpoint_messages("jobs").await.unwrap(),
        ["m-1", "m-2"]
    );
    send("jobs", &["m-3"]).await.unwrap();
    // A new group starts at the oldest message kept.
    let other = backend
        .endpoint_receive("jobs", "late", "c", idle, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(other.raw, "m-1");
}

// ---------------------------------------------------------------------------
// The timer poller's queries.

/// How many statements the server ran that mention `what` (a server
/// started with `log_statement = all`).
fn statements(pg: &TestPostgres, what: &str) -> usize {
    let log = pg.psql("SELECT pg_read_file(current_setting('data_directory') || '/../server.log')");
    log.lines()
        .filter(|l| l.contains("statement: ") || l.contains("execute "))
        .filter(|l| l.contains(what))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timer_poller_queries_only_once_a_timeout_can_be_due() {
    let pg = TestPostgres::start_with(&[("log_statement", "all")]);
    let backend = backend(&pg, "saga").await;
    // The listener is up once the first notification can reach it.
    until("listening", async || {
        pg.psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'") != "0"
    })
    .await;
    // (`listening` is set just after the server saw the LISTEN.)
    tokio::time::sleep(Duration::from_millis(200)).await;
    let now = || Timestamp::now().0;
    for _ in 0..50 {
        assert_eq!(backend.process_release_due(now(), 10).await.unwrap(), 0);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        statements(&pg, "release_timers") <= 2,
        "an idle poller asked {} times",
        statements(&pg, "release_timers")
    );

    // A timeout scheduled elsewhere: its notification tells when to look.
    let remind = Envelope {
        message_id: "r-1".into(),
        process: "pm".into(),
        message_type: "Remind".into(),
        payload: serde_json::json!(null),
        kind: EnvelopeKind::Timeout,
        instance_id: Some("i-1".into()),
        generation: None,
        failures: 0,
        key: None,
        key_field: None,
        traceparent: None,
        due_ms: None,
        hops: 0,
        hold_until: None,
    };
    let due = now() + 400;
    let commit = ProcessCommit {
        schedule: vec![(due, remind)],
        ..ProcessCommit::new(None, Settle::Nothing)
    };
    backend.process_commit("pm", commit).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = statements(&pg, "release_timers");
    while now() < due {
        assert_eq!(backend.process_release_due(now(), 10).await.unwrap(), 0);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        statements(&pg, "release_timers"),
        before,
        "no query before the due time"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(backend.process_release_due(now(), 10).await.unwrap(), 1);
    assert!(backend.process_scheduled().await.unwrap().is_empty());
}
