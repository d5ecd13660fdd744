//! A second adversarial review of the execution core. Each test states the
//! hypothesis it was written to confirm (every one failed before its fix)
//! and asserts the behaviour the design promises. Every test runs against
//! a private redis-server.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use tokio::sync::Notify;

async fn backend_with(url: &str, config: RedisConfig) -> RedisBackend {
    RedisBackend::connect_with(url, config).await.unwrap()
}

fn config(visibility: Duration) -> RedisConfig {
    RedisConfig {
        visibility_timeout: visibility,
        block: Duration::from_millis(200),
        ..RedisConfig::default()
    }
}

async fn finish(engine: &Engine, id: TaskId, within: Duration) -> TaskInstance {
    match tokio::time::timeout(within, engine.wait(id)).await {
        Ok(Ok(task)) => task,
        Ok(Err(e)) => panic!("wait({id}) failed: {e:?}"),
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
// A. Innocent messages are dead-lettered as poison.
// ---------------------------------------------------------------------------

struct Slow(Duration);

#[saga(name = "slow")]
impl Slow {
    #[saga_step(1)]
    async fn work(&self, n: u32) -> Result<u32, StepError> {
        tokio::time::sleep(self.0).await;
        Ok(n)
    }
}

/// Hypothesis: a read over several streams (partitions > 1) or a claim
/// hands out one message and *buffers* the others for the same consumer,
/// untouched, while the first one's step runs. A step longer than the
/// visibility timeout lets every buffered message go idle; an idle worker
/// claims it (Redis increments its delivery count), buffers some of what it
/// claimed behind its own long step, and so on. No worker ever dies, yet a
/// message's count of "unanswered" deliveries climbs past `max_deliveries`
/// and an innocent task is parked `DeadLettered` as poison ("delivered N
/// times without completing ... a crash, an abort, or running out of
/// memory").
fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

///
/// Fixed: a read takes one message (a script tries the streams in turn); the
/// rare extra entries of a blocking read over several streams are handed
/// straight back.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn buffered_messages_behind_long_steps_are_not_dead_lettered_as_poison() {
    // No restart here, so no append-only file: a stalled fsync would
    // starve the compressed 1.5 s leases, which are not what is tested.
    let redis = TestRedis::start_with_aof(false);
    // Time compressed: a 4.5 s step against a 1.5 s visibility timeout is
    // the ratio of a 45 s step against the default 15 s. The delivery cap
    // is 3 so that a message re-claimed behind long steps trips it within
    // the test (the default 10 takes longer to reach, but is reached).
    let cfg = || RedisConfig {
        partitions: Some(knob("A_PARTITIONS", 16) as u16),
        ..config(Duration::from_millis(knob("A_VIS_MS", 1500)))
    };
    let engine = Engine::builder()
        .backend(backend_with(&redis.url(), cfg()).await)
        .saga(Slow(Duration::from_millis(knob("A_STEP_MS", 4500))))
        .timeout_poll_interval(Duration::from_millis(20))
        // "Deliveries a message may go through without any worker settling
        // it (each one's worker died handling it)": no worker dies here.
        .max_deliveries(knob("A_MAX", 3) as u32)
        .workers(knob("A_WORKERS", 32) as usize)
        .build()
        .await
        .unwrap();
    let (stop, monitor) = spawn_pending_monitor(redis.url(), knob("A_PARTITIONS", 16) as u16);
    let mut ids = Vec::new();
    for n in 0..knob("A_TASKS", 64) as u32 {
        ids.push(engine.start::<Slow>(n).await.unwrap());
    }
    let mut parked = Vec::new();
    for id in &ids {
        let task = finish(&engine, *id, Duration::from_secs(120)).await;
        if task.status != TaskStatus::Completed {
            parked.push((task.status, task.error.clone()));
        }
    }
    stop.store(true, SeqCst);
    eprintln!(
        "highest Redis delivery count seen: {}",
        monitor.join().unwrap()
    );
    assert!(
        parked.is_empty(),
        "{} of {} innocent tasks (no worker died) did not complete: {:#?}",
        parked.len(),
        ids.len(),
        &parked[..parked.len().min(3)]
    );
}

/// Polls XPENDING of every saga stream and returns the highest delivery
/// count seen (diagnostics).
fn spawn_pending_monitor(
    url: String,
    partitions: u16,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let h = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let mut max = 0u64;
        while !s.load(SeqCst) {
            for p in 0..partitions {
                let q = format!("saga:{{saga:{p}}}:queue");
                let r: redis::RedisResult<Vec<(String, String, u64, u64)>> = redis::cmd("XPENDING")
                    .arg(&q)
                    .arg("workers")
                    .arg("-")
                    .arg("+")
                    .arg(1000)
                    .query(&mut conn);
                if let Ok(r) = r {
                    for (_, _, _, c) in r {
                        max = max.max(c);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        max
    });
    (stop, h)
}

// ---------------------------------------------------------------------------
// B. A cancellation racing a failed attempt waits out the whole backoff.
// ---------------------------------------------------------------------------

mod proxy {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A TCP proxy that holds back, for `hold`, any chunk a client sends
    /// that contains `needle` (a slow or congested link for that one
    /// command; everything after it on the connection waits too).
    pub struct Proxy {
        pub port: u16,
        pub held: Arc<AtomicUsize>,
    }

    async fn pipe(
        mut r: tokio::net::tcp::OwnedReadHalf,
        mut w: tokio::net::tcp::OwnedWriteHalf,
        needle: Option<(Vec<u8>, Duration)>,
        held: Arc<AtomicUsize>,
    ) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if let Some((needle, hold)) = &needle {
                if buf[..n].windows(needle.len()).any(|w| w == &needle[..]) {
                    held.fetch_add(1, SeqCst);
                    tokio::time::sleep(*hold).await;
                }
            }
            if w.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    pub async fn start(upstream: u16, needle: &[u8], hold: Duration) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = Arc::new(AtomicUsize::new(0));
        let h = held.clone();
        let needle = needle.to_vec();
        tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                let h = h.clone();
                let needle = needle.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::spawn(pipe(ri, wo, Some((needle, hold)), h.clone()));
                    tokio::spawn(pipe(ro, wi, None, h));
                });
            }
        });
        Proxy { port, held }
    }
}

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

