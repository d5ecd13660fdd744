//! Invariants 1-3, 6 and 10 under fire on PostgreSQL, as `tests/chaos.rs`
//! proves them on Redis: 500 tasks run on worker processes that are
//! SIGKILLed at random, while the engines' connections are terminated
//! (`pg_terminate_backend`, the analogue of `CLIENT KILL`) and the server
//! itself crashes (`pg_ctl stop -m immediate`) and restarts once. Every
//! task ends, no step whose completion was recorded runs again, no two
//! executions of a task overlap, and no error reaches a caller that used
//! the retrying client API.
//!
//! Executions are recorded on a private Redis out of the faults' way. The
//! run prints its seed; `CHAOS_SEED=<seed> cargo test --test
//! chaos_postgres -- --nocapture` replays the same schedule of faults.

mod common;

use std::collections::HashMap;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::postgres_server::TestPostgres;
use common::redis_server::TestRedis;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::{Engine, TaskId, TaskStatus};
use sagas_tests::chaos::{check_task, Chaos, ChaosConfig};

const TASKS: u64 = 500;
/// Faults of each kind (SIGKILLs, connection kills) injected before the
/// last task is started: starts are paced by them, so that the faults are
/// spread over the run however fast the tasks go.
const PACED_FAULTS: u64 = 6;
const WORKER_PROCESSES: usize = 3;
const VISIBILITY_MS: u64 = 800;

/// Worker process `slot`: the first works on 4 messages at once per worker
/// (with a poison cap raised to match), the others on one.
fn spawn_worker(url: &str, record: &str, slot: usize) -> Child {
    let (concurrency, cap) = if slot == 0 { ("4", "20") } else { ("1", "10") };
    Command::new(env!("CARGO_BIN_EXE_chaos-worker"))
        .env("BACKEND_URL", url)
        .env("RECORD_URL", record)
        .env("WORKERS", "2")
        .env("CONCURRENCY", concurrency)
        .env("MAX_DELIVERIES", cap)
        .env("VISIBILITY_MS", VISIBILITY_MS.to_string())
        .env("POLL_MS", "100")
        .env("MAX_WORK_MS", "30")
        .env("FAILURE_RATE", "0.1")
        .env("RUST_LOG", "off")
        .spawn()
        .expect("spawn chaos-worker")
}

/// Terminates every connection of the engines (theirs are named
/// `saga-runtime`); how many, or `None` when the server did not answer.
fn terminate_connections(pg: &TestPostgres) -> Option<usize> {
    let sql = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
               WHERE application_name = 'saga-runtime' AND pid <> pg_backend_pid()";
    pg.try_psql(sql).ok()?.parse().ok()
}

fn seed() -> u64 {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("chaos seed: {seed} (replay with CHAOS_SEED={seed})");
    seed
}

