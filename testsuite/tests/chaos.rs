//! Invariants 1-3, 6 and 10 under fire, against a real redis-server: 500
//! tasks run on worker processes that are SIGKILLed at random, while Redis
//! connections are killed (`CLIENT KILL TYPE normal`) and Redis itself is
//! restarted once (append-only file on). Every task ends, no step whose
//! completion was recorded runs again, no two executions of a task overlap,
//! and no error reaches a caller that used the retrying client API.
//!
//! The run prints its seed; `CHAOS_SEED=<seed> cargo test --test chaos --
//! --nocapture` replays the same schedule of faults.

mod common;

use std::collections::HashMap;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::{Engine, TaskId, TaskStatus};
use sagas_tests::chaos::{check_task, Chaos, ChaosConfig};

const TASKS: u64 = 500;
/// Faults of each kind (SIGKILLs, connection kills) injected before the
/// last task is started: starts are paced by them, so that the faults are
/// spread over the run however fast the tasks go.
const PACED_FAULTS: u64 = 6;
const WORKER_PROCESSES: usize = 3;

/// Worker process `slot`: the first works on 4 messages at once per worker
/// (with a poison cap raised to match), the others on one.
fn spawn_worker(url: &str, slot: usize) -> Child {
    let (concurrency, cap) = if slot == 0 { ("4", "20") } else { ("1", "10") };
    Command::new(env!("CARGO_BIN_EXE_chaos-worker"))
        .env("REDIS_URL", url)
        .env("WORKERS", "2")
        .env("CONCURRENCY", concurrency)
        .env("MAX_DELIVERIES", cap)
        .env("VISIBILITY_MS", "800")
        .env("MAX_WORK_MS", "30")
        .env("FAILURE_RATE", "0.1")
        .env("RUST_LOG", "off")
        .spawn()
        .expect("spawn chaos-worker")
}

fn client_kill(redis: &TestRedis) -> bool {
    let Ok(client) = redis::Client::open(redis.url()) else {
        return false;
    };
    let Ok(mut conn) = client.get_connection() else {
        return false;
    };
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query::<i64>(&mut conn)
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_ends_under_kills_dropped_connections_and_a_redis_restart() {
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("chaos seed: {seed} (replay with CHAOS_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);

    let mut redis = TestRedis::start();
    let url = redis.url();
    let config = RedisConfig {
        visibility_timeout: Duration::from_millis(800),
        ..RedisConfig::default()
    };
    let mut recorder = redis::Client::open(url.as_str())
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
    let client = Engine::builder()
        .backend(RedisBackend::connect_with(&url, config).await.unwrap())
        .saga(Chaos::new(recorder.clone(), "driver", chaos))
        .workers(0)
        .build()
        .await
        .unwrap();

    let mut workers: Vec<Child> = (0..WORKER_PROCESSES)
        .map(|slot| spawn_worker(&url, slot))
        .collect();

    // Callers start and wait for every task through the retrying client
    // API while the faults happen; any error they see is a failure.
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let ids = Arc::new(Mutex::new(Vec::<TaskId>::new()));
    // Starts are paced by the faults injected so far, so that the faults
    // are spread over the whole run however fast the tasks go.
    let faults = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut callers = Vec::new();
    for lane in 0..4u64 {
        let (client, errors, ids) = (client.clone(), errors.clone(), ids.clone());
        let faults = faults.clone();
        callers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for n in (lane..TASKS).step_by(4) {
                while faults.load(std::sync::atomic::Ordering::SeqCst) < n * PACED_FAULTS / TASKS {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let started = if n % 2 == 0 {
                    client.start::<Chaos>(n).await
                } else {
                    client.start_with_key::<Chaos>(&format!("job-{n}"), n).await
                };
                match started {
                    Ok(id) => {
                        ids.lock().unwrap().push(id);
                        mine.push(id);
                    }
                    Err(e) => errors.lock().unwrap().push(format!("start {n}: {e}")),
                }
            }
            for id in mine {
                if let Err(e) = client.wait(id).await {
                    errors.lock().unwrap().push(format!("wait {id}: {e}"));
                }
            }
        }));
    }

    let deadline = Instant::now() + Duration::from_secs(240);
    let (mut sigkills, mut client_kills, mut restarted) = (0, 0, false);
    loop {
        if callers.iter().all(|c| c.is_finished()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tasks still unfinished after {sigkills} SIGKILLs, {client_kills} connection kills (seed {seed})"
        );
        tokio::time::sleep(Duration::from_millis(rng.gen_range(100..400))).await;
        let started = ids.lock().unwrap().len() as u64;
        if !restarted && started > TASKS / 3 {
            // Redis restarts (AOF, fsync always): nothing acknowledged is lost.
            redis.restart();
            restarted = true;
            continue;
        }
        match rng.gen_range(0..100) {
            0..=54 if sigkills < 40 => {
                let victim = rng.gen_range(0..workers.len());
                workers[victim].kill().unwrap(); // SIGKILL
                workers[victim].wait().unwrap();
                workers[victim] = spawn_worker(&url, victim);
                sigkills += 1;
            }
            55..=89 if client_kill(&redis) => client_kills += 1,
            _ => {}
        }
        faults.store(
            sigkills.min(client_kills),
            std::sync::atomic::Ordering::SeqCst,
        );
    }
    for caller in callers {
        caller.await.unwrap();
    }
    for w in &mut workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    let errors = errors.lock().unwrap().clone();
    assert!(
        errors.is_empty(),
        "callers saw errors (seed {seed}): {errors:#?}"
    );
    assert!(restarted, "Redis was restarted once");
    assert!(sigkills >= 5, "workers were killed ({sigkills})");
    assert!(
        client_kills >= 5,
        "connections were killed ({client_kills})"
    );

    let ids = ids.lock().unwrap().clone();
    assert_eq!(ids.len() as u64, TASKS);
    let mut by_status: HashMap<TaskStatus, usize> = HashMap::new();
    for id in &ids {
        let task = client.task(*id).await.unwrap().unwrap();
        *by_status.entry(task.status).or_default() += 1;
        // The recorder's connection may have been killed last: retry once.
        let executions = match Chaos::executions(&mut recorder, *id).await {
            Ok(e) => e,
            Err(_) => Chaos::executions(&mut recorder, *id).await.unwrap(),
        };
        if let Err(violation) = check_task(&task, &executions) {
            panic!("{violation} (seed {seed})");
        }
        assert_eq!(task.status, TaskStatus::Completed, "seed {seed}: {task:#?}");
        assert_eq!(
            task.output_as::<u64>().unwrap().unwrap(),
            task.input.as_u64().unwrap() + 3
        );
    }
    eprintln!(
        "seed {seed}: {} tasks, {sigkills} SIGKILLs, {client_kills} connection kills, 1 Redis restart; statuses {by_status:?}",
        ids.len()
    );
}
