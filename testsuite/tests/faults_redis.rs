//! Ordinary production faults, against a real redis-server (private per
//! test): each test reproduces one way the engine used to stall, loop or
//! grow, and proves that every started task now ends.

mod common;

use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use redis::Value;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use saga_runtime::{Error, TaskFilter};
use sagas_tests::chaos::{Chaos, ChaosConfig};

struct Double;

#[saga(name = "double")]
impl Double {
    #[saga_step(1)]
    async fn double(&self, n: u32) -> Result<u32, StepError> {
        Ok(n * 2)
    }
}

async fn backend(redis: &TestRedis, visibility: Duration) -> RedisBackend {
    let config = RedisConfig {
        visibility_timeout: visibility,
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    };
    RedisBackend::connect_with(&redis.url(), config)
        .await
        .unwrap()
}

/// Waits for a task with a deadline, so a stalled engine fails the test
/// instead of hanging it.
async fn finish(engine: &Engine, id: TaskId, within: Duration) -> TaskInstance {
    match tokio::time::timeout(within, engine.wait(id)).await {
        Ok(task) => task.unwrap(),
        Err(_) => panic!(
            "task {id} did not finish within {within:?}: {:#?}",
            engine.task(id).await
        ),
    }
}

async fn start_doubles(engine: &Engine, inputs: std::ops::Range<u32>) -> Vec<(u32, TaskId)> {
    let mut ids = Vec::new();
    for n in inputs {
        ids.push((n, engine.start::<Double>(n).await.unwrap()));
    }
    ids
}

async fn all_doubled(engine: &Engine, ids: &[(u32, TaskId)], within: Duration) {
    for (n, id) in ids {
        let task = finish(engine, *id, within).await;
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
        assert_eq!(task.output_as::<u32>().unwrap().unwrap(), n * 2);
    }
}

/// Defect 1: Redis loses its consumer groups (FLUSHALL, a restart without
/// persistence). The claim path used to return `NOGROUP` before the code
/// that recreates groups, and the error backoff never reset: new tasks were
/// accepted and never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_consumer_groups_are_recreated_and_new_tasks_run() {
    let mut redis = TestRedis::start_with_aof(false);
    // Short enough that the claim path is due on every read (it claims
    // every half visibility timeout): that is where NOGROUP used to stick.
    let visibility = Duration::from_millis(100);
    let engine = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .workers(2)
        .build()
        .await
        .unwrap();
    let ids = start_doubles(&engine, 0..3).await;
    all_doubled(&engine, &ids, Duration::from_secs(10)).await;

    // The data and the groups go; the workers' claim path meets NOGROUP.
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
    tokio::time::sleep(visibility * 4).await;
    let ids = start_doubles(&engine, 10..15).await;
    all_doubled(&engine, &ids, Duration::from_secs(10)).await;

    // A restart that keeps nothing.
    redis.restart();
    tokio::time::sleep(visibility * 4).await;
    let ids = start_doubles(&engine, 20..25).await;
    all_doubled(&engine, &ids, Duration::from_secs(15)).await;
}

