//! Hardening: faults an adversarial review of the execution core found,
//! each reproduced against a real redis-server (private per test) before
//! it was fixed. Each test states the failure it guards against.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use redis::Value;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use saga_runtime::TaskFilter;
use sagas_tests::double::Double;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

const QUEUE: &str = "saga:{saga:0}:queue";

async fn backend_with(redis: &TestRedis, config: RedisConfig) -> RedisBackend {
    RedisBackend::connect_with(&redis.url(), config)
        .await
        .unwrap()
}

async fn backend(redis: &TestRedis, visibility: Duration) -> RedisBackend {
    backend_with(
        redis,
        RedisConfig {
            visibility_timeout: visibility,
            block: Duration::from_millis(200),
            ..RedisConfig::default()
        },
    )
    .await
}

async fn wait_until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits for a terminal status with a deadline; panics with the task's
/// state (and the dead letters) if it does not get there.
async fn finish(engine: &Engine, id: TaskId, within: Duration) -> TaskInstance {
    match tokio::time::timeout(within, engine.wait(id)).await {
        Ok(Ok(task)) => task,
        Ok(Err(e)) => panic!(
            "wait({id}) failed: {e:?}; dead letters: {:#?}",
            engine.dead_letters(Default::default()).await
        ),
        Err(_) => {
            let t = engine.task(id).await.unwrap();
            panic!(
                "task {id} did not finish within {within:?}: status {:?}, steps {:#?}, audit {:#?}",
                t.as_ref().map(|t| t.status),
                t.as_ref().map(|t| &t.steps),
                t.as_ref().map(|t| &t.audit_log)
            )
        }
    }
}

// ---------------------------------------------------------------------------
// 1. Retention: the janitor purges a keyed task's NEW incarnation.
// ---------------------------------------------------------------------------

struct Keyed {
    slow: Arc<AtomicBool>,
}

#[saga(name = "keyed")]
impl Keyed {
    #[saga_step(1)]
    async fn work(&self, n: u32) -> Result<u32, StepError> {
        if self.slow.load(SeqCst) {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        Ok(n)
    }
}

/// Hypothesis: `start_with_key` after the first task's record expired (but
/// before the janitor ran) creates a new task under the same id; the
/// janitor then finds the old `expiring` member (`id|Completed|keyed`, due)
/// and PURGE deletes every key of the *new*, running task (record, fence,
/// lock, claims, index entries). The task vanishes mid-flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_keyed_restart_after_expiry_is_purged_by_the_janitor() {
    let redis = TestRedis::start();
    let slow = Arc::new(AtomicBool::new(false));
    let engine = Engine::builder()
        .backend(backend(&redis, Duration::from_secs(2)).await)
        .saga(Keyed { slow: slow.clone() })
        .retention(Some(Duration::from_millis(300)))
        // This engine's janitor never runs during the test.
        .housekeeping_interval(Duration::from_secs(3600))
        .workers(1)
        .build()
        .await
        .unwrap();
    let first = engine.start_with_key::<Keyed>("order-1", 7).await.unwrap();
    let done = finish(&engine, first, Duration::from_secs(10)).await;
    assert_eq!(done.status, TaskStatus::Completed);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        engine.task(first).await.unwrap().is_none(),
        "the record expired"
    );

    // The same key again: a new task (the old one is gone), slow this time.
    slow.store(true, SeqCst);
    let second = engine.start_with_key::<Keyed>("order-1", 7).await.unwrap();
    assert_eq!(second, first, "a keyed id is deterministic");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let t = engine.task(second).await.unwrap().unwrap();
        if t.status == TaskStatus::Running {
            break;
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Another process's janitor runs now (its first pass after 100 ms).
    let _janitor = Engine::builder()
        .backend(backend(&redis, Duration::from_secs(2)).await)
        .saga(Keyed { slow: slow.clone() })
        .retention(Some(Duration::from_millis(300)))
        .housekeeping_interval(Duration::from_millis(100))
        .workers(1)
        .build()
        .await
        .unwrap();
    let task = finish(&engine, second, Duration::from_secs(10)).await;
    assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
}