/// Hypothesis: `cancel` reads the task (and its `seq`) and only then runs
/// the CANCEL script, which enqueues a wake-up message carrying that
/// `seq`. COMMIT's "a cancelled task's retry is enqueued at once" only
/// helps when the flag is already set when the failed attempt commits. If
/// the attempt fails and commits its retry (`seq + 1`, 30 s later) in
/// between the read and the script (one round trip on a slow link), the
/// flag is set after the commit, the wake-up (old `seq`) is acknowledged
/// as stale, nothing is running for the pub/sub notice to stop, and the
/// accepted cancellation (`CancelResult::Cancelled`) waits out the whole
/// backoff (30 s here; hours with exponential backoff in production).
///
/// Fixed: while a cancellation is recorded but not applied, any message of
/// the task is current, the stale wake-up included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_whose_request_lands_just_after_a_failed_attempt_still_wakes_the_task() {
    let redis = TestRedis::start();
    // The API process's link holds back the cancel script for 1.5 s.
    let proxy = proxy::start(
        redis.port(),
        b"saga:cancellations",
        Duration::from_millis(1500),
    )
    .await;
    let entered = Arc::new(Notify::new());
    let fail = Arc::new(Notify::new());
    let saga = || FailOnSignal {
        entered: entered.clone(),
        fail: fail.clone(),
    };
    let _worker = Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(15))).await)
        .saga(saga())
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(1)
        .build()
        .await
        .unwrap();
    let api = Engine::builder()
        .backend(
            backend_with(
                &format!("redis://127.0.0.1:{}/", proxy.port),
                config(Duration::from_secs(15)),
            )
            .await,
        )
        .saga(saga())
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = api.start::<FailOnSignal>(1).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), entered.notified())
        .await
        .expect("the step started");
    let api2 = api.clone();
    let cancel = tokio::spawn(async move { api2.cancel::<FailOnSignal>(id).await });
    // The cancel request is on the wire (read done, script held back);
    // the upstream call fails now and its retry is committed.
    let deadline = Instant::now() + Duration::from_secs(5);
    while proxy.held.load(SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the cancel script never went out"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fail.notify_one();
    let answer = cancel.await.unwrap().unwrap();
    assert_eq!(
        answer,
        CancelResult::Cancelled,
        "the cancellation was accepted"
    );
    let t0 = Instant::now();
    let task = finish(&api, id, Duration::from_secs(8)).await;
    assert_eq!(task.status, TaskStatus::Cancelled, "{task:#?}");
    eprintln!("cancelled {:?} after the answer", t0.elapsed());
}

