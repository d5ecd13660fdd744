//! Regressions found by an adversarial review of batched saves (process
//! managers): order after a refused batch, a remembered instance that
//! another engine deleted and created again, a cancelled lock wait, and
//! the clock of a batched message's timeouts.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::TestRedis;
use common::until;
use saga_runtime::backend::memory::MemoryBackend;
use saga_runtime::backend::Backend;
use saga_runtime::prelude::*;
use saga_runtime::EngineBuilder;
use serde::{Deserialize, Serialize};

// ------------------------------------------------------------- order --

#[derive(Message, Serialize, Deserialize)]
struct Opened {
    #[correlation_id]
    id: String,
    slow: bool,
}

#[derive(Message, Serialize, Deserialize)]
struct Noted {
    #[correlation_id]
    id: String,
    note: String,
}

#[derive(Message, Serialize, Deserialize)]
struct Tagged {
    #[correlation_id]
    id: String,
    tag: String,
}

#[derive(Message, Serialize, Deserialize)]
struct ByTag {
    tag: String,
}

#[derive(Message, Serialize, Deserialize)]
struct Closed {
    #[correlation_id]
    id: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Log {
    tag: String,
    log: Vec<String>,
}

struct Logs;

#[process_manager(name = "logs", state = Log)]
impl Logs {
    #[starts]
    async fn opened(
        &self,
        msg: Opened,
        state: &mut Log,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if msg.slow {
            // Long enough for the messages behind it to queue on the
            // in-process instance lock.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        state.log.push("opened".into());
        Ok(())
    }

    #[handles]
    async fn noted(
        &self,
        msg: Noted,
        state: &mut Log,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.log.push(format!("note {}", msg.note));
        Ok(())
    }

    /// Changes a correlation value: never batched, handled alone.
    #[handles]
    async fn tagged(
        &self,
        msg: Tagged,
        state: &mut Log,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.tag = msg.tag.clone();
        state.log.push(format!("tag {}", msg.tag));
        Ok(())
    }

    #[handles]
    #[correlate(state.tag = msg.tag)]
    async fn by_tag(
        &self,
        _msg: ByTag,
        state: &mut Log,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.log.push("by tag".into());
        Ok(())
    }

    #[handles]
    async fn closed(
        &self,
        _msg: Closed,
        _state: &mut Log,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.stop();
        Ok(())
    }
}

fn logs_engine(backend: &Arc<dyn Backend>, workers: usize) -> EngineBuilder {
    Engine::builder()
        .backend_arc(backend.clone())
        .process_manager(Logs)
        .workers(workers)
        .worker_concurrency(8)
}

/// The order of one instance's messages: a batch whose write is refused
/// (a late duplicate in it hits a tombstone; equally a version conflict)
/// is dropped and dispatch `continue`s; the re-run takes the *next* waiting
/// messages into its write, ahead of those it dropped (which wait for the
/// lock and run after it).
#[tokio::test]
async fn a_refused_batch_does_not_let_later_messages_overtake_the_ones_it_dropped() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    // An earlier instance `x` handled `s1` and was deleted: its tombstone
    // remembers `s1`.
    let first = logs_engine(&backend, 1).build().await.unwrap();
    first
        .publish_with_id(
            "s1",
            Opened {
                id: "x".into(),
                slow: false,
            },
        )
        .await
        .unwrap();
    until("x opened", async || {
        first.process_instance::<Logs>("x").await.unwrap().is_some()
    })
    .await;
    first.publish(Closed { id: "x".into() }).await.unwrap();
    until("x deleted", async || {
        first.process_instance::<Logs>("x").await.unwrap().is_none()
    })
    .await;
    first.shutdown().await;