/// Callers start and wait for every task through the retrying client API
/// while the faults happen; any error they see is recorded. Starts are
/// paced by the faults injected so far.
fn spawn_callers(
    client: &Engine,
    faults: &Arc<AtomicU64>,
    ids: &Arc<Mutex<Vec<TaskId>>>,
    errors: &Arc<Mutex<Vec<String>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..4u64)
        .map(|lane| {
            let (client, errors, ids) = (client.clone(), errors.clone(), ids.clone());
            let faults = faults.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                for n in (lane..TASKS).step_by(4) {
                    while faults.load(Ordering::SeqCst) < n * PACED_FAULTS / TASKS {
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
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_ends_under_kills_terminated_connections_and_a_postgres_crash() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let began = Instant::now();

    let mut pg = TestPostgres::start();
    let url = pg.url();
    let record = TestRedis::start_with_aof(false);
    let mut recorder = redis::Client::open(record.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let config = PostgresConfig {
        visibility_timeout: Duration::from_millis(VISIBILITY_MS),
        poll_interval: Duration::from_millis(100),
        ..PostgresConfig::default()
    };
    let chaos = ChaosConfig {
        max_work: Duration::ZERO,
        failure_rate: 0.0,
        record: true,
        poison: None,
    };
    let client = Engine::builder()
        .backend(PostgresBackend::connect_url(&url, config).await.unwrap())
        .saga(Chaos::new(recorder.clone(), "driver", chaos))
        .workers(0)
        .build()
        .await
        .unwrap();

    let mut workers: Vec<Child> = (0..WORKER_PROCESSES)
        .map(|slot| spawn_worker(&url, &record.url(), slot))
        .collect();
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let ids = Arc::new(Mutex::new(Vec::<TaskId>::new()));
    let faults = Arc::new(AtomicU64::new(0));
    let callers = spawn_callers(&client, &faults, &ids, &errors);

    let deadline = Instant::now() + Duration::from_secs(180);
    let (mut sigkills, mut terminations, mut terminated, mut crashed) = (0, 0, 0, false);
    let mut exited = Vec::new();
    loop {
        if callers.iter().all(|c| c.is_finished()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tasks still unfinished after {sigkills} SIGKILLs, {terminations} terminations (seed {seed})"
        );
        tokio::time::sleep(Duration::from_millis(rng.gen_range(100..400))).await;
        // A worker ends only when killed: one that gave up by itself (on a
        // store it could not reach) is a failure, replaced to go on.
        for (slot, worker) in workers.iter_mut().enumerate() {
            if let Some(status) = worker.try_wait().unwrap() {
                exited.push(format!("worker {slot} exited by itself: {status}"));
                *worker = spawn_worker(&url, &record.url(), slot);
            }
        }
        let started = ids.lock().unwrap().len() as u64;
        if !crashed && started > TASKS / 3 {
            // The server crashes (no checkpoint, every connection cut) and
            // is down for a moment: what it committed survives the restart.
            let down = Duration::from_millis(rng.gen_range(200..1500));
            tokio::task::block_in_place(|| {
                pg.crash();
                std::thread::sleep(down);
                pg.restart();
            });
            eprintln!(
                "postgres crashed at {} us, down {down:?}, restarted",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_micros()
                    - down.as_micros()
            );
            crashed = true;
            continue;
        }
        match rng.gen_range(0..100) {
            0..=54 if sigkills < 40 => {
                let victim = rng.gen_range(0..workers.len());
                workers[victim].kill().unwrap(); // SIGKILL
                workers[victim].wait().unwrap();
                workers[victim] = spawn_worker(&url, &record.url(), victim);
                sigkills += 1;
            }
            55..=89 => {
                if let Some(n) = tokio::task::block_in_place(|| terminate_connections(&pg)) {
                    terminations += 1;
                    terminated += n;
                }
            }
            _ => {}
        }
        faults.store(sigkills.min(terminations), Ordering::SeqCst);
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
    assert!(exited.is_empty(), "seed {seed}: {exited:#?}");
    assert!(crashed, "PostgreSQL crashed and restarted once");
    assert!(sigkills >= 5, "workers were killed ({sigkills})");
    assert!(
        terminations >= 5 && terminated >= 5 * WORKER_PROCESSES,
        "connections were terminated ({terminations} times, {terminated} connections)"
    );

    let ids = ids.lock().unwrap().clone();
    assert_eq!(ids.len() as u64, TASKS);
    let mut by_status: HashMap<TaskStatus, usize> = HashMap::new();
    for id in &ids {
        let task = client.task(*id).await.unwrap().unwrap();
        *by_status.entry(task.status).or_default() += 1;
        let executions = Chaos::executions(&mut recorder, *id).await.unwrap();
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
        "seed {seed}: {} tasks, {sigkills} SIGKILLs, {terminations} terminations \
         ({terminated} connections), 1 PostgreSQL crash; statuses {by_status:?}; took {:?}",
        ids.len(),
        began.elapsed()
    );
}