// ---------------------------------------------------------------------------
// 2. Paging stops at expired-but-not-yet-purged index entries.
// ---------------------------------------------------------------------------

struct Hole;

#[saga(name = "hole")]
impl Hole {
    #[saga_step(1)]
    #[retry_policy(max_retries = 0, backoff = constant, base_delay_ms = 0, on_exhausted = dead_letter)]
    async fn work(&self, n: u32) -> Result<u32, StepError> {
        if n == 0 {
            return Err(StepError::permanent("needs an operator"));
        }
        Ok(n)
    }
}

/// Hypothesis: `list_partition` fetches `limit` ids from the index and
/// *then* drops those whose record has expired (the janitor removes their
/// index entries only on its next pass). A page that comes back short is
/// taken for the last page (`next: None`), so every older task is hidden.
/// Here: an old `DeadLettered` task (kept for an operator) disappears from
/// the listing behind three newer tasks whose 300 ms retention just ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_does_not_stop_at_expired_index_entries() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(backend(&redis, Duration::from_secs(2)).await)
        .saga(Hole)
        .retention(Some(Duration::from_millis(300)))
        .attention_retention(None)
        .housekeeping_interval(Duration::from_secs(3600))
        .workers(1)
        .build()
        .await
        .unwrap();
    let parked = engine.start::<Hole>(0).await.unwrap();
    assert_eq!(
        finish(&engine, parked, Duration::from_secs(10))
            .await
            .status,
        TaskStatus::DeadLettered
    );
    for n in 1..=3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let id = engine.start::<Hole>(n).await.unwrap();
        finish(&engine, id, Duration::from_secs(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;

    let mut seen = Vec::new();
    let mut filter = TaskFilter::new().saga("hole").limit(2);
    let mut pages = 0;
    loop {
        let page = engine.tasks(filter.clone()).await.unwrap();
        pages += 1;
        seen.extend(page.tasks.iter().map(|t| t.id));
        match page.next {
            Some(next) => filter = filter.after(next),
            None => break,
        }
    }
    let all = engine.tasks_of("hole").await.unwrap();
    assert!(
        seen.contains(&parked),
        "the DeadLettered task is not listed: {pages} page(s), {seen:?}; tasks_of: {} task(s)",
        all.len()
    );
}

// ---------------------------------------------------------------------------
// 3. Cancellation does not wake a task whose retry was scheduled just then.
// ---------------------------------------------------------------------------

struct FailOnSignal {
    entered: Arc<Notify>,
    fail: Arc<Notify>,
}

#[saga(name = "fail-on-signal")]
#[cancellable]
impl FailOnSignal {
    #[saga_step(1)]
    #[retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 30000)]
    async fn call(&self, _n: u32) -> Result<u32, StepError> {
        self.entered.notify_one();
        self.fail.notified().await;
        Err(StepError::transient("upstream 503"))
    }
}

/// Hypothesis: `cancel` builds its wake-up message with the `seq` it read
/// *before* recording the request, and a commit that schedules a retry is
/// not checked against the cancellation flag. A step that fails after the
/// request is recorded but before the worker hears of it (the pub/sub
/// notice is best effort; the heartbeat polls once a second) schedules its
/// retry with `seq + 1`; the wake-up (old `seq`) is dropped as stale, and
/// the accepted cancellation waits for the whole backoff (30 s here; hours
/// in production).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_racing_a_failed_attempt_still_wakes_the_task() {
    let redis = TestRedis::start();
    let entered = Arc::new(Notify::new());
    let fail = Arc::new(Notify::new());
    let saga = || FailOnSignal {
        entered: entered.clone(),
        fail: fail.clone(),
    };
    let _worker = Engine::builder()
        .backend(backend(&redis, Duration::from_secs(15)).await)
        .saga(saga())
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(1)
        .build()
        .await
        .unwrap();
    // An API process: starts and cancels, runs no workers.
    let api = Engine::builder()
        .backend(backend(&redis, Duration::from_secs(15)).await)
        .saga(saga())
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = api.start::<FailOnSignal>(1).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), entered.notified())
        .await
        .expect("the step started");
    // The best-effort notice is unavailable for a moment (a dropped
    // subscriber connection; it resubscribes after a second).
    let _: Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut redis.conn())
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = api.cancel::<FailOnSignal>(id).await.unwrap();
    assert_eq!(answer, CancelResult::Cancelled);
    // The upstream call fails right after.
    fail.notify_one();
    let task = finish(&api, id, Duration::from_secs(8)).await;
    assert_eq!(task.status, TaskStatus::Cancelled, "{task:#?}");
}