    // Queued before any worker runs, in this order: a new `x` (slow), a
    // late duplicate of `s1`, a tag change, a note.
    let engine = logs_engine(&backend, 0).build().await.unwrap();
    engine
        .publish(Opened {
            id: "x".into(),
            slow: true,
        })
        .await
        .unwrap();
    engine
        .publish_with_id(
            "s1",
            Opened {
                id: "x".into(),
                slow: false,
            },
        )
        .await
        .unwrap();
    engine
        .publish(Tagged {
            id: "x".into(),
            tag: "t".into(),
        })
        .await
        .unwrap();
    engine
        .publish(Noted {
            id: "x".into(),
            note: "a".into(),
        })
        .await
        .unwrap();
    let worker = engine.clone();
    tokio::spawn(async move { worker.run_workers(1).await });
    let log = || async {
        engine
            .process_state::<Logs>("x")
            .await
            .unwrap()
            .map_or_else(Vec::new, |s| s.log)
    };
    until("all handled", async || log().await.len() >= 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = log().await;
    engine.shutdown().await;
    assert_eq!(
        log,
        vec!["opened", "tag t", "note a"],
        "the note was published after the tag change, and was applied before it"
    );
}

// ------------------------------------ saved instances outlive their slot --

#[derive(Message, Serialize, Deserialize)]
struct CartOpened {
    #[correlation_id]
    cart: String,
}

#[derive(Message, Serialize, Deserialize)]
struct CartItem {
    #[correlation_id]
    cart: String,
}

#[derive(Message, Serialize, Deserialize)]
struct CartClosed {
    #[correlation_id]
    cart: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Cart {
    items: u32,
}

struct Carts;

#[process_manager(name = "carts", state = Cart)]
impl Carts {
    #[starts]
    async fn opened(
        &self,
        _msg: CartOpened,
        _state: &mut Cart,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        Ok(())
    }

    #[handles]
    async fn item(
        &self,
        _msg: CartItem,
        state: &mut Cart,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.items += 1;
        Ok(())
    }

    #[handles]
    async fn closed(
        &self,
        _msg: CartClosed,
        _state: &mut Cart,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.stop();
        Ok(())
    }
}

/// One engine of a deployment that runs `pm` with four handlers at once.
async fn engine_of<P: ProcessManager>(redis: &TestRedis, pm: P) -> Engine {
    Engine::builder()
        .backend(redis.backend().await)
        .process_manager(pm)
        .lock_ttl(Duration::from_secs(30))
        .worker_concurrency(4)
        .workers(1)
        .build()
        .await
        .unwrap()
}

/// worker/instance_lock.rs `recent`: the instance as this engine last
/// saved it is kept after its lock slot is forgotten, with no bound in
/// time, and `dispatch` prefers it to the read that came with the message.
/// Another engine may have written the instance since (partitions move
/// when engines join and leave: a scale-up then a rolling deploy): here it
/// was deleted here, created again by the other engine, and a later message
/// for it back here is judged against "deleted": unmatched, acknowledged
/// and lost. (No version check guards that decision.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_another_engine_created_again_is_not_taken_for_deleted() {
    let redis = TestRedis::start();
    let keys: Vec<String> = (0..32).map(|n| format!("cart-{n}")).collect();
    let a = engine_of(&redis, Carts).await;
    until("a owning every partition", async || {
        redis.partition_owner_set().is_some_and(|s| s.len() == 1)
    })
    .await;
    let exists = |e: &Engine, k: &str| {
        let (e, k) = (e.clone(), k.to_owned());
        async move { e.process_instance::<Carts>(&k).await.unwrap().is_some() }
    };
    // Each cart opened and closed (deleted) on `a`.
    for k in &keys {
        a.publish(CartOpened { cart: k.clone() }).await.unwrap();
    }
    for k in &keys {
        until("opened", async || exists(&a, k).await).await;
    }
    for k in &keys {
        a.publish(CartClosed { cart: k.clone() }).await.unwrap();
    }
    for k in &keys {
        until("closed", async || !exists(&a, k).await).await;
    }

