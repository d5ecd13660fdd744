//! Process managers, once for every store: contention on one instance
//! from two engines (both concurrency modes), racing starters, durability
//! across an engine restart and a server crash, saga and process traffic
//! side by side, a deleted instance's late duplicates and timeouts, what
//! a listing does with a record it cannot read, and an order correlated
//! by a state field, timed out, tallied and invoiced to an endpoint.

use std::time::{Duration, Instant};

use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

use crate::common::stores::ScenarioStore;

#[derive(Message, Serialize, Deserialize)]
struct Begin {
    #[correlation_id]
    id: String,
    key: String,
}

#[derive(Message, Serialize, Deserialize)]
struct Increment {
    key: String,
}

#[derive(Message, Serialize, Deserialize)]
struct Expire;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Tally {
    key: String,
    count: u64,
    starts: u64,
    expired: bool,
}

struct Counter {
    expire_after: Duration,
}

#[process_manager(name = "counter", state = Tally)]
impl Counter {
    #[starts]
    #[correlate(state.key = msg.key)]
    async fn begin(
        &self,
        _m: Begin,
        s: &mut Tally,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.starts += 1;
        if s.starts == 1 {
            ctx.request_timeout(self.expire_after, Expire);
        }
        Ok(())
    }

    #[handles]
    #[correlate(state.key = msg.key)]
    async fn increment(
        &self,
        _m: Increment,
        s: &mut Tally,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.count += 1;
        Ok(())
    }

    #[timeout]
    async fn expire(
        &self,
        _t: Expire,
        s: &mut Tally,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.expired = true;
        Ok(())
    }
}

async fn engine<S: ScenarioStore>(store: &S, workers: usize, expire_after: Duration) -> Engine {
    Engine::builder()
        .backend_arc(store.backend(Duration::from_millis(800)).await)
        .process_manager(Counter { expire_after })
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(workers)
        .build()
        .await
        .unwrap()
}

async fn until<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn tally(engine: &Engine, key: &str) -> Option<Tally> {
    let instance = engine.find_process::<Counter>("key", key).await.ok()??;
    serde_json::from_value(instance.state).ok()
}

pub async fn a_thousand_messages_to_one_instance_from_four_workers_count_exactly_a_thousand<
    S: ScenarioStore,
