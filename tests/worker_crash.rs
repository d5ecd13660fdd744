//! Invariants 1-3 under fire: worker processes running 200 tasks are killed
//! with SIGKILL at random moments, again and again, and replaced. Every task
//! reaches a terminal status; no step whose completion was recorded ran
//! again; no two executions of a task overlapped.

mod common;

use std::collections::HashMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use rand::Rng;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::{Engine, TaskStatus};
use sagas::chaos::{check_task, Chaos, ChaosConfig};

fn spawn_worker(url: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_chaos-worker"))
        .env("REDIS_URL", url)
        .env("WORKERS", "2")
        .env("LOCK_TTL_MS", "1500")
        .env("VISIBILITY_MS", "800")
        .env("MAX_WORK_MS", "60")
        .env("FAILURE_RATE", "0.1")
        .env("RUST_LOG", "off")
        .spawn()
        .expect("spawn chaos-worker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_workers_at_random_loses_and_duplicates_nothing() {
    let redis = TestRedis::start();
    let url = redis.url();
    let config = RedisConfig {
        visibility_timeout: Duration::from_millis(800),
        ..RedisConfig::default()
    };
    let backend = RedisBackend::connect_with(&url, config).await.unwrap();
    let mut recorder = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let chaos = ChaosConfig {
        max_work: Duration::ZERO,
        failure_rate: 0.0,
        record: true,
    };
    let client = Engine::builder()
        .backend(backend)
        .saga(Chaos::new(recorder.clone(), "driver", chaos))
        .workers(0)
        .build()
        .await
        .unwrap();

    let mut workers: Vec<Child> = (0..3).map(|_| spawn_worker(&url)).collect();
    let mut ids = Vec::new();
    for n in 0..200u64 {
        ids.push(client.start::<Chaos>(n).await.unwrap());
    }

    let deadline = Instant::now() + Duration::from_secs(150);
    let mut kills = 0;
    let mut rng = rand::thread_rng().gen::<u64>();
    loop {
        let tasks = client.tasks_of("chaos").await.unwrap();
        let unfinished = tasks.iter().filter(|t| !t.status.is_terminal()).count();
        if unfinished == 0 && tasks.len() == ids.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{unfinished} tasks never finished after {kills} kills"
        );
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        tokio::time::sleep(Duration::from_millis(100 + (rng >> 33) % 250)).await;
        if kills < 40 {
            let victim = (rng >> 40) as usize % workers.len();
            workers[victim].kill().unwrap(); // SIGKILL
            workers[victim].wait().unwrap();
            workers[victim] = spawn_worker(&url);
            kills += 1;
        }
    }
    for w in &mut workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    assert!(
        kills >= 5,
        "the run must actually have killed workers (killed {kills})"
    );

    let mut by_status: HashMap<TaskStatus, usize> = HashMap::new();
    for id in &ids {
        let task = client.task(*id).await.unwrap().unwrap();
        *by_status.entry(task.status).or_default() += 1;
        let executions = Chaos::executions(&mut recorder, *id).await.unwrap();
        if let Err(violation) = check_task(&task, &executions) {
            panic!("{violation}");
        }
        assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
        assert_eq!(
            task.output_as::<u64>().unwrap().unwrap(),
            task.input.as_u64().unwrap() + 3
        );
    }
    eprintln!(
        "{} tasks, {kills} SIGKILLs, statuses {by_status:?}",
        ids.len()
    );
}