    // `b` joins and takes half the partitions; the carts are opened again,
    // each by its partition's owner.
    let b = engine_of(&redis, Carts).await;
    until("two engines", async || {
        redis.partition_owner_set().is_some_and(|s| s.len() == 2)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for k in &keys {
        a.publish(CartOpened { cart: k.clone() }).await.unwrap();
    }
    for k in &keys {
        until("opened again", async || exists(&a, k).await).await;
    }
    let by_b = b.process_metrics().handled.load(Ordering::Relaxed);

    // `b` leaves; `a` owns everything again, and each cart gets an item.
    b.shutdown().await;
    until("a owning every partition again", async || {
        redis.partition_owner_set().is_some_and(|s| s.len() == 1)
    })
    .await;
    let unmatched_before = a.process_metrics().unmatched.load(Ordering::Relaxed);
    for k in &keys {
        a.publish(CartItem { cart: k.clone() }).await.unwrap();
    }
    let items = |k: String| {
        let a = a.clone();
        async move {
            a.process_state::<Carts>(&k)
                .await
                .unwrap()
                .map_or(0, |c| c.items)
        }
    };
    let settled = async || {
        let mut n = a.process_metrics().unmatched.load(Ordering::Relaxed) - unmatched_before;
        for k in &keys {
            n += u64::from(items(k.clone()).await);
        }
        n >= keys.len() as u64
    };
    until("every item handled or dropped", settled).await;
    let mut lost = Vec::new();
    for k in &keys {
        if items(k.clone()).await != 1 {
            lost.push(k.clone());
        }
    }
    let unmatched = a.process_metrics().unmatched.load(Ordering::Relaxed) - unmatched_before;
    a.shutdown().await;
    assert!(by_b > 0, "b opened some carts again");
    assert!(
        lost.is_empty(),
        "{unmatched} items dropped as unmatched although their cart exists: {lost:?} \
         (b had opened {by_b} of them again)"
    );
}

// ------------------------------------------- pessimistic: waiters count --

static DESK_WORK_STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[derive(Message, Serialize, Deserialize)]
struct DeskOpened {
    #[correlation_id]
    desk: String,
}

#[derive(Message, Serialize, Deserialize)]
struct DeskWork {
    #[correlation_id]
    desk: String,
    slow: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct DeskState {
    works: u32,
}

struct LockedDesks;

#[process_manager(name = "locked-desks", state = DeskState, concurrency = pessimistic)]
impl LockedDesks {
    #[starts]
    async fn opened(
        &self,
        _msg: DeskOpened,
        _state: &mut DeskState,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        Ok(())
    }

    #[handles]
    async fn work(
        &self,
        msg: DeskWork,
        state: &mut DeskState,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if msg.slow {
            DESK_WORK_STARTED.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1000)).await;
        }
        state.works += 1;
        Ok(())
    }
}

/// worker/instance_lock.rs `lock`: a waiter counts itself in `waiters`
/// before it awaits the lock and uncounts itself after; a wait that is
/// dropped (workers aborted by dropping `run_workers`, documented as "their
/// messages come back after the visibility timeout") never uncounts. The
/// holder then believes a handler of the instance follows it here and hands
/// its pessimistic lease over instead of releasing it; nobody takes it, the
/// slot is forgotten with the lease in it, and the lease stays held in the
/// store for its whole TTL: no handler of that instance anywhere until
/// then. (Before, `has_waiters` counted live references, which a dropped
/// wait gives up.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_lock_wait_does_not_make_the_holder_keep_its_lease() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .process_manager(LockedDesks)
        .lock_ttl(Duration::from_secs(30))
        .worker_concurrency(1)
        .workers(1)
        .build()
        .await
        .unwrap();
    engine
        .publish(DeskOpened { desk: "d".into() })
        .await
        .unwrap();
    let works = || async {
        engine
            .process_state::<LockedDesks>("d")
            .await
            .unwrap()
            .map(|s| s.works)
    };
    until("opened", async || works().await.is_some()).await;
    // The background worker (one message at a time) is busy with a slow
    // handler of `d`...
    engine
        .publish(DeskWork {
            desk: "d".into(),
            slow: true,
        })
        .await
        .unwrap();
    until("slow work started", async || {
        DESK_WORK_STARTED.load(Ordering::SeqCst)
    })
    .await;
    // ... so the next message of `d` goes to a second worker, where it
    // waits for the instance lock; then that worker is aborted.
    let second = engine.clone();
    let second = tokio::spawn(async move { second.run_workers(1).await });
    engine
        .publish(DeskWork {
            desk: "d".into(),
            slow: false,
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    second.abort();
    let _ = second.await;

    until("the slow work saved", async || works().await >= Some(1)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leases: Vec<(String, i64)> = redis
        .keys()
        .into_iter()
        .filter(|k| k.contains("lease:pm-lock"))
        .map(|k| {
            let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut redis.conn()).unwrap();
            (k, ttl)
        })
        .collect();
    // The aborted worker's message comes back after the visibility
    // timeout (800 ms) and should then be handled at once.
    let back = std::time::Instant::now();
    let deadline = back + Duration::from_secs(8);
    while works().await < Some(2) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second_after = back.elapsed();
    engine.shutdown().await;
    assert!(
        leases.is_empty(),
        "nothing runs or waits for `d` here, yet its lease is held: {leases:?}; \
         the next message of `d` waited {second_after:?}"
    );
}

// ---------------------------------------- timeouts of a batched message --

static ARMED_AT: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
static RANG_AFTER: std::sync::Mutex<Option<Duration>> = std::sync::Mutex::new(None);

#[derive(Message, Serialize, Deserialize)]
struct AlarmSet {
    #[correlation_id]
    id: String,
}

#[derive(Message, Serialize, Deserialize)]
struct AlarmSlow {
    #[correlation_id]
    id: String,
}

#[derive(Message, Serialize, Deserialize)]
struct AlarmArm {
    #[correlation_id]
    id: String,
}

#[derive(Message, Serialize, Deserialize)]
struct Ring;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Alarm {
    rang: bool,
}

struct Alarms;

#[process_manager(name = "alarms", state = Alarm)]
impl Alarms {
    #[starts]
    async fn set(
        &self,
        _msg: AlarmSet,
        _state: &mut Alarm,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        Ok(())
    }

    #[handles]
    async fn slow(
        &self,
        _msg: AlarmSlow,
        _state: &mut Alarm,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Ok(())
    }

    #[handles]
    async fn arm(
        &self,
        _msg: AlarmArm,
        _state: &mut Alarm,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        *ARMED_AT.lock().unwrap() = Some(std::time::Instant::now());
        ctx.request_timeout(Duration::from_millis(1000), Ring);
        Ok(())
    }

    #[timeout]
    async fn ring(
        &self,
        _t: Ring,
        state: &mut Alarm,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let armed = ARMED_AT.lock().unwrap().expect("armed");
        RANG_AFTER.lock().unwrap().get_or_insert(armed.elapsed());
        state.rang = true;
        Ok(())
    }
}

/// process/batch.rs `apply` -> effects.rs `due(env.now_ms, ..)`: a batched
/// message's timeouts are due from the *holder's* clock, read before the
/// holder's own handler (and every handler batched before this one) ran.
/// A 1 s timeout asked for behind a 1.5 s handler is due before it was
/// asked for: it fires at once. Alone, the message reads the clock after
/// it got the lock.
#[tokio::test]
async fn a_batched_message_s_timeout_is_not_due_before_its_delay() {
    let engine = Engine::builder()
        .backend(MemoryBackend::new())
        .process_manager(Alarms)
        .workers(0)
        .worker_concurrency(8)
        .timeout_poll_interval(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    engine.publish(AlarmSet { id: "a".into() }).await.unwrap();
    engine.publish(AlarmSlow { id: "a".into() }).await.unwrap();
    engine.publish(AlarmArm { id: "a".into() }).await.unwrap();
    let worker = engine.clone();
    tokio::spawn(async move { worker.run_workers(1).await });
    until("rang", async || {
        engine
            .process_state::<Alarms>("a")
            .await
            .unwrap()
            .is_some_and(|s| s.rang)
    })
    .await;
    let after = RANG_AFTER.lock().unwrap().expect("rang");
    let batched = engine.process_metrics().batched.load(Ordering::Relaxed);
    engine.shutdown().await;
    assert!(
        after >= Duration::from_millis(900),
        "a 1 s timeout fired {after:?} after it was asked for ({batched} message(s) batched)"
    );
}

// ----------------------- saved instances outlive their slot: same version --

#[derive(Message, Serialize, Deserialize)]
struct TabOpened {
    #[correlation_id]
    tab: String,
    epoch: u32,
}

#[derive(Message, Serialize, Deserialize)]
struct TabItem {
    #[correlation_id]
    tab: String,
}

#[derive(Message, Serialize, Deserialize)]
struct TabClosed {
    #[correlation_id]
    tab: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Tab {
    epoch: u32,
    items: u32,
}

struct Tabs;

#[process_manager(name = "tabs", state = Tab)]
impl Tabs {
    #[starts]
    async fn opened(
        &self,
        msg: TabOpened,
        state: &mut Tab,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.epoch = msg.epoch;
        Ok(())
    }

    #[handles]
    async fn item(
        &self,
        _msg: TabItem,
        state: &mut Tab,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.items += 1;
        Ok(())
    }

    #[handles]
    async fn closed(
        &self,
        _msg: TabClosed,
        _state: &mut Tab,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.stop();
        Ok(())
    }
}

/// The same `recent` entry, when the other engine's instance has the same
/// version as the remembered one (deleted at version 1, created again at
/// version 1): the version check passes, and the message is applied to
/// the *old* instance's state, which overwrites the new instance (its
/// state and generation) in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_instance_never_overwrites_the_one_created_since() {
    let redis = TestRedis::start();
    let keys: Vec<String> = (0..32).map(|n| format!("tab-{n}")).collect();
    let a = engine_of(&redis, Tabs).await;
    until("a owning every partition", async || {
        redis.partition_owner_set().is_some_and(|s| s.len() == 1)
    })
    .await;
    let state = |k: &str| {
        let (a, k) = (a.clone(), k.to_owned());
        async move { a.process_state::<Tabs>(&k).await.unwrap() }
    };
    // Epoch 1 of each tab, opened on `a` (saved at version 1).
    for k in &keys {
        a.publish(TabOpened {
            tab: k.clone(),
            epoch: 1,
        })
        .await
        .unwrap();
    }
    for k in &keys {
        until("opened", async || state(k).await.is_some()).await;
    }
    // `b` takes half the partitions; each tab is closed and opened again
    // (epoch 2, version 1 again) by its partition's owner.
    let b = engine_of(&redis, Tabs).await;
    until("two engines", async || {
        redis.partition_owner_set().is_some_and(|s| s.len() == 2)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for k in &keys {
        a.publish(TabClosed { tab: k.clone() }).await.unwrap();
    }
    for k in &keys {
        until("closed", async || state(k).await.is_none()).await;
    }
    for k in &keys {
        a.publish(TabOpened {
            tab: k.clone(),
            epoch: 2,
        })
        .await
        .unwrap();
    }
    for k in &keys {
        until("opened again", async || state(k).await.is_some()).await;
    }
    b.shutdown().await;
    until("a owning every partition again", async || {
        redis.partition_owner_set().is_some_and(|s| s.len() == 1)
    })
    .await;
    for k in &keys {
        a.publish(TabItem { tab: k.clone() }).await.unwrap();
    }
    for k in &keys {
        until("item", async || {
            state(k).await.is_some_and(|t| t.items == 1)
        })
        .await;
    }
    let mut wrong = Vec::new();
    for k in &keys {
        let t = state(k).await.unwrap();
        if t.epoch != 2 {
            wrong.push((k.clone(), t.epoch));
        }
    }
    a.shutdown().await;
    assert!(
        wrong.is_empty(),
        "the item went to the deleted epoch-1 tab, which replaced the epoch-2 one: {wrong:?}"
    );
}