// ---------------------------------------------------------------------------
// 4. Two workers run one task at once across a network partition.
// ---------------------------------------------------------------------------

mod proxy {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A TCP proxy that can freeze: bytes stop flowing both ways, the
    /// sockets stay open (a partition, not a reset).
    pub struct Proxy {
        pub port: u16,
        pub frozen: Arc<AtomicBool>,
    }

    async fn pipe(
        mut r: tokio::net::tcp::OwnedReadHalf,
        mut w: tokio::net::tcp::OwnedWriteHalf,
        frozen: Arc<AtomicBool>,
    ) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            while frozen.load(SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if w.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen = Arc::new(AtomicBool::new(false));
        let f = frozen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                let f = f.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::spawn(pipe(ri, wo, f.clone()));
                    tokio::spawn(pipe(ro, wi, f));
                });
            }
        });
        Proxy { port, frozen }
    }
}

struct Exclusive {
    running: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
    entered: Arc<AtomicUsize>,
    log: Arc<std::sync::Mutex<Vec<(Instant, &'static str)>>>,
}

struct Leave(
    Arc<AtomicUsize>,
    Arc<std::sync::Mutex<Vec<(Instant, &'static str)>>>,
);

impl Drop for Leave {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
        self.1.lock().unwrap().push((Instant::now(), "left"));
    }
}

#[saga(name = "exclusive")]
impl Exclusive {
    #[saga_step(1, timeout_ms = 120000)]
    #[retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 0)]
    async fn hold(&self, n: u32) -> Result<u32, StepError> {
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.max.fetch_max(now, SeqCst);
        self.log.lock().unwrap().push((Instant::now(), "entered"));
        let _leave = Leave(self.running.clone(), self.log.clone());
        self.entered.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_secs(40)).await;
        Ok(n)
    }
}

