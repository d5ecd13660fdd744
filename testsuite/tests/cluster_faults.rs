//! Redis Cluster under fire, on a real local cluster (three primaries,
//! three replicas):
//!
//! - worker processes SIGKILLed at random: every task ends, no step whose
//!   completion was recorded runs again, no two executions of a task
//!   overlap (invariants 1-3);
//! - a primary SIGKILLed mid-run: its replica takes over, every task ends
//!   (replication is asynchronous: a step whose completion the old
//!   primary had not passed on yet may run again, so only "ends, each
//!   last step at least once" holds across a failover);
//! - slots moved between primaries mid-run (`redis-cli --cluster
//!   reshard`): redirects are followed and nothing is lost or run twice.
//!
//! Executions are recorded on a separate single server, out of the faults'
//! way. Each run prints its seed; `CHAOS_SEED=<seed>` replays it.

mod common;

use std::collections::HashMap;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::redis_cluster::TestCluster;
use common::redis_server::TestRedis;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use sagas_tests::chaos::{check_task, Chaos, ChaosConfig};

fn seed() -> u64 {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("chaos seed: {seed} (replay with CHAOS_SEED={seed})");
    seed
}

fn config() -> RedisConfig {
    RedisConfig {
        visibility_timeout: Duration::from_millis(1000),
        block: Duration::from_millis(100),
        response_timeout: Duration::from_secs(2),
        ..RedisConfig::default()
    }
}

async fn backend(cluster: &TestCluster) -> RedisBackend {
    cluster.backend(config()).await
}

async fn recorder(record: &TestRedis) -> redis::aio::ConnectionManager {
    redis::Client::open(record.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap()
}

/// Starts `n` tasks; any error is a failure.
async fn start_tasks(engine: &Engine, n: u64) -> Vec<TaskId> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(engine.start::<Chaos>(i).await.expect("start"));
    }
    ids
}

/// Every task completed, each step's executions consistent with what its
/// record says (no re-run after a recorded completion, no overlap).
async fn check_all(engine: &Engine, record: &TestRedis, ids: &[TaskId], seed: u64) {
    let mut recorder = recorder(record).await;
    let mut by_status: HashMap<TaskStatus, usize> = HashMap::new();
    for id in ids {
        let task = match tokio::time::timeout(Duration::from_secs(90), engine.wait(*id)).await {
            Ok(Ok(task)) => task,
            Ok(Err(e)) => panic!("task {id}: {e} (seed {seed})"),
            Err(_) => panic!("task {id} did not end (seed {seed})"),
        };
        *by_status.entry(task.status).or_default() += 1;
        let executions = Chaos::executions(&mut recorder, *id).await.unwrap();
        if let Err(violation) = check_task(&task, &executions) {
            panic!("{violation} (seed {seed})");
        }
        assert_eq!(task.status, TaskStatus::Completed, "seed {seed}: {task:#?}");
    }
    eprintln!("seed {seed}: statuses {by_status:?}");
}