/// Defect 2: one entry a buggy producer wrote (a field name that is not
/// UTF-8) failed the whole claimed or read batch after ownership had moved:
/// every message in it was stranded, and the bad entry was never
/// dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_entry_is_dead_lettered_alone_and_strands_nothing() {
    let redis = TestRedis::start();
    let visibility = Duration::from_millis(400);
    let client = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .workers(0)
        .build()
        .await
        .unwrap();
    let mut conn = redis.conn();
    let queue = "saga:{saga:0}:queue";
    let bad_field = |conn: &mut redis::Connection| {
        let _: String = redis::cmd("XADD")
            .arg(queue)
            .arg("*")
            .arg(&[0xffu8, 0xfe][..])
            .arg("x")
            .query(conn)
            .unwrap();
    };
    // A batch that a worker read and then died holding: good, bad, good.
    let mut ids = start_doubles(&client, 1..2).await;
    bad_field(&mut conn);
    ids.extend(start_doubles(&client, 2..3).await);
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("a-worker-that-died")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg(queue)
        .arg(">")
        .query(&mut conn)
        .unwrap();
    // And more that a live worker reads itself: a bad entry, a payload
    // that is not UTF-8, a good task.
    bad_field(&mut conn);
    let _: String = redis::cmd("XADD")
        .arg(queue)
        .arg("*")
        .arg("payload")
        .arg(&[0xffu8, b'{'][..])
        .query(&mut conn)
        .unwrap();
    ids.extend(start_doubles(&client, 3..4).await);

    let _workers = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .workers(1)
        .build()
        .await
        .unwrap();
    all_doubled(&client, &ids, Duration::from_secs(10)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let letters = loop {
        let letters = client
            .dead_letters(Default::default())
            .await
            .unwrap()
            .letters;
        if letters.len() >= 3 || Instant::now() > deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(letters.len(), 3, "{letters:#?}");
    assert!(
        letters
            .iter()
            .all(|l| l.reason.starts_with("malformed message")),
        "{letters:#?}"
    );
}

/// Issue 39, finding 2: an undecodable entry (a field name that is not
/// UTF-8) that a dead consumer held beside a real task's message. Two live
/// worker loops take both over at once; the real one runs alone (it comes
/// from a worker that died), and the bad one, handed back for later, was
/// acknowledged and deleted by the hand-back because it had no payload to
/// copy: neither pending nor dead-lettered, in about half the rounds.
/// Repeated (`UNDECODABLE_ROUNDS`, 16 by default: before the fix, at least one
/// round in 12 failed in each of 4 runs) on a fresh server each
/// round; the count is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_entry_taken_over_with_others_is_never_dropped() {
    let rounds: usize = std::env::var("UNDECODABLE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(16);
    eprintln!("undecodable take-over rounds: {rounds} (set UNDECODABLE_ROUNDS to change)");
    for round in 0..rounds {
        undecodable_taken_over_round(round).await;
    }
}

async fn undecodable_taken_over_round(round: usize) {
    let redis = TestRedis::start_with_aof(false);
    let visibility = Duration::from_millis(300);
    let client = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .workers(0)
        .build()
        .await
        .unwrap();
    let mut conn = redis.conn();
    let queue = "saga:{saga:0}:queue";
    let _: String = redis::cmd("XADD")
        .arg(queue)
        .arg("*")
        .arg(&[0xffu8, 0xfe][..])
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let ids = start_doubles(&client, 7..8).await;
    // A consumer reads both and dies without settling either.
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("a-worker-that-died")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg(queue)
        .arg(">")
        .query(&mut conn)
        .unwrap();
    let workers = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .workers(2)
        .build()
        .await
        .unwrap();
    all_doubled(&client, &ids, Duration::from_secs(10)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let letters = loop {
        let letters = client
            .dead_letters(Default::default())
            .await
            .unwrap()
            .letters;
        if !letters.is_empty() || Instant::now() > deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let pending: Vec<Value> = redis::cmd("XPENDING")
        .arg(queue)
        .arg("workers")
        .arg("-")
        .arg("+")
        .arg(10)
        .query(&mut conn)
        .unwrap();
    let entries: Vec<Value> = redis::cmd("XRANGE")
        .arg(queue)
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        letters.len(),
        1,
        "round {round}: the undecodable entry is not among the dead letters \
         ({} pending, {} in the stream): {letters:#?}",
        pending.len(),
        entries.len()
    );
    assert!(
        letters[0].reason.starts_with("malformed message"),
        "round {round}: {letters:#?}"
    );
    workers.shutdown().await;
}

/// The store's own side of finding 2: a delivery handed back (`release`,
/// `defer`, as a worker does on shutdown, or the store with the extras of
/// a read over several streams) whose entry has no payload to copy is
/// dead-lettered with its reason, not settled and lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handing_back_an_entry_without_a_payload_dead_letters_it() {
    use saga_runtime::backend::{DeadLetterQuery, DeadLetters, Interest, WorkQueue};
    let redis = TestRedis::start_with_aof(false);
    let store = backend(&redis, Duration::from_secs(30)).await;
    // The engine creates the consumer groups.
    let _engine = Engine::builder()
        .backend(store.clone())
        .saga(Double)
        .workers(0)
        .build()
        .await
        .unwrap();
    let mut conn = redis.conn();
    for _ in 0..2 {
        let _: String = redis::cmd("XADD")
            .arg("saga:{saga:0}:queue")
            .arg("*")
            .arg(&[0xffu8, 0xfe][..])
            .arg("x")
            .query(&mut conn)
            .unwrap();
    }
    let interest = Interest {
        processes: false,
        ..Interest::ALL
    };
    let wait = Duration::from_millis(100);
    let first = store.receive("c1", interest, wait).await.unwrap().unwrap();
    store.release(&first, Duration::ZERO).await.unwrap();
    let second = store.receive("c1", interest, wait).await.unwrap().unwrap();
    assert_ne!(first.id, second.id);
    store.defer(&second, Duration::from_secs(5)).await.unwrap();
    let query = DeadLetterQuery {
        after: None,
        limit: 10,
    };
    let letters = store.dead_letters(&query).await.unwrap().items;
    assert_eq!(letters.len(), 2, "{letters:#?}");
    assert!(
        letters
            .iter()
            .all(|l| l.reason.starts_with("malformed message")),
        "{letters:#?}"
    );
    let pending: Vec<Value> = redis::cmd("XPENDING")
        .arg("saga:{saga:0}:queue")
        .arg("workers")
        .arg("-")
        .arg("+")
        .arg(10)
        .query(&mut conn)
        .unwrap();
    assert!(pending.is_empty(), "{pending:?}");
}

/// Issue 39, finding 6, on Redis: a task record this version cannot read
/// (a status it does not know, as a newer version may write) is handed
/// back for a version that can, dead-lettered at the cap with a reason,
/// and left out of listings (listing the saga used to fail as a whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_task_record_is_dead_lettered_alone_and_left_out_of_listings() {
    let redis = TestRedis::start_with_aof(false);
    let visibility = Duration::from_secs(8);
    let client = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .workers(0)
        .build()
        .await
        .unwrap();
    let mut good = start_doubles(&client, 1..4).await;
    let bad = client.start::<Double>(99).await.unwrap();
    good.extend(start_doubles(&client, 4..7).await);
    let key = format!("saga:{{saga:0}}:task:{bad}");
    let mut conn = redis.conn();
    let doc: String = redis::cmd("HGET")
        .arg(&key)
        .arg("doc")
        .query(&mut conn)
        .unwrap();
    assert!(doc.contains(r#""status":"Pending""#), "{doc}");
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("doc")
        .arg(doc.replace(r#""status":"Pending""#, r#""status":"Exploded""#))
        .query(&mut conn)
        .unwrap();
    let _workers = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .worker_concurrency(8)
        .max_deliveries(2)
        .lock_retry_delay(Duration::from_millis(50))
        .workers(1)
        .build()
        .await
        .unwrap();
    all_doubled(&client, &good, visibility / 2).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let letter = loop {
        let page = client.dead_letters(Default::default()).await.unwrap();
        if let Some(letter) = page.letters.into_iter().next() {
            break letter;
        }
        assert!(
            Instant::now() < deadline,
            "the unreadable task's message was never dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(letter.task_id, Some(bad), "{letter:#?}");
    assert!(
        letter.reason.contains("cannot read the record") && letter.reason.contains("Exploded"),
        "{letter:#?}"
    );
    let listed = client.tasks_of("double").await.unwrap();
    let ids: Vec<TaskId> = listed.iter().map(|t| t.id).collect();
    assert_eq!(listed.len(), good.len(), "{ids:?}");
    assert!(!ids.contains(&bad));
    let error = client.task(bad).await.unwrap_err().to_string();
    assert!(error.contains("Exploded"), "{error}");
}

fn spawn_worker(url: &str, envs: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_chaos-worker"));
    cmd.env("REDIS_URL", url).env("RUST_LOG", "off");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn chaos-worker")
}

async fn chaos_client(
    redis: &TestRedis,
    visibility: Duration,
) -> (Engine, redis::aio::ConnectionManager) {
    let recorder = redis::Client::open(redis.url().as_str())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let chaos = ChaosConfig {
        max_work: Duration::ZERO,
        failure_rate: 0.0,
        record: true,
        poison: None,
    };
    let engine = Engine::builder()
        .backend(backend(redis, visibility).await)
        .saga(Chaos::new(recorder.clone(), "client", chaos))
        .workers(0)
        .build()
        .await
        .unwrap();
    (engine, recorder)
}

fn consumers(redis: &TestRedis) -> usize {
    let info: Vec<Value> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg("saga:{saga:0}:queue")
        .arg("workers")
        .query(&mut redis.conn())
        .unwrap();
    info.len()
}

/// Defect 3: a message whose handling kills its worker (abort, OOM) was
/// redelivered for ever, and each restart left a dead consumer in the
/// group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_kills_its_worker_is_dead_lettered_after_the_cap() {
    let redis = TestRedis::start();
    let url = redis.url();
    let (client, _) = chaos_client(&redis, Duration::from_millis(500)).await;
    let mut ids = Vec::new();
    for n in 1..=4u64 {
        ids.push(client.start::<Chaos>(n).await.unwrap());
    }
    let poison = client.start::<Chaos>(666).await.unwrap();
    let envs = [
        ("WORKERS", "1"),
        ("POISON", "666"),
        ("MAX_DELIVERIES", "3"),
        ("VISIBILITY_MS", "500"),
        ("MAX_WORK_MS", "0"),
        ("FAILURE_RATE", "0"),
        ("HOUSEKEEPING_MS", "200"),
        ("IDLE_CONSUMER_MS", "1000"),
    ];
    let mut worker = spawn_worker(&url, &envs);
    let mut crashes = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(task) = client.task(poison).await.unwrap() {
            if task.status.is_terminal() {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the poison message was still looping after {crashes} crashes"
        );
        if worker.try_wait().unwrap().is_some() {
            crashes += 1;
            worker = spawn_worker(&url, &envs);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let task = client.task(poison).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::DeadLettered, "{task:#?}");
    let error = task.error.clone().unwrap();
    assert!(
        error.contains("delivered 3 times without completing"),
        "{error}"
    );
    assert!(crashes >= 3, "each delivery killed a worker ({crashes})");
    for id in &ids {
        let task = finish(&client, *id, Duration::from_secs(20)).await;
        assert_eq!(task.status, TaskStatus::Completed, "innocent: {task:#?}");
    }
    let letters = client
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters;
    assert!(
        letters
            .iter()
            .any(|l| l.task_id == Some(poison) && l.reason.contains("delivered 3 times")),
        "{letters:#?}"
    );
    // The consumers the dead workers left behind are removed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while consumers(&redis) > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        consumers(&redis),
        1,
        "only the live worker's consumer stays"
    );
    let _ = worker.kill();
    let _ = worker.wait();
}

/// Defect 4 on Redis: as many hung calls as workers used to stop all
/// progress; a step's attempt now has a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_steps_time_out_and_every_task_still_finishes() {
    struct HangOnce {
        calls: Arc<AtomicUsize>,
    }
    #[saga(name = "hang-once")]
    impl HangOnce {
        #[saga_step(1, timeout_ms = 500)]
        #[retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 10)]
        async fn call(&self, n: u32) -> Result<u32, StepError> {
            // The first two calls (one per worker) never return.
            if self.calls.fetch_add(1, Ordering::SeqCst) < 2 {
                std::future::pending::<()>().await;
            }
            Ok(n)
        }
    }
    let redis = TestRedis::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .backend(backend(&redis, Duration::from_secs(2)).await)
        .saga(HangOnce {
            calls: calls.clone(),
        })
        .stop_grace(Duration::from_millis(100))
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(2)
        .build()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(engine.start::<HangOnce>(n).await.unwrap());
    }
    for id in ids {
        let task = finish(&engine, id, Duration::from_secs(15)).await;
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        7,
        "5 tasks, 2 timed-out attempts"
    );
}

/// Defect 5: a killed worker's tasks used to wait for the lock TTL (5
/// minutes); the lease now expires on the order of the visibility timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_tasks_resume_within_seconds() {
    let redis = TestRedis::start();
    let url = redis.url();
    let (client, mut recorder) = chaos_client(&redis, Duration::from_secs(1)).await;
    let mut ids = Vec::new();
    for n in 0..10u64 {
        ids.push(client.start::<Chaos>(n).await.unwrap());
    }
    // No LOCK_TTL_MS: the engine's default lease.
    let envs = [
        ("WORKERS", "2"),
        ("VISIBILITY_MS", "1000"),
        ("MAX_WORK_MS", "300"),
        ("FAILURE_RATE", "0"),
    ];
    let mut worker = spawn_worker(&url, &envs);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let running = client
            .tasks(TaskFilter::new().saga("chaos").status(TaskStatus::Running))
            .await
            .unwrap()
            .tasks
            .len();
        if running >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "no task started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.kill().unwrap(); // SIGKILL, mid-step
    worker.wait().unwrap();
    let killed_at = Instant::now();
    let mut replacement = spawn_worker(&url, &envs);
    for id in &ids {
        let task = finish(&client, *id, Duration::from_secs(20)).await;
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
        let executions = Chaos::executions(&mut recorder, *id).await.unwrap();
        sagas_tests::chaos::check_task(&task, &executions).unwrap();
    }
    let took = killed_at.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "the killed worker's tasks took {took:?} to finish"
    );
    let _ = replacement.kill();
    let _ = replacement.wait();
}

/// Defect 6: a retry's backoff used to be a sleep inside the lease: it held
/// a worker and the task's lock for the whole delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_backoff_holds_neither_a_worker_nor_the_lock() {
    struct Flaky {
        calls: Arc<AtomicUsize>,
    }
    #[saga(name = "flaky")]
    impl Flaky {
        #[saga_step(1)]
        #[retry_policy(max_retries = 1, backoff = constant, base_delay_ms = 3000)]
        async fn call(&self, n: u32) -> Result<u32, StepError> {
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(StepError::transient("503"));
            }
            Ok(n)
        }
    }
    let redis = TestRedis::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .backend(backend(&redis, Duration::from_secs(2)).await)
        .saga(Flaky {
            calls: calls.clone(),
        })
        .saga(Double)
        .workers(1)
        .build()
        .await
        .unwrap();
    let flaky = engine.start::<Flaky>(1).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    // The only worker is free while the retry waits.
    let double = engine.start::<Double>(21).await.unwrap();
    let task = finish(&engine, double, Duration::from_secs(10)).await;
    assert_eq!(task.output_as::<u32>().unwrap().unwrap(), 42);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the other task waited {:?} for the backoff",
        started.elapsed()
    );
    // And so is the lock: anyone may take it meanwhile.
    let locked = engine
        .backend()
        .lock_and_load(flaky, Duration::from_millis(100))
        .await
        .unwrap()
        .expect("the lock is free during the backoff");
    engine.backend().unlock(&locked.lease).await.unwrap();
    let task = finish(&engine, flaky, Duration::from_secs(10)).await;
    assert_eq!(task.status, TaskStatus::Completed);
    assert!(started.elapsed() >= Duration::from_millis(2500));
}