/// Hypothesis: the heartbeat decides to abandon a step only when a
/// heartbeat call *returns* an error, and measures the lease from when a
/// reply *arrived*. Under a partition (no reset: every call hangs until the
/// 5 s response timeout) the last check before the lease runs out is
/// skipped: with the defaults (15 s lease, 1 s tick, 5 s response timeout)
/// the step is dropped ~18 s after the last renewal, while the lease
/// expired at 15 s and the message became claimable at 15 s. Another
/// worker runs the same task meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_worker_stops_before_another_takes_over() {
    let redis = TestRedis::start();
    let proxy = proxy::start(redis.port()).await;
    let running = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let saga = || Exclusive {
        running: running.clone(),
        max: max.clone(),
        entered: entered.clone(),
        log: log.clone(),
    };
    // Every setting at its default.
    let client = Engine::builder()
        .backend(backend_with(&redis, RedisConfig::default()).await)
        .saga(saga())
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = client.start::<Exclusive>(1).await.unwrap();
    let partitioned = Engine::builder()
        .backend(
            RedisBackend::connect_with(
                &format!("redis://127.0.0.1:{}/", proxy.port),
                RedisConfig::default(),
            )
            .await
            .unwrap(),
        )
        .saga(saga())
        .workers(1)
        .build()
        .await
        .unwrap();
    wait_until("the first worker's step", Duration::from_secs(10), || {
        entered.load(SeqCst) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let frozen_at = Instant::now();
    proxy.frozen.store(true, SeqCst);
    let _survivor = Engine::builder()
        .backend(backend_with(&redis, RedisConfig::default()).await)
        .saga(saga())
        .workers(1)
        .build()
        .await
        .unwrap();
    wait_until("the takeover", Duration::from_secs(40), || {
        entered.load(SeqCst) == 2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let events: Vec<(u128, &str)> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(t, e)| (t.saturating_duration_since(frozen_at).as_millis(), *e))
        .collect();
    drop(partitioned);
    drop(client);
    let _ = id;
    assert_eq!(
        max.load(SeqCst),
        1,
        "two workers ran the task at once; events (ms after the partition began): {events:?}"
    );
}

// ---------------------------------------------------------------------------
// 5. A poison verdict overtakes an accepted cancellation.
// ---------------------------------------------------------------------------

struct Quick;

#[saga(name = "quick")]
#[cancellable]
impl Quick {
    #[saga_step(1)]
    async fn work(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

/// Hypothesis: `advance` checks the delivery count before anything else and
/// parks the task `DeadLettered`, with an unguarded commit, even when a
/// cancellation was accepted (`cancel` answered `Cancelled`), although
/// cancelling would run no step at all. The README promises: once `cancel`
/// answered `Cancelled`, the task ends `Cancelled` (or
/// `CompensationFailed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_cancellation_is_not_overtaken_by_the_poison_cap() {
    let redis = TestRedis::start();
    let visibility = Duration::from_millis(500);
    let client = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Quick)
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = client.start::<Quick>(1).await.unwrap();
    let mut conn = redis.conn();
    // A worker process took the message and died, ten times over.
    let read = |conn: &mut redis::Connection| -> Vec<String> {
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("workers")
            .arg("crashed")
            .arg("COUNT")
            .arg(10)
            .arg("STREAMS")
            .arg(QUEUE)
            .arg(">")
            .query(conn)
            .unwrap();
        let mut ids = Vec::new();
        if let Value::Array(streams) = reply {
            for s in streams {
                if let Value::Array(kv) = s {
                    if let Value::Array(entries) = &kv[1] {
                        for e in entries {
                            if let Value::Array(e) = e {
                                if let Value::BulkString(id) = &e[0] {
                                    ids.push(String::from_utf8_lossy(id).into_owned());
                                }
                            }
                        }
                    }
                }
            }
        }
        ids
    };
    let entries = read(&mut conn);
    assert_eq!(entries.len(), 1);
    let _: Value = redis::cmd("XCLAIM")
        .arg(QUEUE)
        .arg("workers")
        .arg("crashed")
        .arg(0)
        .arg(&entries[0])
        .arg("RETRYCOUNT")
        .arg(10)
        .query(&mut conn)
        .unwrap();
    // Meanwhile the user cancels; the answer is `Cancelled`.
    assert_eq!(
        client.cancel::<Quick>(id).await.unwrap(),
        CancelResult::Cancelled
    );
    // (The wake-up went to the same dying process.)
    assert_eq!(read(&mut conn).len(), 1);
    let _worker = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Quick)
        .workers(1)
        .build()
        .await
        .unwrap();
    let task = finish(&client, id, Duration::from_secs(10)).await;
    assert_eq!(
        task.status,
        TaskStatus::Cancelled,
        "cancel() answered Cancelled, the task ended {:?}: {:?}",
        task.status,
        task.error
    );
}

// ---------------------------------------------------------------------------
// 6. Graceful shutdown strands messages.
// ---------------------------------------------------------------------------

struct Nap {
    entered: Arc<AtomicUsize>,
}

#[saga(name = "nap")]
impl Nap {
    #[saga_step(1)]
    async fn nap(&self, n: u32) -> Result<u32, StepError> {
        self.entered.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(800)).await;
        Ok(n)
    }
}