// ---------------------------------------------------------------------------
// C. A task record a worker cannot read loops for ever.
// ---------------------------------------------------------------------------

struct Plain;

#[saga(name = "plain")]
impl Plain {
    #[saga_step(1)]
    async fn work(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

/// Hypothesis: `saga::handle` treats *every* error of `lock_and_load` as
/// "locking failed; message handed back", including `Corrupt` (a record
/// this worker cannot parse: written by a newer version during a rolling
/// deploy, with a step status it does not know yet; or damaged). The
/// LOCK script has already taken the lock (and incremented the fence)
/// when the parse fails in Rust, and nothing releases it. The message is
/// handed back as *answered* every 100 ms, so the poison cap never trips:
/// it loops for ever (invariant 8), the task never ends and never reaches
/// the dead-letter queue where an operator would see it (invariant 7).
///
/// Fixed: the lock is freed at once, and the message handed back (as an
/// unanswered delivery) for a version that can read the record, then
/// dead-lettered at the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_record_a_worker_cannot_read_is_dead_lettered_not_looped() {
    let redis = TestRedis::start();
    let api = Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(1))).await)
        .saga(Plain)
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = api.start::<Plain>(1).await.unwrap();
    // A newer version of the engine wrote a step status this one does not
    // know. (An audit entry of an unknown kind no longer does it: this
    // version reads those as `Unrecognised`.)
    let key = format!("saga:{{saga:0}}:task:{id}");
    let mut conn = redis.conn();
    // The step's own field (record layout 2, where a fresh deployment
    // keeps each step apart), else the whole record's `doc`.
    let step: Option<String> = redis::cmd("HGET")
        .arg(&key)
        .arg("s:0")
        .query(&mut conn)
        .unwrap();
    let (field, text) = match step {
        Some(step) => {
            let mut step: serde_json::Value = serde_json::from_str(&step).unwrap();
            step["status"] = serde_json::json!("Paused");
            ("s:0", step.to_string())
        }
        None => {
            let doc: String = redis::cmd("HGET")
                .arg(&key)
                .arg("doc")
                .query(&mut conn)
                .unwrap();
            let mut doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
            doc["steps"][0]["status"] = serde_json::json!("Paused");
            ("doc", doc.to_string())
        }
    };
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg(field)
        .arg(text)
        .query(&mut conn)
        .unwrap();

    // A newer worker may read it (a rolling deploy): the message goes back
    // twice (1 s, 2 s) for one, then is dead-lettered.
    let _worker = Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(1))).await)
        .saga(Plain)
        .timeout_poll_interval(Duration::from_millis(20))
        .max_deliveries(2)
        .workers(1)
        .build()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let letters = api.dead_letters(Default::default()).await.unwrap().letters;
    let fence: Option<u64> = redis::cmd("GET")
        .arg(format!("saga:{{saga:0}}:fence:{id}"))
        .query(&mut conn)
        .unwrap();
    let queued: u64 = redis::cmd("XLEN")
        .arg("saga:{saga:0}:queue")
        .query(&mut conn)
        .unwrap();
    let delayed: u64 = redis::cmd("ZCARD")
        .arg("saga:{saga:0}:delayed")
        .query(&mut conn)
        .unwrap();
    assert!(
        letters.iter().any(|l| l.task_id == Some(id)),
        "after 6 s the message is still circulating (queue {queued}, delayed {delayed}), \
         the lock was taken {fence:?} times and never released, no dead letter; \
         wait() says: {:?}",
        api.wait(id).await.map(|t| t.status)
    );
}

