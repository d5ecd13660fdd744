//! An adversarial review of Redis record layout 2 (the task's hash holds
//! `h`, `doc`, `n`, `s:<i>`, `fence`, `cancel`, `c:<claim>`; a write sends
//! only the steps that changed), alone and side by side with layout 1.
//! Each test is a hypothesis of how data could be lost or corrupted, a
//! step run twice, a cancellation missed or a key left behind, tried
//! against a private redis-server.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::TestRedis;
use common::Journal;
use saga_runtime::backend::redis::RedisBackend;
use saga_runtime::backend::{QueueMessage, TaskStore};
use saga_runtime::prelude::*;
use saga_runtime::{DeadLetterFilter, TaskFilter};
use tokio::sync::Notify;
use tokio::time::Instant;

// ---- Sagas

/// Three steps; step 2 hangs while `hold` says so (a worker to kill in
/// the middle of it), or fails for good while `fail` says so (a task for
/// the dead letters). Every run of a step body is journaled (`s<k>:<n>`).
#[derive(Clone, Default)]
struct Chain {
    journal: Journal,
    hold: Arc<AtomicBool>,
    fail: Arc<AtomicBool>,
    entered: Arc<Notify>,
}

fn flag(f: &AtomicBool) -> bool {
    f.load(SeqCst)
}