>() {
    let store = S::start();
    let hour = Duration::from_secs(3600);
    let a = engine(&store, 2, hour).await;
    let b = engine(&store, 2, hour).await;
    a.publish(Begin {
        id: "c-1".into(),
        key: "hot".into(),
    })
    .await
    .unwrap();
    until("the instance", Duration::from_secs(10), || async {
        tally(&a, "hot").await.is_some()
    })
    .await;
    for _ in 0..1000 {
        a.publish(Increment { key: "hot".into() }).await.unwrap();
    }
    until("1000 increments", Duration::from_secs(120), || async {
        tally(&b, "hot").await.is_some_and(|t| t.count >= 1000)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = tally(&a, "hot").await.unwrap();
    assert_eq!(t.count, 1000, "no increment lost, none applied twice");
    let handled = [&a, &b]
        .iter()
        .map(|e| {
            e.process_metrics()
                .handled
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum::<u64>();
    assert_eq!(handled, 1001);
}

#[derive(Message, Serialize, Deserialize)]
struct LockedIncrement {
    #[correlation_id]
    id: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Count {
    n: u64,
}

/// The same counter in pessimistic mode: the instance's lease is held
/// while its handler runs.
struct LockedCounter;

#[process_manager(name = "locked-counter", state = Count, concurrency = pessimistic)]
impl LockedCounter {
    #[starts]
    async fn increment(
        &self,
        _m: LockedIncrement,
        s: &mut Count,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.n += 1;
        Ok(())
    }
}

pub async fn a_thousand_messages_to_one_pessimistic_instance_from_four_workers_count_exactly_a_thousand<
    S: ScenarioStore,
>() {
    let store = S::start();
    // Messages stay invisible for longer than the whole run may take: a
    // worker that left a message to wait for its redelivery, instead of
    // handing it back when the lease is busy, fails the wait below.
    let engine = || async {
        Engine::builder()
            .backend_arc(store.backend(Duration::from_secs(120)).await)
            .process_manager(LockedCounter)
            .workers(2)
            .build()
            .await
            .unwrap()
    };
    let (a, b) = (engine().await, engine().await);
    for _ in 0..1000 {
        a.publish(LockedIncrement { id: "hot".into() })
            .await
            .unwrap();
    }
    let count = || async {
        b.process_state::<LockedCounter>("hot")
            .await
            .unwrap()
            .map_or(0, |c| c.n)
    };
    until("1000 increments", Duration::from_secs(90), || async {
        count().await >= 1000
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count().await, 1000, "no increment lost, none applied twice");
    a.shutdown().await;
    b.shutdown().await;
}

pub async fn racing_starting_messages_create_one_instance<S: ScenarioStore>() {
    let store = S::start();
    let hour = Duration::from_secs(3600);
    let engines = [engine(&store, 2, hour).await, engine(&store, 2, hour).await];
    for n in 0..20 {
        let key = format!("race-{n}");
        // Different correlation ids, same correlated key: both may start it.
        let (r1, r2) = tokio::join!(
            engines[0].publish(Begin {
                id: format!("{key}-a"),
                key: key.clone()
            }),
            engines[1].publish(Begin {
                id: format!("{key}-b"),
                key: key.clone()
            }),
        );
        r1.unwrap();
        r2.unwrap();
    }
    until("40 starts", Duration::from_secs(30), || async {
        let mut total = 0;
        for n in 0..20 {
            total += tally(&engines[0], &format!("race-{n}"))
                .await
                .map_or(0, |t| t.starts);
        }
        total == 40
    })
    .await;
    let instances = engines[0].process_instances::<Counter>().await.unwrap();
    assert_eq!(instances.len(), 20, "one instance per key");
    for n in 0..20 {
        assert_eq!(
            tally(&engines[0], &format!("race-{n}"))
                .await
                .unwrap()
                .starts,
            2
        );
    }
}

pub async fn state_and_timeouts_survive_a_worker_restart_and_a_server_crash<S: ScenarioStore>() {
    let mut store = S::start();
    let first = engine(&store, 2, Duration::from_millis(1500)).await;
    first
        .publish(Begin {
            id: "d-1".into(),
            key: "durable".into(),
        })
        .await
        .unwrap();
    // Increments only continue an instance: wait for it to exist.
    until("the instance", Duration::from_secs(10), || async {
        tally(&first, "durable").await.is_some()
    })
    .await;
    for _ in 0..5 {
        first
            .publish(Increment {
                key: "durable".into(),
            })
            .await
            .unwrap();
    }
    until("5 increments", Duration::from_secs(10), || async {
        tally(&first, "durable").await.is_some_and(|t| t.count == 5)
    })
    .await;
    first.shutdown().await;
    drop(first);

    // The server crashes and comes back with everything it acknowledged.
    tokio::task::block_in_place(|| {
        store.crash();
        store.restart();
    });
    let second = engine(&store, 2, Duration::from_millis(1500)).await;
    for _ in 0..5 {
        second
            .publish(Increment {
                key: "durable".into(),
            })
            .await
            .unwrap();
    }
    until(
        "10 increments and the timeout",
        Duration::from_secs(20),
        || async {
            tally(&second, "durable")
                .await
                .is_some_and(|t| t.count == 10 && t.expired)
        },
    )
    .await;
    let t = tally(&second, "durable").await.unwrap();
    assert_eq!((t.count, t.starts, t.expired), (10, 1, true));
}

struct Noop;

#[saga]
impl Noop {
    #[saga_step(1)]
    async fn one(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

pub async fn mixed_saga_and_process_traffic_flows_without_waiting_for_redelivery<
    S: ScenarioStore,
>() {
    let store = S::start();
    // The default 30 s visibility timeout: nothing here may rely on a
    // message being taken over later.
    let client = Engine::builder()
        .backend_arc(store.backend(Duration::from_secs(30)).await)
        .saga(Noop)
        .process_manager(Counter {
            expire_after: Duration::from_secs(3600),
        })
        .workers(0)
        .build()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..30 {
        ids.push(client.start::<Noop>(n).await.unwrap());
        client
            .publish(Begin {
                id: format!("m-{n}"),
                key: format!("k-{n}"),
            })
            .await
            .unwrap();
    }
    let started = Instant::now();
    let _worker = Engine::builder()
        .backend_arc(store.backend(Duration::from_secs(30)).await)
        .saga(Noop)
        .process_manager(Counter {
            expire_after: Duration::from_secs(3600),
        })
        .workers(1)
        .build()
        .await
        .unwrap();
    for id in ids {
        client.wait(id).await.unwrap();
    }
    until("30 instances", Duration::from_secs(20), || async {
        client.process_instances::<Counter>().await.unwrap().len() == 30
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

/// An instance whose record this version cannot read (a status it does
/// not know) is left out of listings with a warning, and a page short of
/// it is not taken for the last; listing the process manager used to fail
/// as a whole.
pub async fn an_unreadable_instance_is_left_out_of_listings<S: ScenarioStore>() {
    let store = S::start();
    let engine = engine(&store, 2, Duration::from_secs(3600)).await;
    for n in 0..5 {
        engine
            .publish(Begin {
                id: format!("i-{n}"),
                key: format!("k-{n}"),
            })
            .await
            .unwrap();
    }
    until("5 instances", Duration::from_secs(10), || async {
        engine
            .process_instances::<Counter>()
            .await
            .is_ok_and(|l| l.len() == 5)
    })
    .await;
    let bad = engine
        .find_process::<Counter>("key", "k-1")
        .await
        .unwrap()
        .unwrap()
        .id;
    store.corrupt_instance_status("counter", &bad, "Exploded");
    let listed = engine.process_instances::<Counter>().await.unwrap();
    let mut ids: Vec<String> = listed.iter().map(|i| i.id.clone()).collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert!(!ids.contains(&bad), "{ids:?}");
    ids.sort();
    // Paged two at a time: the page that holds it comes back short, with a
    // cursor all the same.
    let backend = store
        .backend(Duration::from_secs(30))
        .await
        .processes()
        .expect("a store with process managers");
    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = backend
            .process_page("counter", after.as_deref(), 2)
            .await
            .unwrap();
        paged.extend(page.items.into_iter().map(|i| i.id));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    paged.sort();
    assert_eq!(paged, ids);
    engine.shutdown().await;
}

// ---------------------------------------------------------------------------
// A deleted instance's timeouts and late duplicates.

#[derive(Message, Serialize, Deserialize)]
struct Open {
    #[correlation_id]
    id: String,
    remind_after_ms: u64,
}

#[derive(Message, Serialize, Deserialize)]
struct Close {
    #[correlation_id]
    id: String,
}

#[derive(Message, Serialize, Deserialize)]
struct Remind;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Ticket {
    opened: u32,
    reminded: u32,
}

struct Tickets;

#[process_manager(name = "tickets", state = Ticket, on_complete = delete)]
impl Tickets {
    #[starts]
    async fn open(
        &self,
        m: Open,
        s: &mut Ticket,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.opened += 1;
        ctx.request_timeout(Duration::from_millis(m.remind_after_ms), Remind);
        Ok(())
    }

    #[handles]
    async fn close(
        &self,
        _m: Close,
        _s: &mut Ticket,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.mark_complete();
        Ok(())
    }

    #[timeout]
    async fn remind(
        &self,
        _t: Remind,
        s: &mut Ticket,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.reminded += 1;
        Ok(())
    }
}

/// The two limits the README used to list: an instance deleted and created
/// again under the same correlation id received its predecessor's pending
/// timeout, and a late duplicate of the message that started a deleted
/// instance started it again.
pub async fn a_recreated_instance_gets_no_old_timeouts_and_late_duplicates_start_nothing<
    S: ScenarioStore,
>() {
    use std::sync::atomic::Ordering;

    let store = S::start();
    let engine = Engine::builder()
        .backend_arc(store.backend(Duration::from_secs(30)).await)
        .process_manager(Tickets)
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(1)
        .build()
        .await
        .unwrap();
    let open = |remind_after_ms| Open {
        id: "t-1".into(),
        remind_after_ms,
    };
    let exists = || async {
        engine
            .process_instance::<Tickets>("t-1")
            .await
            .unwrap()
            .is_some()
    };

    // The first instance asks for a reminder in 700 ms, then is closed
    // (and deleted) before it is due.
    engine.publish_with_id("open-1", open(700)).await.unwrap();
    until("the first instance", Duration::from_secs(10), exists).await;
    engine.publish(Close { id: "t-1".into() }).await.unwrap();
    until("its deletion", Duration::from_secs(10), || async {
        !exists().await
    })
    .await;

    // A late duplicate of its starting message starts nothing.
    let metrics = engine.process_metrics();
    let duplicates = metrics.duplicates.load(Ordering::Relaxed);
    engine.publish_with_id("open-1", open(700)).await.unwrap();
    until("the duplicate dropped", Duration::from_secs(10), || async {
        metrics.duplicates.load(Ordering::Relaxed) > duplicates
    })
    .await;
    assert!(!exists().await, "a late duplicate recreated the instance");

    // A new instance under the same id; its own reminder is an hour away.
    engine
        .publish_with_id("open-2", open(3_600_000))
        .await
        .unwrap();
    until("the second instance", Duration::from_secs(10), exists).await;
    // The first instance's reminder comes due and is dispatched...
    let ignored = metrics.ignored.load(Ordering::Relaxed);
    until(
        "the old reminder dispatched",
        Duration::from_secs(10),
        || async { metrics.ignored.load(Ordering::Relaxed) > ignored },
    )
    .await;
    // ...and ignored: it was the old instance's.
    let state: Ticket = serde_json::from_value(
        engine
            .process_instance::<Tickets>("t-1")
            .await
            .unwrap()
            .unwrap()
            .state,
    )
    .unwrap();
    assert_eq!((state.opened, state.reminded), (1, 0), "{state:?}");
}

/// An instance's `updated_at` says when it was last written, on Redis too
/// (the record stored was the one loaded, stamped with the write before).
pub async fn an_instance_records_when_it_was_last_written<S: ScenarioStore>() {
    let store = S::start();
    let engine = engine(&store, 1, Duration::from_secs(3600)).await;
    engine
        .publish(Begin {
            id: "b-1".into(),
            key: "stamped".into(),
        })
        .await
        .unwrap();
    until("the instance", Duration::from_secs(10), || async {
        tally(&engine, "stamped").await.is_some()
    })
    .await;
    let created = engine
        .find_process::<Counter>("key", "stamped")
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = saga_runtime::task::Timestamp::now();
    engine
        .publish(Increment {
            key: "stamped".into(),
        })
        .await
        .unwrap();
    until("the increment", Duration::from_secs(10), || async {
        tally(&engine, "stamped")
            .await
            .is_some_and(|t| t.count == 1)
    })
    .await;
    let written = engine
        .find_process::<Counter>("key", "stamped")
        .await
        .unwrap()
        .unwrap();
    assert!(
        written.updated_at >= before && written.updated_at > created.updated_at,
        "updated_at {:?} was not moved by the write after {:?} (created {:?})",
        written.updated_at,
        before,
        created.updated_at
    );
    engine.shutdown().await;
}

// ---------------------------------------------------------------------------
// An order: placed (starts it, by its id), paid (correlated by the
// customer, a state field), picked (a tally of its items), reminded (a
// timeout); it sends an invoice to the `invoicing` endpoint.

/// Correlated by a state field, timed out (not early), tallied with
/// duplicates (one completion; the checks write nothing), invoiced to an
/// endpoint's consumer once, and the settled invoice trimmed away.
pub async fn an_order_is_correlated_timed_out_tallied_and_invoiced<S: ScenarioStore>() {
    fulfilment::an_order_is_correlated_timed_out_tallied_and_invoiced::<S>().await;
}

mod fulfilment {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use saga_runtime::backend::{InstanceStatus, ProcessBackend};
    use saga_runtime::engine::Checked;
    use saga_runtime::prelude::*;
    use saga_runtime::task::Timestamp;
    use serde::{Deserialize, Serialize};

    use crate::common::stores::ScenarioStore;
    use crate::common::until;

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

    /// Moves due timeouts every 20 ms, as a second timer poller racing the
    /// engine's would (moving each once however many race is the store's
    /// part); until dropped.
    struct DriveTimers(tokio::task::JoinHandle<()>);

    impl DriveTimers {
        fn start(backend: Arc<dyn ProcessBackend>) -> Self {
            DriveTimers(tokio::spawn(async move {
                loop {
                    let _ = backend.process_release_due(Timestamp::now().0, 256).await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }))
        }
    }

    impl Drop for DriveTimers {
        fn drop(&mut self) {
            self.0.abort();
        }
    }

    /// See [`super::an_order_is_correlated_timed_out_tallied_and_invoiced`]
    /// (here, beside its types).
    pub(super) async fn an_order_is_correlated_timed_out_tallied_and_invoiced<S: ScenarioStore>() {
        let store = S::start();
        let backend = store.backend(Duration::from_secs(2)).await;
        let processes = backend
            .clone()
            .processes()
            .expect("a process-manager store");
        let _timers = DriveTimers::start(processes.clone());
        let engine = Engine::builder()
            .backend_arc(backend)
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
        assert_eq!(scheduled.unwrap().len(), 1, "the reminder is scheduled");

        // Found by the value of a state field: its correlation entry.
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
        println!("the order completed after {:?}", placed.elapsed());
        assert!(
            placed.elapsed() >= Duration::from_millis(2_400),
            "not early"
        );
        let o = order(&engine, "o-1").await.unwrap();
        assert_eq!((o.paid, o.picked, o.reminded), (30, 1, 1));
        assert!(processes.process_scheduled().await.unwrap().is_empty());
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
            processes
                .endpoint_messages("invoicing")
                .await
                .unwrap()
                .is_empty()
        })
        .await;
        engine.shutdown().await;
    }
}