/// Hypothesis: a read over several partitions hands out one entry and
/// buffers the others in the consumer (they are pending for it). A
/// graceful shutdown neither hands them out nor releases them: they wait
/// out the visibility timeout (and count as unanswered deliveries, as if
/// the worker had crashed), though the README says shutdown "finishes or
/// hands back the step in progress".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_graceful_shutdown_hands_back_what_it_buffered() {
    let redis = TestRedis::start();
    let visibility = Duration::from_secs(10);
    let config = || RedisConfig {
        partitions: Some(4),
        visibility_timeout: visibility,
        block: Duration::from_millis(200),
        ..RedisConfig::default()
    };
    let entered = Arc::new(AtomicUsize::new(0));
    let client = Engine::builder()
        .backend(backend_with(&redis, config()).await)
        .saga(Nap {
            entered: entered.clone(),
        })
        .workers(0)
        .build()
        .await
        .unwrap();
    // At least one task in each partition.
    let mut ids: Vec<TaskId> = Vec::new();
    let covers = |ids: &[TaskId], p: u128| ids.iter().any(|id| id.0.as_u128() % 4 == p);
    while !(0..4).all(|p| covers(&ids, p)) {
        ids.push(client.start::<Nap>(1).await.unwrap());
    }
    let old = Engine::builder()
        .backend(backend_with(&redis, config()).await)
        .saga(Nap {
            entered: entered.clone(),
        })
        .workers(1)
        .build()
        .await
        .unwrap();
    wait_until("the first step", Duration::from_secs(10), || {
        entered.load(SeqCst) >= 1
    })
    .await;
    // A deploy: the old worker stops gracefully (its step finishes).
    old.shutdown().await;
    let replaced = Instant::now();
    let _new = Engine::builder()
        .backend(backend_with(&redis, config()).await)
        .saga(Nap {
            entered: entered.clone(),
        })
        .workers(2)
        .build()
        .await
        .unwrap();
    for id in &ids {
        let task = finish(&client, *id, Duration::from_secs(30)).await;
        assert_eq!(task.status, TaskStatus::Completed);
    }
    let took = replaced.elapsed();
    // Stranded messages would come back only after the visibility
    // timeout (10 s); the rest is the naps themselves (two workers).
    assert!(
        took < Duration::from_secs(8),
        "the replacement needed {took:?} (visibility timeout {visibility:?}) to get every message back"
    );
    drop(old);
}

/// Hypothesis: shutdown drops the worker's `receive` future while its
/// `XREADGROUP ... BLOCK` is still parked on the server. The blocked read
/// goes on for up to a block time and takes the next message into a reply
/// nobody reads: that message waits out the visibility timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_arriving_just_after_shutdown_is_not_stranded() {
    let redis = TestRedis::start();
    let visibility = Duration::from_secs(10);
    let config = || RedisConfig {
        visibility_timeout: visibility,
        ..RedisConfig::default() // block: 1 s
    };
    let entered = Arc::new(AtomicUsize::new(0));
    let saga = || Nap {
        entered: entered.clone(),
    };
    let client = Engine::builder()
        .backend(backend_with(&redis, config()).await)
        .saga(saga())
        .workers(0)
        .build()
        .await
        .unwrap();
    let old = Engine::builder()
        .backend(backend_with(&redis, config()).await)
        .saga(saga())
        .workers(1)
        .build()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Not awaited: the message must arrive while the old worker's read
    // may still be parked on the server.
    let stopping = {
        let old = old.clone();
        tokio::spawn(async move { old.shutdown().await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let id = client.start::<Nap>(1).await.unwrap();
    let _new = Engine::builder()
        .backend(backend_with(&redis, config()).await)
        .saga(saga())
        .workers(1)
        .build()
        .await
        .unwrap();
    let started = Instant::now();
    let task = finish(&client, id, Duration::from_secs(30)).await;
    assert_eq!(task.status, TaskStatus::Completed);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the task waited {:?} (the visibility timeout is {visibility:?})",
        started.elapsed()
    );
    stopping.await.unwrap();
    drop(old);
}

// ---------------------------------------------------------------------------
// 7. A saga unknown to the worker that gets its message: stuck Pending.
// ---------------------------------------------------------------------------

/// Hypothesis: during a rolling deploy that adds a saga, an old worker
/// dead-letters the new saga's message ("unknown saga") but leaves its task
/// `Pending`: not terminal, not `DeadLettered` (so listing by status does not
/// find it), and `wait` never returns, although a worker that knows the
/// saga runs a moment later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_message_reached_an_old_worker_still_ends() {
    let redis = TestRedis::start();
    let visibility = Duration::from_secs(2);
    let new_api = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .saga(Quick)
        .workers(0)
        .build()
        .await
        .unwrap();
    let old_worker = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Quick)
        .workers(1)
        .build()
        .await
        .unwrap();
    let id = new_api.start::<Double>(21).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The rollout reaches the workers.
    drop(old_worker);
    let _new_worker = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .saga(Quick)
        .workers(1)
        .build()
        .await
        .unwrap();
    let task = finish(&new_api, id, Duration::from_secs(8)).await;
    assert_eq!(task.status, TaskStatus::Completed);
}