// ---------------------------------------------------------------------------
// D. Worker processes that run different things share one queue.
// ---------------------------------------------------------------------------

mod pm {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Message, Serialize, Deserialize)]
    pub struct Begin {
        #[correlation_id]
        pub id: String,
    }

    #[derive(Message, Serialize, Deserialize)]
    pub struct Expire;

    #[derive(Debug, Default, Serialize, Deserialize)]
    pub struct State {
        pub expired: bool,
    }

    pub struct Reminder {
        pub after: Duration,
    }

    #[process_manager(name = "reminder", state = State)]
    impl Reminder {
        #[starts]
        async fn begin(
            &self,
            _m: Begin,
            _s: &mut State,
            ctx: &mut ProcessContext,
        ) -> Result<(), ProcessError> {
            ctx.request_timeout(self.after, Expire);
            Ok(())
        }

        #[timeout]
        async fn expire(
            &self,
            _t: Expire,
            s: &mut State,
            _ctx: &mut ProcessContext,
        ) -> Result<(), ProcessError> {
            s.expired = true;
            Ok(())
        }
    }
}

async fn saga_only_workers(redis: &TestRedis, workers: usize) -> Engine {
    Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(2))).await)
        .saga(Plain)
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(workers)
        .build()
        .await
        .unwrap()
}

async fn pm_only_workers(redis: &TestRedis, workers: usize) -> Engine {
    Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(2))).await)
        .process_manager(pm::Reminder {
            after: Duration::from_millis(200),
        })
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(workers)
        .build()
        .await
        .unwrap()
}

/// Hypothesis: every worker reads every stream, the process-manager one
/// included, whatever it runs. A worker of a process that runs only sagas
/// (a separate deployment, or an old version during a rolling deploy that
/// adds a process manager) dead-letters every process-manager message it
/// happens to read ("unknown process manager"), at once: unlike a saga
/// message for an unknown saga, it is not handed back for a worker that
/// runs it.
///
/// Fixed: a worker reads only the streams of what it runs; a message for
/// an unknown process manager goes back with growing delays like one for
/// an unknown saga.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_saga_only_worker_does_not_dead_letter_process_manager_messages() {
    let redis = TestRedis::start();
    let _sagas = saga_only_workers(&redis, 2).await;
    let pms = pm_only_workers(&redis, 2).await;
    for i in 0..20 {
        pms.publish(pm::Begin {
            id: format!("r-{i}"),
        })
        .await
        .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while pms.process_instances::<pm::Reminder>().await.unwrap().len() < 20
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let instances = pms.process_instances::<pm::Reminder>().await.unwrap();
    let letters = pms.dead_letters(Default::default()).await.unwrap().letters;
    assert!(
        instances.len() == 20 && letters.is_empty(),
        "{} of 20 instances started; {} messages dead-lettered, e.g. {:?}",
        instances.len(),
        letters.len(),
        letters.first().map(|l| &l.reason)
    );
}

/// Hypothesis: one engine at a time moves due timers (the `timers` lease),
/// and `move_due` skips process-manager timeouts when *that* engine has no
/// process managers. If the lease holder is a saga-only worker process,
/// process-manager timeouts never fire for as long as it lives (it renews
/// the lease every poll).
///
/// Fixed: the lease holder moves every timer of the deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn process_manager_timeouts_fire_whoever_holds_the_timer_lease() {
    let redis = TestRedis::start();
    // The saga-only process starts first and takes the timer lease (an
    // engine runs a poller only if it runs workers).
    let _sagas = saga_only_workers(&redis, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pms = pm_only_workers(&redis, 1).await;
    // Start the instance through the process-manager engine's workers:
    // retry until an instance exists (the saga-only worker may dead-letter
    // a publish; see the previous test).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    while pms
        .process_instances::<pm::Reminder>()
        .await
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "no instance started");
        pms.publish(pm::Begin {
            id: format!("t-{n}"),
        })
        .await
        .unwrap();
        n += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The timeout was due 200 ms after the start.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let instances = pms.process_instances::<pm::Reminder>().await.unwrap();
    let store = pms.backend().clone().processes().expect("a process store");
    let scheduled = store.process_scheduled().await.unwrap();
    let expired = instances
        .iter()
        .filter(|i| i.state["expired"] == serde_json::json!(true))
        .count();
    assert!(
        expired == instances.len(),
        "{expired} of {} instances saw their 200 ms timeout after 3 s; {} timeouts still scheduled (overdue)",
        instances.len(),
        scheduled.len()
    );
}