#[saga(name = "chain")]
impl Chain {
    #[saga_step(1)]
    async fn s1(&self, n: u64) -> Result<u64, StepError> {
        self.journal.record(format!("s1:{n}"));
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(n + 1)
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 0, on_exhausted = dead_letter)]
    async fn s2(&self, n: u64) -> Result<u64, StepError> {
        self.journal.record(format!("s2:{n}"));
        if flag(&self.hold) {
            self.entered.notify_one();
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        if flag(&self.fail) {
            return Err(StepError::permanent("needs an operator"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(n * 10)
    }

    #[saga_step(3)]
    async fn s3(&self, n: u64) -> Result<u64, StepError> {
        self.journal.record(format!("s3:{n}"));
        Ok(n + 7)
    }
}

/// Asserts a finished chain task is whole: completed, every step's output
/// and the task's output right.
fn assert_chain(task: &TaskInstance, input: u64) {
    assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
    let want = [input + 1, (input + 1) * 10, (input + 1) * 10 + 7];
    assert_eq!(task.steps.len(), 3);
    for (i, step) in task.steps.iter().enumerate() {
        assert_eq!(step.status, StepStatus::Completed, "step {i}: {task:#?}");
        assert_eq!(
            step.output.as_ref().and_then(|o| o.as_u64()),
            Some(want[i]),
            "step {i}"
        );
    }
    assert_eq!(task.output.as_ref().and_then(|o| o.as_u64()), Some(want[2]));
}

/// Two steps; the second waits until its cancellation is signalled (for
/// an input of 0 it returns at once).
#[derive(Clone, Default)]
struct Waiter {
    entered: Arc<Notify>,
}

#[cancellable]
#[saga(name = "waiter")]
impl Waiter {
    #[saga_step(1)]
    async fn reserve(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }

    #[compensate(reserve)]
    async fn release(&self, _n: u64) -> Result<(), StepError> {
        Ok(())
    }

    #[saga_step(2, timeout_ms = 7_200_000)]
    async fn work(&self, n: u64, ctx: &StepContext) -> Result<u64, StepError> {
        if n == 0 {
            return Ok(n);
        }
        self.entered.notify_one();
        tokio::select! {
            _ = ctx.cancelled() => Err(StepError::permanent("aborted")),
            _ = tokio::time::sleep(Duration::from_secs(3600)) => Ok(n),
        }
    }
}

/// One step that fails, and is retried a minute later.
#[derive(Clone, Default)]
struct Flaky {
    journal: Journal,
}

#[cancellable]
#[saga(name = "flaky")]
impl Flaky {
    #[saga_step(1)]
    #[retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 60000)]
    async fn call(&self, _n: u64) -> Result<u64, StepError> {
        self.journal.record("call");
        Err(StepError::transient("upstream 503"))
    }
}

// ---- Helpers

/// Waits until task `id` reads `status` (errors, while Redis restarts,
/// are ridden out).
async fn reach(engine: &Engine, id: TaskId, status: TaskStatus) -> TaskInstance {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(task)) = engine.task(id).await {
            if task.status == status {
                return task;
            }
            assert!(
                Instant::now() < deadline,
                "task {id} is {:?}, not {status:?}: {task:#?}",
                task.status
            );
        }
        assert!(Instant::now() < deadline, "task {id} never read");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The fields of task `id`'s hash (one partition: `{saga:0}`).
fn fields(redis: &TestRedis, id: TaskId) -> HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(format!("saga:{{saga:0}}:task:{id}"))
        .query(&mut redis.conn())
        .unwrap()
}

/// Whether key `name` of task `id` (`cancel`, `fence`, `claims`) exists:
/// layout 1 keeps those apart.
fn own_key(redis: &TestRedis, name: &str, id: TaskId) -> bool {
    let n: u64 = redis::cmd("EXISTS")
        .arg(format!("saga:{{saga:0}}:{name}:{id}"))
        .query(&mut redis.conn())
        .unwrap();
    n == 1
}

/// Every trace of task `id` left in the store: keys naming it, and
/// members naming it in any sorted set (indexes, expiring, delayed).
fn traces(redis: &TestRedis, id: TaskId) -> Vec<String> {
    let id = id.to_string();
    let mut conn = redis.conn();
    let mut found = Vec::new();
    for key in redis.keys() {
        if key.contains(&id) {
            found.push(key.clone());
            continue;
        }
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
        if kind == "zset" {
            let members: Vec<String> = redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query(&mut conn)
                .unwrap();
            if members.iter().any(|m| m.contains(&id)) {
                found.push(format!("{key} (member)"));
            }
        }
    }
    found
}

/// Task `id` as `engine`'s listing of `saga` shows it.
async fn listed(engine: &Engine, saga: &str, id: TaskId) -> TaskInstance {
    let page = engine.tasks(TaskFilter::new().saga(saga)).await.unwrap();
    page.tasks.into_iter().find(|t| t.id == id).expect("listed")
}

/// The id of task `id`'s dead letter.
async fn letter_of(engine: &Engine, id: TaskId) -> String {
    let page = engine.dead_letters(DeadLetterFilter::new()).await.unwrap();
    let letter = page.letters.into_iter().find(|l| l.task_id == Some(id));
    letter.expect("the task's dead letter").id
}

/// A runtime of its own (one to shut down under a worker, as SIGKILL).
fn runtime(threads: usize) -> tokio::runtime::Runtime {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap()
}

/// Waits for `entered` (a step signals it started).
async fn started(entered: &Notify) {
    tokio::time::timeout(Duration::from_secs(10), entered.notified())
        .await
        .expect("the step started");
}

async fn wait_gone(redis: &TestRedis, ids: &[TaskId]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<String> = ids.iter().flat_map(|id| traces(redis, *id)).collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Records what an engine of a version before layout 2 leaves: the key
/// layout, no record layout (the deployment writes layout 1).
fn as_an_old_deployment(redis: &TestRedis) {
    let _: () = redis::cmd("SET")
        .arg("saga:layout")
        .arg("1")
        .query(&mut redis.conn())
        .unwrap();
}

// ---- 1. Retention: a finished layout-2 task leaves nothing behind.

/// Hypothesis: layout 2 expires two keys (record, audit log) where layout
/// 1 expired five. A field or key written after the task ended (a
/// cancellation requested of a finished task, a stale message taking a
/// lease and bumping the fence) could outlive it, or recreate a hash
/// without TTL. Here: a task cancelled while running, one completed and
/// then asked to cancel, each gone with every trace after its retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_layout_2_task_leaves_no_trace_after_its_retention() {
    let redis = TestRedis::start();
    let waiter = Waiter::default();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .saga(waiter.clone())
        .retention(Some(Duration::from_millis(1500)))
        .housekeeping_interval(Duration::from_millis(100))
        .workers(1)
        .build()
        .await
        .unwrap();
    let cancelled = engine.start::<Waiter>(1).await.unwrap();
    started(&waiter.entered).await;
    let answer = engine.cancel::<Waiter>(cancelled).await.unwrap();
    assert_eq!(answer, CancelResult::Cancelled);
    let stored = fields(&redis, cancelled);
    assert!(stored.contains_key("n") && stored.contains_key("cancel"));
    for name in ["cancel", "fence", "claims"] {
        assert!(!own_key(&redis, name, cancelled), "layout 2: no {name} key");
    }
    reach(&engine, cancelled, TaskStatus::Cancelled).await;

    // A task that completes, then is asked to cancel.
    let done = engine.start::<Waiter>(0).await.unwrap();
    reach(&engine, done, TaskStatus::Completed).await;
    // Once it ended: a late cancellation request (what a request racing
    // the end writes) and a stale message's lease (the fence bumped).
    let backend = redis.backend().await;
    let wake = QueueMessage {
        task_id: done,
        saga: "waiter".to_owned(),
        seq: 1,
    };
    backend.request_cancel(done, "late", &wake).await.unwrap();
    // (The wake-up message may hold the lease a moment: take it after.)
    let locked = loop {
        let ttl = Duration::from_secs(5);
        match backend.lock_and_load(done, ttl).await.unwrap() {
            Some(locked) => break locked,
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    assert!(backend.unlock(&locked.lease).await.unwrap());
    assert!(fields(&redis, done).contains_key("cancel"));
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("saga:{{saga:0}}:task:{done}"))
        .query(&mut redis.conn())
        .unwrap();
    assert!(ttl > 0, "the ended record expires: PTTL {ttl}");
    wait_gone(&redis, &[cancelled, done]).await;
    engine.shutdown().await;
}

// ---- 2. A cancellation while a layout-2 task waits out a retry's backoff.

/// Hypothesis: the flag is a field of the record in layout 2; the wake-up
/// message's handling (or the commit's "a cancelled task's retry goes out
/// now") reads it somewhere only layout 1 is looked at, and the accepted
/// cancellation waits out the minute-long backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_a_delayed_retry_ends_a_layout_2_task_at_once() {
    let redis = TestRedis::start();
    let flaky = Flaky::default();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .saga(flaky.clone())
        .workers(1)
        .build()
        .await
        .unwrap();
    let id = engine.start::<Flaky>(1).await.unwrap();
    // The first attempt failed and its retry is a minute away.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let delayed = traces(&redis, id).iter().any(|t| t.contains("delayed"));
        if flaky.journal.count("call") == 1 && delayed {
            break;
        }
        assert!(Instant::now() < deadline, "the retry was never scheduled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(fields(&redis, id).contains_key("n"), "layout 2");
    let answer = engine.cancel::<Flaky>(id).await.unwrap();
    assert_eq!(answer, CancelResult::Cancelled);
    let task = reach(&engine, id, TaskStatus::Cancelled).await;
    assert!(task.cancelled_at.is_some());
    assert_eq!(flaky.journal.count("call"), 1, "no retry ran");
    engine.shutdown().await;
}

// ---- 3. Both layouts side by side: cancel, run, expire.

/// Hypothesis: with both layouts live (a deployment just switched, one
/// engine switched and one that has not looked again), the control
/// state lands in the wrong place: a cancellation flag written where the
/// record's layout does not look (a layout-1 record given a `cancel`
/// field, a layout-2 record a `cancel:<id>` key), so the worker never
/// sees it; or the retention of one layout leaves the other's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_layouts_side_by_side_cancel_and_expire_whole() {
    let redis = TestRedis::start();
    as_an_old_deployment(&redis);
    let waiter = Waiter::default();
    let build = || async {
        Engine::builder()
            .backend(redis.backend().await)
            .saga(waiter.clone())
            .retention(Some(Duration::from_millis(1500)))
            .housekeeping_interval(Duration::from_millis(100))
            .workers(2)
            .build()
            .await
            .unwrap()
    };
    let stale = build().await;
    let old = stale.start::<Waiter>(1).await.unwrap();
    started(&waiter.entered).await;
    let operator = RedisBackend::connect(&redis.url()).await.unwrap();
    operator.write_steps_apart().await.unwrap();
    // An engine connected after the switch writes layout 2; the first one
    // has not looked again (for up to 10 s) and still writes layout 1.
    let fresh = build().await;
    let new = fresh.start::<Waiter>(2).await.unwrap();
    started(&waiter.entered).await;
    let old_again = stale.start::<Waiter>(3).await.unwrap();
    started(&waiter.entered).await;
    assert_eq!(fields(&redis, old).get("n"), None, "layout 1");
    assert_eq!(fields(&redis, old_again).get("n"), None, "not looked again");
    assert_eq!(fields(&redis, new).get("n").map(String::as_str), Some("2"));

    // Each cancelled through the engine that did not create it.
    for (engine, id) in [(&fresh, old), (&stale, new), (&fresh, old_again)] {
        let answer = engine.cancel::<Waiter>(id).await.unwrap();
        assert_eq!(answer, CancelResult::Cancelled);
    }
    for id in [old, old_again] {
        assert!(!fields(&redis, id).contains_key("cancel") && own_key(&redis, "cancel", id));
    }
    assert!(fields(&redis, new).contains_key("cancel"));
    assert!(!own_key(&redis, "cancel", new));
    for id in [old, new, old_again] {
        let task = reach(&stale, id, TaskStatus::Cancelled).await;
        assert_eq!(task.steps.len(), 2);
        assert_eq!(task.steps[0].status, StepStatus::Compensated, "{task:#?}");
        assert_eq!(listed(&fresh, "waiter", id).await.steps, task.steps);
    }
    wait_gone(&redis, &[old, new, old_again]).await;
    stale.shutdown().await;
    fresh.shutdown().await;
}

// ---- 4. A worker killed between writes.

/// Hypothesis: a worker that goes on with its task writes step 1's
/// outcome with step 2's attempt (only the changed steps); killed in
/// step 2, the next worker loads a record put together from fields
/// written at different times: a step could be missing, stale (step 1
/// run again), or step 2's attempt lost (its claim reused).
///
/// The worker runs on a runtime of its own, shut down without letting
/// anything finish: what a SIGKILL leaves (a lease to expire, a message
/// pending), minus the process.
#[test]
fn a_worker_killed_between_writes_loses_no_step_and_runs_none_again() {
    let redis = TestRedis::start();
    let chain = Chain::default();
    chain.hold.store(true, SeqCst);
    let (doomed, main) = (runtime(1), runtime(2));
    let build = |chain: Chain| {
        let redis = &redis;
        async move {
            Engine::builder()
                .backend(redis.backend().await)
                .saga(chain)
                .lock_ttl(Duration::from_millis(1000))
                .workers(1)
                .build()
                .await
                .unwrap()
        }
    };
    let first = doomed.block_on(build(chain.clone()));
    let id = doomed.block_on(first.start::<Chain>(4)).unwrap();
    main.block_on(started(&chain.entered));
    let before = fields(&redis, id);
    assert_eq!(before.get("n").map(String::as_str), Some("3"), "{before:?}");
    doomed.shutdown_background();
    std::mem::forget(first);

    chain.hold.store(false, SeqCst);
    main.block_on(async {
        let second = build(chain.clone()).await;
        let task = reach(&second, id, TaskStatus::Completed).await;
        assert_chain(&task, 4);
        assert_eq!(chain.journal.count("s1:4"), 1, "step 1 ran again");
        assert_eq!(chain.journal.count("s2:5"), 2, "step 2: killed, then once");
        assert_eq!(chain.journal.count("s3:50"), 1);
        // Step 2's attempts: the killed one and the one that completed,
        // each under its own number.
        assert_eq!(task.steps[1].attempt_count, 2, "{task:#?}");
        second.shutdown().await;
    });
}

// ---- 5. Redis restarted (AOF) mid-run.

/// Hypothesis: a write whose reply is lost to a restart is retried
/// (`persist`, `Landed::ReplyLost`); if the snapshot of stored steps is
/// then taken for a write that did not land (or the other way round), a
/// later write leaves a changed step out, and the record mixes steps of
/// two versions.
#[test]
fn a_redis_restart_mid_run_leaves_every_layout_2_task_whole() {
    let mut redis = TestRedis::start();
    let chain = Chain::default();
    let rt = runtime(2);
    let engine = rt.block_on(async {
        Engine::builder()
            .backend(redis.backend().await)
            .saga(chain.clone())
            .lock_ttl(Duration::from_millis(1500))
            .workers(4)
            .build()
            .await
            .unwrap()
    });
    let inputs: Vec<u64> = (100..140).collect();
    let ids: Vec<TaskId> = inputs
        .iter()
        .map(|n| rt.block_on(engine.start::<Chain>(*n)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(60));
    let status = |id: &TaskId| fields(&redis, *id).get("status").cloned();
    let done = ids
        .iter()
        .filter(|id| status(id).as_deref() == Some("Completed"));
    assert!(done.count() < ids.len(), "the restart came after the run");
    redis.restart();
    rt.block_on(async {
        for (id, n) in ids.iter().zip(&inputs) {
            let task = reach(&engine, *id, TaskStatus::Completed).await;
            assert_chain(&task, *n);
            let stored = fields(&redis, *id);
            assert_eq!(stored.get("n").map(String::as_str), Some("3"));
        }
        engine.shutdown().await;
    });
}

// ---- 6. Operator: a dead-lettered layout-2 task requeued.

/// Hypothesis: the operator's requeue writes the task under a lease of
/// its own, from a copy loaded by `lock_and_load`; its write (and the
/// worker's after it) send only the steps that changed against that
/// copy's snapshot. A step the park changed but the snapshot misses
/// would keep its parked state; the task would run step 2 again from a
/// stale record, or read differently through `task`, `tasks` and `wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_layout_2_task_resumes_whole_and_reads_the_same_everywhere() {
    let redis = TestRedis::start();
    let chain = Chain::default();
    chain.fail.store(true, SeqCst);
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .saga(chain.clone())
        .workers(1)
        .build()
        .await
        .unwrap();
    let id = engine.start::<Chain>(8).await.unwrap();
    let parked = reach(&engine, id, TaskStatus::DeadLettered).await;
    assert_eq!(parked.steps[0].status, StepStatus::Completed);
    assert_eq!(chain.journal.count("s2:9"), 1);
    chain.fail.store(false, SeqCst);
    engine.requeue(&letter_of(&engine, id).await).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(10), engine.wait(id))
        .await
        .expect("finished")
        .unwrap();
    assert_chain(&waited, 8);
    assert_eq!(chain.journal.count("s1:8"), 1, "step 1 ran again");
    assert_eq!(chain.journal.count("s2:9"), 2);
    let loaded = engine.task(id).await.unwrap().unwrap();
    for task in [&loaded, &listed(&engine, "chain", id).await] {
        assert_chain(task, 8);
        assert_eq!(task.steps, waited.steps);
        assert_eq!(task.version, waited.version);
    }
    // Every stored step is the one read; no stray step field.
    let stored = fields(&redis, id);
    let step_fields: Vec<&String> = stored.keys().filter(|k| k.starts_with("s:")).collect();
    assert_eq!(step_fields.len(), 3, "{step_fields:?}");
    engine.shutdown().await;
}

// ---- 7. A write's reply lost, the write tried again.

/// A TCP proxy to Redis that, when armed, forwards a client's chunk
/// containing `needle` and forwards no reply on that connection after it:
/// the write lands, its reply is lost (the client sees the link close).
mod cut {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
    use tokio::net::{TcpListener, TcpStream};

    /// `armed`: how many more connections to cut; `cut`: cut so far.
    pub struct Proxy {
        pub port: u16,
        pub armed: Arc<AtomicUsize>,
        pub cut: Arc<AtomicUsize>,
    }

    /// Copies `r` to `w`; `needle` (upstream only) cuts the connection:
    /// `cut` is set before the chunk goes up, and the way down stops.
    /// What to look for, how many more to cut, how many were cut.
    type Needle = (Arc<Vec<u8>>, Arc<AtomicUsize>, Arc<AtomicUsize>);

    async fn pipe(
        mut r: OwnedReadHalf,
        mut w: OwnedWriteHalf,
        needle: Option<Needle>,
        cut: Arc<AtomicBool>,
    ) {
        let mut buf = vec![0u8; 256 * 1024];
        while let Ok(n @ 1..) = r.read(&mut buf).await {
            match &needle {
                Some((needle, armed, count)) => {
                    let hit = buf[..n].windows(needle.len()).any(|w| w == &needle[..]);
                    if hit
                        && armed
                            .fetch_update(SeqCst, SeqCst, |a| a.checked_sub(1))
                            .is_ok()
                    {
                        cut.store(true, SeqCst);
                        count.fetch_add(1, SeqCst);
                    }
                }
                None if cut.load(SeqCst) => return,
                None => {}
            }
            if w.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    pub async fn start(redis: u16, needle: &[u8]) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicUsize::new(0));
        let count = Arc::new(AtomicUsize::new(0));
        let spec = (Arc::new(needle.to_vec()), armed.clone(), count.clone());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", redis)).await else {
                    return;
                };
                let cut = Arc::new(AtomicBool::new(false));
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                tokio::spawn(pipe(ri, wo, Some(spec.clone()), cut.clone()));
                tokio::spawn(pipe(ro, wi, None, cut));
            }
        });
        Proxy {
            port,
            armed,
            cut: count,
        }
    }
}