// ---------------------------------------------------------------------------
// 8. A panicking `#[on_error]` kills worker loops for good.
// ---------------------------------------------------------------------------

#[derive(Message, Serialize, Deserialize)]
struct Boom {
    #[correlation_id]
    id: String,
}

#[derive(Message, Serialize, Deserialize)]
struct Fine {
    #[correlation_id]
    id: String,
}

#[derive(Default, Serialize, Deserialize)]
struct Seen {
    fine: u32,
}

struct Panicky;

#[process_manager(name = "panicky", state = Seen)]
impl Panicky {
    #[starts]
    async fn boom(
        &self,
        _m: Boom,
        _s: &mut Seen,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        Err(ProcessError::new("the handler fails"))
    }

    #[starts]
    async fn fine(
        &self,
        _m: Fine,
        s: &mut Seen,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.fine += 1;
        Ok(())
    }

    #[on_error]
    fn on_error(&self, _f: &Failure) -> ErrorAction {
        panic!("a bug in on_error")
    }
}

/// Hypothesis: handlers run under `catch_unwind`, but `#[on_error]` (user
/// code too) does not: its panic unwinds through `dispatch` and ends the
/// worker's tokio task. Each redelivery kills another worker loop; once all
/// are gone the process looks alive and handles nothing, and the message
/// never reaches the poison cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_on_error_does_not_kill_the_workers() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(backend(&redis, Duration::from_millis(500)).await)
        .process_manager(Panicky)
        .workers(2)
        .build()
        .await
        .unwrap();
    engine.publish(Boom { id: "b".into() }).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    engine.publish(Fine { id: "f".into() }).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        if let Some(state) = engine.process_state::<Panicky>("f").await.unwrap() {
            assert_eq!(state.fine, 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "an innocent message was not handled: the worker loops are dead"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------
// 9. COMMIT writes the task, then fails on PEXPIRE: a half-applied commit.
// ---------------------------------------------------------------------------

struct Park;

#[saga(name = "park")]
impl Park {
    #[saga_step(1)]
    #[retry_policy(max_retries = 0, backoff = constant, base_delay_ms = 0, on_exhausted = dead_letter)]
    async fn work(&self, _n: u32) -> Result<u32, StepError> {
        Err(StepError::permanent("needs an operator"))
    }
}

/// Hypothesis: COMMIT writes the record and moves the index entries, then
/// calls PEXPIRE, which fails for an out-of-range TTL; Redis keeps the
/// writes made so far. The worker's retry then sees "version + 1" and
/// takes the commit as landed. With `attention_retention(Some(Duration::MAX))`
/// (meant: keep practically for ever) the task reads `DeadLettered` but its
/// dead letter was never written, so no operator can requeue it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_is_all_or_nothing_even_with_an_extreme_retention() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(backend(&redis, Duration::from_secs(2)).await)
        .saga(Park)
        .attention_retention(Some(Duration::MAX))
        .workers(1)
        .build()
        .await
        .unwrap();
    let id = engine.start::<Park>(1).await.unwrap();
    let task = finish(&engine, id, Duration::from_secs(10)).await;
    assert_eq!(task.status, TaskStatus::DeadLettered);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let letters = engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    assert!(
        letters.iter().any(|l| l.task_id == Some(id)),
        "the task is DeadLettered but has no dead letter to requeue: {letters:#?}"
    );
}

// ---------------------------------------------------------------------------
// 10. The dead-letter cap trims the letter of a task parked for an operator.
// ---------------------------------------------------------------------------

/// Hypothesis: housekeeping trims dead letters to `max_dead_letters` by
/// count, oldest first, with no regard for what they park. A task parked
/// `DeadLettered` (kept for an operator) can only be resumed through
/// `requeue(dead_letter_id)`; once a flood of garbage pushed its letter out,
/// the task is parked for good: nothing can requeue it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_task_stays_requeueable_after_a_flood_of_bad_input() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(backend(&redis, Duration::from_secs(2)).await)
        .saga(Park)
        .max_dead_letters(3)
        .housekeeping_interval(Duration::from_millis(100))
        .workers(1)
        .build()
        .await
        .unwrap();
    let id = engine.start::<Park>(1).await.unwrap();
    assert_eq!(
        finish(&engine, id, Duration::from_secs(10)).await.status,
        TaskStatus::DeadLettered
    );
    for _ in 0..5 {
        engine.backend().enqueue_raw(b"garbage").await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let letters = engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    assert_eq!(
        engine.task(id).await.unwrap().unwrap().status,
        TaskStatus::DeadLettered
    );
    assert!(
        letters.iter().any(|l| l.task_id == Some(id)),
        "the parked task's letter was trimmed; it can no longer be requeued. Letters left: {:?}",
        letters.iter().map(|l| &l.reason).collect::<Vec<_>>()
    );
}

// ---------------------------------------------------------------------------
// 11. A valid saga message on another partition's stream loops for ever.
// ---------------------------------------------------------------------------

struct Counted {
    calls: Arc<AtomicUsize>,
    attempts: Arc<std::sync::Mutex<Vec<u32>>>,
}

#[saga(name = "counted")]
impl Counted {
    #[saga_step(1)]
    #[retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 0)]
    async fn work(&self, n: u32, ctx: &StepContext) -> Result<u32, StepError> {
        self.calls.fetch_add(1, SeqCst);
        self.attempts.lock().unwrap().push(ctx.attempt());
        Ok(n)
    }
}

/// Hypothesis: `enqueue_raw` (documented "for bridges") always writes to
/// partition 0's stream. A well-formed message for a task of another
/// partition is run (the step executes), then every commit fails with
/// `Corrupt("delivery .. is not in partition ..")`, which is not transient:
/// the worker hands the message back (an *answered* delivery, so the poison
/// cap never trips) and the task loops for ever, re-running its step until
/// the retries are spent, then retrying the refused commit every 100 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridged_message_on_the_wrong_partition_does_not_loop() {
    let redis = TestRedis::start();
    let config = || RedisConfig {
        partitions: Some(2),
        visibility_timeout: Duration::from_secs(2),
        block: Duration::from_millis(200),
        ..RedisConfig::default()
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let client = Engine::builder()
        .backend(backend_with(&redis, config()).await)
        .saga(Counted {
            calls: calls.clone(),
            attempts: attempts.clone(),
        })
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = loop {
        let id = client.start::<Counted>(5).await.unwrap();
        if id.0.as_u128() % 2 == 1 {
            break id;
        }
    };
    // A bridge moves the message: read it from partition 1 and hand it in.
    let mut conn = redis.conn();
    let q1 = "saga:{saga:1}:queue";
    type Entries = Vec<(String, Vec<(String, Vec<u8>)>)>;
    let entries: Entries = redis::cmd("XRANGE")
        .arg(q1)
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    let (entry, payload) = entries
        .iter()
        .find_map(|(eid, fields)| {
            let p = fields.iter().find(|(k, _)| k == "payload")?.1.clone();
            String::from_utf8_lossy(&p)
                .contains(&id.to_string())
                .then(|| (eid.clone(), p))
        })
        .expect("the task's message");
    let _: i64 = redis::cmd("XDEL")
        .arg(q1)
        .arg(&entry)
        .query(&mut conn)
        .unwrap();
    client.backend().enqueue_raw(&payload).await.unwrap();
    let _worker = Engine::builder()
        .backend(backend_with(&redis, config()).await)
        .saga(Counted {
            calls: calls.clone(),
            attempts: attempts.clone(),
        })
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(1)
        .build()
        .await
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(8), client.wait(id)).await;
    let task = client.task(id).await.unwrap().unwrap();
    assert!(
        matches!(outcome, Ok(Ok(_))),
        "the task never ended: status {:?}, the step ran {} times (attempts {:?}), audit: {:?}",
        task.status,
        calls.load(SeqCst),
        attempts.lock().unwrap(),
        task.audit_log
            .iter()
            .map(|a| format!("{:?}", a.action))
            .collect::<Vec<_>>()
    );
}