fn spawn_worker(url: &str, record: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_chaos-worker"))
        .env("REDIS_URL", url)
        .env("RECORD_URL", record)
        .env("WORKERS", "2")
        .env("CONCURRENCY", "2")
        .env("MAX_DELIVERIES", "20")
        .env("VISIBILITY_MS", "1000")
        .env("MAX_WORK_MS", "30")
        .env("FAILURE_RATE", "0.1")
        .env("RUST_LOG", "off")
        .spawn()
        .expect("spawn chaos-worker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_ends_when_workers_are_killed_on_a_cluster() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let cluster = TestCluster::start();
    let record = TestRedis::start_with_aof(false);
    let chaos = ChaosConfig {
        max_work: Duration::ZERO,
        failure_rate: 0.0,
        record: true,
        poison: None,
    };
    let client = Engine::builder()
        .backend(backend(&cluster).await)
        .saga(Chaos::new(recorder(&record).await, "driver", chaos))
        .workers(0)
        .build()
        .await
        .unwrap();
    let mut workers: Vec<Child> = (0..3)
        .map(|_| spawn_worker(&cluster.url(), &record.url()))
        .collect();
    let mut ids = start_tasks(&client, 200).await;
    let mut kills = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut unfinished = 0;
        for id in &ids {
            let task = client.task(*id).await.unwrap().unwrap();
            unfinished += usize::from(!task.status.is_terminal());
        }
        if unfinished == 0 && kills >= 3 {
            break;
        }
        if unfinished == 0 {
            // The workers finished before three of them were killed
            // mid-run (a fast machine): another wave, so that every kill
            // counted lands while tasks are in flight.
            ids.extend(start_tasks(&client, 100).await);
            continue;
        }
        assert!(
            Instant::now() < deadline,
            "{unfinished} tasks unfinished after {kills} SIGKILLs (seed {seed})"
        );
        tokio::time::sleep(Duration::from_millis(rng.gen_range(100..400))).await;
        if kills < 12 {
            let victim = rng.gen_range(0..workers.len());
            workers[victim].kill().unwrap(); // SIGKILL
            workers[victim].wait().unwrap();
            workers[victim] = spawn_worker(&cluster.url(), &record.url());
            kills += 1;
        }
    }
    assert!(kills >= 3, "workers were killed ({kills}, seed {seed})");
    check_all(&client, &record, &ids, seed).await;
    for w in &mut workers {
        let _ = w.kill();
        let _ = w.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_mid_run_loses_nothing_and_runs_nothing_twice() {
    let seed = seed();
    let cluster = TestCluster::start();
    let record = TestRedis::start_with_aof(false);
    let chaos = ChaosConfig {
        max_work: Duration::from_millis(20),
        failure_rate: 0.05,
        record: true,
        poison: None,
    };
    let engine = Engine::builder()
        .backend(backend(&cluster).await)
        .saga(Chaos::new(recorder(&record).await, "engine", chaos))
        .workers(2)
        .worker_concurrency(4)
        .build()
        .await
        .unwrap();
    // Tasks keep starting while the slots move.
    let moving = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let starter = tokio::spawn({
        let (engine, moving) = (engine.clone(), moving.clone());
        async move {
            let mut ids = Vec::new();
            let mut n = 0;
            while moving.load(std::sync::atomic::Ordering::SeqCst) || n < 100 {
                ids.push(engine.start::<Chaos>(n).await.expect("start"));
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            ids
        }
    });
    let (before, after) = tokio::task::block_in_place(|| {
        std::thread::sleep(Duration::from_millis(300));
        let before = cluster.used_slots();
        // A third of one primary's slots to another, then half of another
        // primary's to the first: partitions move while their tasks run.
        let primaries = cluster.primaries();
        let (a, b, c) = (primaries[0], primaries[1], primaries[2]);
        cluster.reshard(a, b, 2000);
        cluster.reshard(c, a, 2500);
        cluster.wait_healthy();
        (before, cluster.used_slots())
    });
    moving.store(false, std::sync::atomic::Ordering::SeqCst);
    let ids = starter.await.unwrap();
    let moved = before
        .iter()
        .filter(|(slot, port)| after.get(slot).is_some_and(|p| p != *port))
        .count();
    assert!(
        moved > 0,
        "no partition in use moved: the test proves nothing ({before:?} -> {after:?})"
    );
    check_all(&engine, &record, &ids, seed).await;
    eprintln!("{} tasks; {moved} partitions in use moved", ids.len());
    engine.shutdown().await;
}

/// Three steps of 40 ms, retried (an attempt whose worker lost its lease
/// in the failover is a failed attempt); the last step's effects are
/// counted by input.
struct Slow {
    done: Arc<Mutex<HashMap<u64, usize>>>,
}

#[saga(name = "slow")]
impl Slow {
    #[saga_step(1)]
    #[retry_policy(max_retries = 10, backoff = constant, base_delay_ms = 100)]
    async fn one(&self, n: u64) -> Result<u64, StepError> {
        tokio::time::sleep(Duration::from_millis(40)).await;
        Ok(n)
    }
    #[saga_step(2)]
    #[retry_policy(max_retries = 10, backoff = constant, base_delay_ms = 100)]
    async fn two(&self, n: u64) -> Result<u64, StepError> {
        tokio::time::sleep(Duration::from_millis(40)).await;
        Ok(n)
    }
    #[saga_step(3)]
    #[retry_policy(max_retries = 10, backoff = constant, base_delay_ms = 100)]
    async fn three(&self, n: u64) -> Result<u64, StepError> {
        tokio::time::sleep(Duration::from_millis(40)).await;
        *self.done.lock().unwrap().entry(n).or_default() += 1;
        Ok(n)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_ends_across_a_primary_failover() {
    let mut cluster = TestCluster::start();
    let done = Arc::new(Mutex::new(HashMap::new()));
    let engine = Engine::builder()
        .backend(backend(&cluster).await)
        .saga(Slow { done: done.clone() })
        .workers(2)
        .worker_concurrency(4)
        .build()
        .await
        .unwrap();
    const TASKS: u64 = 60;
    let mut ids = Vec::new();
    for n in 0..TASKS {
        ids.push(engine.start::<Slow>(n).await.unwrap());
    }
    let (old, new) = tokio::task::block_in_place(|| {
        // What was acknowledged up to here survives the failover.
        cluster.wait_replicated();
        std::thread::sleep(Duration::from_millis(300));
        let victim = cluster.primaries()[0];
        let slot = cluster.first_slot_of(victim);
        cluster.kill(victim);
        let new = cluster.wait_failover(victim, slot);
        // The old primary comes back (empty: no persistence) a moment
        // later, and rejoins as a replica of the one that replaced it.
        std::thread::sleep(Duration::from_millis(1000));
        cluster.restart(victim);
        (victim, new)
    });
    let late = engine.start::<Slow>(TASKS).await.unwrap();
    ids.push(late);
    for id in &ids {
        let task = match tokio::time::timeout(Duration::from_secs(90), engine.wait(*id)).await {
            Ok(Ok(task)) => task,
            Ok(Err(e)) => panic!("task {id}: {e} (failover {old} -> {new})"),
            Err(_) => panic!("task {id} did not end after the failover {old} -> {new}"),
        };
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
    }
    let done = done.lock().unwrap().clone();
    for n in 0..=TASKS {
        assert!(
            done.get(&n).copied().unwrap_or(0) >= 1,
            "task {n}'s last step never ran: {done:?}"
        );
    }
    engine.shutdown().await;
}