/// Defect 7: with connections being killed, `wait` failed on the first
/// dropped connection and `start` could fail after creating the task, so a
/// retrying caller made a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_ride_out_killed_connections_and_keyed_starts_are_idempotent() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(backend(&redis, Duration::from_secs(2)).await)
        .saga(Double)
        .workers(2)
        .build()
        .await
        .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kills = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let killer = {
        let (stop, kills) = (stop.clone(), kills.clone());
        let mut conn = redis.conn();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let _: Result<i64, _> = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("normal")
                    .query(&mut conn);
                kills.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(25));
            }
        })
    };
    // The killing is under way before the first call, and goes on until
    // every task has finished: enough tasks that it spans many kills.
    while kills.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let kills_before = kills.load(Ordering::SeqCst);
    let mut ids = Vec::new();
    for n in 0..100u32 {
        let id = if n % 2 == 0 {
            engine.start::<Double>(n).await.unwrap()
        } else {
            engine
                .start_with_key::<Double>(&format!("order-{n}"), n)
                .await
                .unwrap()
        };
        ids.push((n, id));
    }
    all_doubled(&engine, &ids, Duration::from_secs(60)).await;
    let kills = kills.load(Ordering::SeqCst) - kills_before;
    stop.store(true, Ordering::SeqCst);
    killer.join().unwrap();
    assert!(
        kills >= 5,
        "connections were killed only {kills} times during the run"
    );

    let listed = engine
        .tasks(TaskFilter::new().saga("double").limit(1000))
        .await
        .unwrap();
    assert_eq!(listed.tasks.len(), 100, "no start made a second task");
    let again = engine.start_with_key::<Double>("order-1", 1).await.unwrap();
    assert_eq!(again, ids[1].1, "the same key is the same task");
    let reused = engine.start_with_key::<Double>("order-1", 2).await;
    assert!(matches!(reused, Err(Error::KeyReused { .. })), "{reused:?}");
}