// ---------------------------------------------------------------------------
// 12. Paging across partitions and ties (expected to hold).
// ---------------------------------------------------------------------------

/// Hypothesis (refuted if it passes): tasks created in the same millisecond
/// in several partitions are listed exactly once, in order, whatever the
/// page size; so are dead letters spread over partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paging_lists_every_task_and_letter_once_across_partitions_and_ties() {
    let redis = TestRedis::start();
    let config = || RedisConfig {
        partitions: Some(3),
        visibility_timeout: Duration::from_secs(2),
        block: Duration::from_millis(200),
        ..RedisConfig::default()
    };
    let engine = Engine::builder()
        .backend(backend_with(&redis, config()).await)
        .saga(Park)
        .workers(4)
        .build()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..6 {
        let batch = futures::future::join_all((0..8).map(|_| engine.start::<Park>(1))).await;
        ids.extend(batch.into_iter().map(|r| r.unwrap()));
    }
    for id in &ids {
        finish(&engine, *id, Duration::from_secs(20)).await;
    }
    let all: std::collections::HashSet<TaskId> = ids.iter().copied().collect();
    for limit in [1usize, 2, 3, 7, 50] {
        let mut seen = Vec::new();
        let mut filter = TaskFilter::new().saga("park").limit(limit);
        loop {
            let page = engine.tasks(filter.clone()).await.unwrap();
            seen.extend(page.tasks.iter().map(|t| (t.created_at, t.id)));
            match page.next {
                Some(next) => filter = filter.after(next),
                None => break,
            }
        }
        let mut sorted = seen.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        assert_eq!(seen, sorted, "newest first (limit {limit})");
        let set: std::collections::HashSet<TaskId> = seen.iter().map(|s| s.1).collect();
        assert_eq!(set.len(), seen.len(), "no duplicates (limit {limit})");
        assert_eq!(set, all, "every task (limit {limit})");

        let mut letters = Vec::new();
        let mut filter = saga_runtime::DeadLetterFilter::new().limit(limit);
        loop {
            let page = engine.dead_letters(filter.clone()).await.unwrap();
            letters.extend(page.letters.iter().map(|l| l.id.clone()));
            match page.next {
                Some(next) => filter = filter.after(next),
                None => break,
            }
        }
        let set: std::collections::HashSet<&String> = letters.iter().collect();
        assert_eq!(
            set.len(),
            letters.len(),
            "no duplicate letters (limit {limit})"
        );
        assert_eq!(letters.len(), ids.len(), "every letter (limit {limit})");
    }
}
