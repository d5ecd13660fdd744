//! Invariants 1-3, 6 and 10 under fire, once for every store: 500 tasks
//! run on worker processes that are SIGKILLed at random, while the
//! engines' connections are cut (`CLIENT KILL`, `pg_terminate_backend`)
//! and the server itself crashes and restarts once, keeping what it
//! acknowledged. Every task ends, no step whose completion was recorded
//! runs again, no two executions of a task overlap, no worker gives up by
//! itself, and no error reaches a caller that used the retrying client API.
//!
//! Executions are recorded on a private Redis out of the faults' way. The
//! run prints its seed and takes it back from `CHAOS_SEED`.

use std::collections::HashMap;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use saga_runtime::{Engine, TaskId, TaskStatus};
use sagas_tests::chaos::{check_task, Chaos, ChaosConfig};

use crate::common::redis_server::TestRedis;
use crate::common::stores::ScenarioStore;

const TASKS: u64 = 500;
/// Faults of each kind (SIGKILLs, connection cuts) injected before the
/// last task is started: starts are paced by them, so that the faults are
/// spread over the run however fast the tasks go.
const PACED_FAULTS: u64 = 6;
const WORKER_PROCESSES: usize = 3;
const VISIBILITY_MS: u64 = 800;

/// One chaos run at a time in a test binary: each loads both cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

/// What the fault loop did.
#[derive(Default)]
struct Injected {
    sigkills: usize,
    cuts: usize,
    cut: usize,
    crashed: bool,
    exited: Vec<String>,
}

/// Injects faults at random (`rng`) until every caller is done: SIGKILLs
/// of workers, cuts of the engines' connections, and one crash of the
/// server once a third of the tasks are started.
async fn inject<S: ScenarioStore>(
    store: &mut S,
    record: &str,
    rng: &mut StdRng,
    callers: &[tokio::task::JoinHandle<()>],
    ids: &Arc<Mutex<Vec<TaskId>>>,
    faults: &Arc<AtomicU64>,
    seed: u64,
) -> Injected {
    let url = store.url();
    let mut workers: Vec<Child> = (0..WORKER_PROCESSES)
        .map(|slot| spawn_worker(&url, record, slot))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut done = Injected::default();
    while !callers.iter().all(|c| c.is_finished()) {
        assert!(
            Instant::now() < deadline,
            "tasks still unfinished after {} SIGKILLs, {} cuts (seed {seed})",
            done.sigkills,
            done.cuts
        );
        tokio::time::sleep(Duration::from_millis(rng.gen_range(100..400))).await;
        // A worker ends only when killed: one that gave up by itself (on a
        // store it could not reach) is a failure, replaced to go on.
        for (slot, worker) in workers.iter_mut().enumerate() {
            if let Some(status) = worker.try_wait().unwrap() {
                done.exited
                    .push(format!("worker {slot} exited by itself: {status}"));
                *worker = spawn_worker(&url, record, slot);
            }
        }
        if !done.crashed && ids.lock().unwrap().len() as u64 > TASKS / 3 {
            // The server crashes and is down for a moment: what it
            // acknowledged survives the restart.
            let down = Duration::from_millis(rng.gen_range(200..1500));
            tokio::task::block_in_place(|| {
                store.crash();
                std::thread::sleep(down);
                store.restart();
            });
            eprintln!("the server crashed, was down {down:?}, restarted");
            done.crashed = true;
            continue;
        }
        match rng.gen_range(0..100) {
            0..=54 if done.sigkills < 40 => {
                let victim = rng.gen_range(0..workers.len());
                workers[victim].kill().unwrap(); // SIGKILL
                workers[victim].wait().unwrap();
                workers[victim] = spawn_worker(&url, record, victim);
                done.sigkills += 1;
            }
            55..=89 => {
                let cut = tokio::task::block_in_place(|| store.kill_connections());
                done.cuts += 1;
                done.cut += cut;
            }
            _ => {}
        }
        faults.store(done.sigkills.min(done.cuts) as u64, Ordering::SeqCst);
    }
    for w in &mut workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    done
}

pub async fn every_task_ends_under_sigkills_cut_connections_and_a_server_crash<S: ScenarioStore>() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let began = Instant::now();

    let mut store = S::start();
    let record = TestRedis::start_with_aof(false);
    let mut recorder = redis::Client::open(record.url())
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
        .backend_arc(store.backend(Duration::from_millis(VISIBILITY_MS)).await)
        .saga(Chaos::new(recorder.clone(), "driver", chaos))
        .workers(0)
        .build()
        .await
        .unwrap();
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let ids = Arc::new(Mutex::new(Vec::<TaskId>::new()));
    let faults = Arc::new(AtomicU64::new(0));
    let callers = spawn_callers(&client, &faults, &ids, &errors);
    let record_url = record.url();
    let done = inject(
        &mut store,
        &record_url,
        &mut rng,
        &callers,
        &ids,
        &faults,
        seed,
    )
    .await;
    for caller in callers {
        caller.await.unwrap();
    }
    let errors = errors.lock().unwrap().clone();
    assert!(
        errors.is_empty(),
        "callers saw errors (seed {seed}): {errors:#?}"
    );
    assert!(done.exited.is_empty(), "seed {seed}: {:#?}", done.exited);
    assert!(done.crashed, "the server crashed and restarted once");
    assert!(
        done.sigkills >= 5,
        "workers were killed ({})",
        done.sigkills
    );
    assert!(
        done.cuts >= 5 && done.cut >= 5 * WORKER_PROCESSES,
        "connections were cut ({} times, {} connections)",
        done.cuts,
        done.cut
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
        "seed {seed}: {} tasks, {} SIGKILLs, {} cuts ({} connections), 1 crash; statuses \
         {by_status:?}; took {:?}",
        ids.len(),
        done.sigkills,
        done.cuts,
        done.cut,
        began.elapsed()
    );
}