// ---------------------------------------------------------------------------
// G. A handling panic is handed back as "answered": it loops for ever.
// ---------------------------------------------------------------------------

/// The first version of a saga: two steps.
struct ShapeV1;

#[saga(name = "shape")]
impl ShapeV1 {
    #[saga_step(1)]
    async fn first(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[saga_step(2)]
    async fn second(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

/// The next deploy of the same saga, one step shorter, without the
/// version bump (`#[saga(version = 2)]`) it should have had: the
/// fingerprint the task recorded tells the two apart.
struct ShapeV2;

#[saga(name = "shape")]
impl ShapeV2 {
    #[saga_step(1)]
    async fn first(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

/// Hypothesis: the worker loop catches a panic anywhere in handling (not
/// in a step: that is a failed attempt) and hands the message back with
/// `release`, which counts the delivery as *answered*. A panic that
/// happens every time (here: a task recorded with two steps meets a
/// definition with one, and the state machine indexes past the end of
/// `def.steps`) therefore loops every 100 ms for ever: the delivery cap
/// that exists exactly for "a message that kills its handler" never trips,
/// the task never ends, nothing reaches the dead-letter queue.
///
/// Fixed twice over: a task whose recorded steps differ from the worker's
/// definition is handed back for another version (then parked at the cap)
/// without any panic, and a panic counts as an unanswered delivery (see
/// `hardening.rs`, `a_panicking_on_error_does_not_kill_the_workers`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_started_by_another_version_of_its_saga_is_parked_not_looped() {
    let redis = TestRedis::start();
    let api = Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(1))).await)
        .saga(ShapeV1)
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = api.start::<ShapeV1>(1).await.unwrap();
    let _worker = Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(1))).await)
        .saga(ShapeV2)
        .timeout_poll_interval(Duration::from_millis(20))
        .max_deliveries(2)
        .workers(1)
        .build()
        .await
        .unwrap();
    // Handed back twice (1 s, 2 s) for a worker of the first version.
    let task = finish(&api, id, Duration::from_secs(8)).await;
    assert_eq!(task.status, TaskStatus::DeadLettered, "{task:#?}");
    let error = task.error.unwrap_or_default();
    assert!(
        error.contains("started with steps [first, second]")
            && error.contains("has [first]")
            && error.contains("without a version bump"),
        "{error}"
    );
    let letters = api.dead_letters(Default::default()).await.unwrap().letters;
    assert!(
        letters.iter().any(|l| l.task_id == Some(id)),
        "{letters:#?}"
    );
}

// ---------------------------------------------------------------------------
// F. Changing `RedisConfig::partitions` strands every task in flight.
// ---------------------------------------------------------------------------