/// Defect 10: `release` did nothing on Redis, so a handed-back message (its
/// task was locked) waited a whole visibility timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_back_message_comes_back_promptly() {
    let redis = TestRedis::start();
    let visibility = Duration::from_secs(30);
    let client = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .workers(0)
        .build()
        .await
        .unwrap();
    let id = client.start::<Double>(4).await.unwrap();
    // Another worker holds the task for a moment.
    let held = client
        .backend()
        .lock_and_load(id, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let _workers = Engine::builder()
        .backend(backend(&redis, visibility).await)
        .saga(Double)
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(1)
        .build()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        client.task(id).await.unwrap().unwrap().status,
        TaskStatus::Pending,
        "locked meanwhile"
    );
    client.backend().unlock(&held.lease).await.unwrap();
    let released = Instant::now();
    let task = finish(&client, id, Duration::from_secs(10)).await;
    assert_eq!(task.output_as::<u32>().unwrap().unwrap(), 8);
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "handed back, not left for the {visibility:?} visibility timeout ({:?})",
        released.elapsed()
    );
}

/// Defect 9: nothing was ever deleted. With a retention, every key of a
/// finished task goes, index entries are pruned, dead letters are trimmed,
/// and the server returns to the keys it started with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_tasks_leave_nothing_behind_once_retention_passes() {
    struct Mixed;
    #[saga(name = "mixed")]
    impl Mixed {
        #[saga_step(1)]
        async fn reserve(&self, n: u32) -> Result<u32, StepError> {
            Ok(n)
        }
        #[compensate(reserve)]
        async fn release(&self, _n: u32) -> Result<(), StepError> {
            Ok(())
        }
        #[saga_step(2)]
        #[retry_policy(max_retries = 1, backoff = constant, base_delay_ms = 10, on_exhausted = compensate)]
        async fn charge(&self, n: u32) -> Result<u32, StepError> {
            match n % 3 {
                0 => Ok(n),
                1 => Err(StepError::transient("declined")),
                _ => Err(StepError::permanent("fraud")),
            }
        }
    }
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(backend(&redis, Duration::from_secs(2)).await)
        .saga(Mixed)
        .retention(Some(Duration::from_millis(500)))
        .attention_retention(Some(Duration::from_millis(500)))
        .housekeeping_interval(Duration::from_millis(100))
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(2)
        .build()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let baseline = redis.keys();
    let mut ids = Vec::new();
    for n in 0..30 {
        ids.push(engine.start::<Mixed>(n).await.unwrap());
    }
    for id in &ids {
        let task = finish(&engine, *id, Duration::from_secs(10)).await;
        assert!(task.status.is_terminal());
    }
    engine.backend().enqueue_raw(b"garbage").await.unwrap();
    assert!(
        redis.keys().len() > baseline.len() + 30,
        "the tasks were stored"
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    let leftover = loop {
        let keys = redis.keys();
        let leftover: Vec<String> = keys
            .into_iter()
            .filter(|k| !baseline.contains(k) && !k.contains(":lease:"))
            .collect();
        if leftover.is_empty() || Instant::now() > deadline {
            break leftover;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(leftover.is_empty(), "left behind: {leftover:?}");
    for id in &ids {
        assert!(engine.task(*id).await.unwrap().is_none());
    }
    assert!(engine
        .tasks(TaskFilter::new().saga("mixed"))
        .await
        .unwrap()
        .tasks
        .is_empty());
    assert!(engine
        .dead_letters(Default::default())
        .await
        .unwrap()
        .letters
        .is_empty());
}