/// Hypothesis: a write lands and its reply is lost; `persist` tries
/// again, is refused with the version one past its own and takes the
/// write as landed (`Landed::ReplyLost`), saving the snapshot of steps
/// under that version. If the snapshot were wrong, the next writes would
/// leave a changed step out (step 1 stored as Running, step 2's outcome
/// lost), or run a step again. `needle`: what only the write to cut
/// carries (a step's output in its stored record); `attempts`: the steps'
/// attempt counts expected. The write landed and was taken as ours: one
/// version more than a run without the cut (5), and the attempt it
/// recorded counted as not won (its step skips to attempt 2), unless the
/// write cut was the commit.
async fn a_lost_reply(needle: &str, version: u64, attempts: [u32; 3]) {
    let redis = TestRedis::start();
    let proxy = cut::start(redis.port(), needle.as_bytes()).await;
    let chain = Chain::default();
    let config = saga_runtime::backend::redis::RedisConfig {
        visibility_timeout: Duration::from_millis(800),
        block: Duration::from_millis(100),
        ..Default::default()
    };
    let url = format!("redis://127.0.0.1:{}/", proxy.port);
    let engine = Engine::builder()
        .backend(RedisBackend::connect_with(&url, config).await.unwrap())
        .saga(chain.clone())
        .workers(1)
        .build()
        .await
        .unwrap();
    // A first task loads every script: the cut must hit a write Redis
    // runs, not an `EVALSHA` refused with `NOSCRIPT`.
    let warm = engine.start::<Chain>(5).await.unwrap();
    reach(&engine, warm, TaskStatus::Completed).await;
    proxy.armed.store(1, SeqCst);
    let id = engine.start::<Chain>(6).await.unwrap();
    let task = reach(&engine, id, TaskStatus::Completed).await;
    assert_eq!(proxy.cut.load(SeqCst), 1);
    assert_chain(&task, 6);
    let counts: Vec<u32> = task.steps.iter().map(|s| s.attempt_count).collect();
    assert_eq!((task.version, counts), (version, attempts.to_vec()));
    // Read straight from the store, not through the engine's copy.
    let stored = fields(&redis, id);
    for i in 0..3 {
        let step: serde_json::Value = serde_json::from_str(&stored[&format!("s:{i}")]).unwrap();
        assert_eq!(step["status"], "Completed", "s:{i}: {step}");
    }
    for step in ["s1:6", "s2:7", "s3:70"] {
        assert_eq!(chain.journal.count(step), 1, "{step} ran again");
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_of_a_write_that_goes_on_leaves_the_record_whole() {
    a_lost_reply(r#""output":7,"#, 6, [1, 2, 1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_of_the_second_write_leaves_the_record_whole() {
    a_lost_reply(r#""output":70,"#, 6, [1, 1, 2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_of_the_commit_leaves_the_record_whole() {
    a_lost_reply(r#""output":77,"#, 5, [1, 1, 1]).await;
}

// ---- 8. A layout-1 task parked before the switch, requeued after it.

/// Hypothesis: a record keeps the layout it was created in, but a copy
/// made by an engine that writes layout 2 (the requeue's lease, then the
/// worker's) could write it in the deployment's layout instead: a `doc`
/// without steps over a record without `n`, or `s:<i>` fields beside a
/// whole `doc`; and its retention could expire two keys where the record
/// has five.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_1_task_requeued_after_the_switch_stays_whole_in_layout_1() {
    let redis = TestRedis::start();
    as_an_old_deployment(&redis);
    let chain = Chain::default();
    chain.fail.store(true, SeqCst);
    let build = || async {
        Engine::builder()
            .backend(redis.backend().await)
            .saga(chain.clone())
            .retention(Some(Duration::from_millis(1500)))
            .housekeeping_interval(Duration::from_millis(100))
            .workers(1)
            .build()
            .await
            .unwrap()
    };
    let old = build().await;
    let id = old.start::<Chain>(3).await.unwrap();
    reach(&old, id, TaskStatus::DeadLettered).await;
    assert!(!fields(&redis, id).contains_key("n"), "layout 1");
    old.shutdown().await;

    let operator = RedisBackend::connect(&redis.url()).await.unwrap();
    operator.write_steps_apart().await.unwrap();
    let new = build().await;
    chain.fail.store(false, SeqCst);
    new.requeue(&letter_of(&new, id).await).await.unwrap();
    let task = reach(&new, id, TaskStatus::Completed).await;
    assert_chain(&task, 3);
    assert_eq!(chain.journal.count("s1:3"), 1, "step 1 ran again");
    let stored = fields(&redis, id);
    let apart = |k: &String| ["n", "h", "fence", "cancel"].contains(&k.as_str()) || k.contains(':');
    assert!(
        !stored.keys().any(apart),
        "still layout 1: {:?}",
        stored.keys()
    );
    let whole: TaskInstance = serde_json::from_str(&stored["doc"]).unwrap();
    assert_eq!(whole.steps, task.steps);
    assert!(own_key(&redis, "fence", id) && own_key(&redis, "claims", id));
    // A task started now is created in layout 2, beside it.
    let next = new.start::<Chain>(30).await.unwrap();
    assert_chain(&reach(&new, next, TaskStatus::Completed).await, 30);
    assert_eq!(fields(&redis, next).get("n").map(String::as_str), Some("3"));
    wait_gone(&redis, &[id, next]).await;
    new.shutdown().await;
}

// ---- 9. Cancellation found by the heartbeat alone.

/// Hypothesis: a cancellation whose announcement is missed (the pub/sub
/// link was down; no wake-up) is found by the running step's heartbeat,
/// which reads the flag where layout 1 kept it: a layout-2 task would
/// run on. The flag is set straight in the record, as `cancel.lua` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_finds_a_layout_2_cancellation_missed_by_its_announcement() {
    let redis = TestRedis::start();
    let waiter = Waiter::default();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .saga(waiter.clone())
        .lock_ttl(Duration::from_millis(900))
        .workers(1)
        .build()
        .await
        .unwrap();
    let id = engine.start::<Waiter>(4).await.unwrap();
    started(&waiter.entered).await;
    let at = std::time::SystemTime::UNIX_EPOCH
        .elapsed()
        .unwrap()
        .as_millis();
    let _: () = redis::cmd("HSET")
        .arg(format!("saga:{{saga:0}}:task:{id}"))
        .arg("cancel")
        .arg(format!("{at}|silent"))
        .query(&mut redis.conn())
        .unwrap();
    let task = reach(&engine, id, TaskStatus::Cancelled).await;
    assert_eq!(task.steps[0].status, StepStatus::Compensated, "{task:#?}");
    engine.shutdown().await;
}