/// Hypothesis: a task's keys are found by `id % partitions`, and nothing
/// records how many partitions a deployment was created with. Scaling out
/// (`partitions: 1` -> `2`, which the docs present as the way to spread
/// over Cluster slots) makes about half of the existing tasks unreachable:
/// `task()` says they do not exist, `wait()` fails with `TaskNotFound`, and
/// their messages (in the old partition's stream) are dead-lettered as
/// "task does not exist".
///
/// Fixed by refusing the change: the first backend records the count, and
/// one connecting with another is refused with what to do instead. The
/// tasks in flight finish under the recorded layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn changing_the_partition_count_is_refused_and_keeps_existing_tasks_reachable() {
    let redis = TestRedis::start();
    let before = Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(2))).await)
        .saga(Plain)
        .workers(0)
        .build()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(before.start::<Plain>(n).await.unwrap());
    }
    let refused = RedisBackend::connect_with(
        &redis.url(),
        RedisConfig {
            partitions: Some(2),
            ..config(Duration::from_secs(2))
        },
    )
    .await
    .err()
    .expect("another partition count is refused");
    let message = refused.to_string();
    assert!(
        matches!(
            refused,
            saga_runtime::backend::BackendError::Misconfigured(_)
        ) && message.contains("`RedisConfig::partitions` is 2")
            && message.contains("written with 1 partitions"),
        "{message}"
    );
    // Another prefix is another deployment: any count.
    RedisBackend::connect_with(
        &redis.url(),
        RedisConfig {
            partitions: Some(2),
            prefix: "next".into(),
            ..config(Duration::from_secs(2))
        },
    )
    .await
    .unwrap();
    let after = Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(2))).await)
        .saga(Plain)
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(2)
        .build()
        .await
        .unwrap();
    for id in &ids {
        let task = finish(&after, *id, Duration::from_secs(5)).await;
        assert_eq!(task.status, TaskStatus::Completed);
    }
}

// ---------------------------------------------------------------------------
// H. A script that fails after writing: bad input lost without a trace.
// ---------------------------------------------------------------------------

/// Hypothesis: DEAD_LETTER (and COMMIT's dead-letter branch) settle the
/// message first (XACK + XDEL) and then XADD to the dead-letter stream
/// with `MAXLEN ~ <10 x max_dead_letters>`. A cap meant as "no limit"
/// (`usize::MAX`) gives a MAXLEN Redis refuses ("value is not an integer
/// or out of range") *after* the entry was deleted: Redis keeps the
/// delete, so the bad message vanishes with no dead letter, and a parked
/// task would have no letter to be requeued by.
///
/// Fixed: the cap is clamped to what `MAXLEN` accepts, and every script
/// writes the letter before it settles the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_is_dead_lettered_even_with_an_unlimited_dead_letter_cap() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(1))).await)
        .saga(Plain)
        .max_dead_letters(usize::MAX)
        .housekeeping_interval(Duration::from_millis(50))
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(1)
        .build()
        .await
        .unwrap();
    // Let housekeeping hand the cap to the backend.
    tokio::time::sleep(Duration::from_millis(300)).await;
    engine.backend().enqueue_raw(b"{not json").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let letters = engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    let mut conn = redis.conn();
    let queued: u64 = redis::cmd("XLEN")
        .arg("saga:{saga:0}:queue")
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        letters.len(),
        1,
        "the malformed message is neither dead-lettered nor queued (queue length {queued}): lost"
    );
}

// ---------------------------------------------------------------------------
// I. A graceful shutdown spends (or exhausts) the running step's retries.
// ---------------------------------------------------------------------------

struct OneShot(Arc<AtomicUsize>);

#[saga(name = "one-shot")]
impl OneShot {
    #[saga_step(1)]
    #[retry_policy(max_retries = 0, backoff = constant, base_delay_ms = 0, on_exhausted = fail)]
    async fn charge(&self, n: u32) -> Result<u32, StepError> {
        let call = self.0.fetch_add(1, SeqCst);
        if call == 0 {
            // The first call is still running when its worker is told to
            // shut down (a rolling deploy).
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        Ok(n)
    }
}

/// Was: the heartbeat ran every third of the task lease. With a lease
/// longer than the visibility timeout (`lock_ttl(10 s)` against 1 s) the
/// running step's message went idle, another worker claimed it, the
/// first one's commit was refused, and the step failed as "did not
/// report back" although nothing died.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_longer_than_the_visibility_timeout_keeps_the_message() {
    let redis = TestRedis::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(1))).await)
        .saga(OneShot(calls.clone()))
        .lock_ttl(Duration::from_secs(10))
        .workers(2)
        .build()
        .await
        .unwrap();
    let id = engine.start::<OneShot>(1).await.unwrap();
    let task = finish(&engine, id, Duration::from_secs(20)).await;
    assert_eq!(task.status, TaskStatus::Completed, "{:?}", task.error);
    assert_eq!(
        calls.load(SeqCst),
        1,
        "one call: the message stayed with its worker"
    );
    engine.shutdown().await;
}

/// Hypothesis: on a graceful shutdown, a step still running after
/// `shutdown_grace` is dropped and its message handed back; the next
/// worker finds the attempt recorded but never reported back and counts it
/// as a *failed* attempt ("did not report back (its worker stopped ...)").
/// The engine knows this attempt was interrupted by its own shutdown, yet
/// a step with `max_retries = 0` (a payment capture) fails its task just
/// because a worker was redeployed.
///
/// Fixed: the step sees `ctx.cancelled()` at the end of the grace, and an
/// attempt that outlives it is committed as interrupted: made again at
/// once by another worker, not counted against the retry budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_graceful_shutdown_does_not_fail_the_step_it_interrupts() {
    let redis = TestRedis::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let leaving = Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(1))).await)
        .saga(OneShot(calls.clone()))
        .shutdown_grace(Duration::from_millis(200))
        .workers(1)
        .build()
        .await
        .unwrap();
    let id = leaving.start::<OneShot>(1).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while calls.load(SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the step never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Returns once the interrupted attempt is committed and its message
    // handed back.
    leaving.shutdown().await;
    let staying = Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(1))).await)
        .saga(OneShot(calls.clone()))
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(1)
        .build()
        .await
        .unwrap();
    let task = finish(&staying, id, Duration::from_secs(10)).await;
    assert_eq!(
        task.status,
        TaskStatus::Completed,
        "a redeploy failed the task: {:?}",
        task.error
    );
}

// ---------------------------------------------------------------------------
// J. A panic outside user handlers loops for ever.
// ---------------------------------------------------------------------------

mod bomb {
    use super::*;
    use serde::{Deserialize, Serialize, Serializer};

    /// A value that cannot be saved: its serialization panics (a bug in a
    /// hand-written `Serialize`).
    #[derive(Debug, Default)]
    pub struct Bomb;

    impl Serialize for Bomb {
        fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            panic!("state cannot be saved")
        }
    }

    #[derive(Debug, Default, Serialize, Deserialize)]
    pub struct State {
        #[serde(skip_deserializing)]
        pub bomb: Option<Bomb>,
    }

    #[derive(Message, Serialize, Deserialize)]
    pub struct Arm {
        #[correlation_id]
        pub id: String,
    }

    pub struct Armed;

    #[process_manager(name = "armed", state = State)]
    impl Armed {
        #[starts]
        async fn arm(
            &self,
            _m: Arm,
            s: &mut State,
            _ctx: &mut ProcessContext,
        ) -> Result<(), ProcessError> {
            s.bomb = Some(Bomb);
            Ok(())
        }
    }
}

/// Hypothesis: a panic in the engine's own handling of a message (here:
/// saving a process manager's state whose `Serialize` panics, after the
/// handler returned) is caught by the worker loop and the message handed
/// back as *answered*: it panics again on every delivery, about ten times
/// a second, for ever, and never reaches the delivery cap.
///
/// Not confirmed: the dispatcher catches this panic itself and stops the
/// instance. The worker loop's own catch (a panic counts as an unanswered
/// delivery, dead-lettered at the cap) stays as the backstop for panics
/// nothing inside catches; this test keeps the end-to-end promise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_whose_handling_always_panics_is_dead_lettered_after_the_cap() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(backend_with(&redis.url(), config(Duration::from_secs(1))).await)
        .process_manager(bomb::Armed)
        .timeout_poll_interval(Duration::from_millis(20))
        .max_deliveries(3)
        .workers(1)
        .build()
        .await
        .unwrap();
    engine.publish(bomb::Arm { id: "a".into() }).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let letters = engine
            .dead_letters(Default::default())
            .await
            .unwrap()
            .letters;
        if let Some(letter) = letters.first() {
            assert!(
                letter.reason.contains("panicked")
                    && letter.reason.contains("state cannot be saved"),
                "{}",
                letter.reason
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the message that panics every time was not dead-lettered within 10 s (cap: 3)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
