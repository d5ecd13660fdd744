//! What a scenario runs on: a store's private server, a Redis recording
//! what the `chaos` saga's steps did, and worker processes on the store.

use std::process::{Child, Command};
use std::time::Duration;

use saga_runtime::prelude::*;
use sagas_tests::chaos::{check_task, Chaos, ChaosConfig};

use crate::common::redis_server::TestRedis;
use crate::common::stores::ScenarioStore;

/// A store's server, and a Redis on which the `chaos` saga records what
/// its steps did.
pub struct Rig<S> {
    pub store: S,
    pub record: TestRedis,
}

impl<S: ScenarioStore> Rig<S> {
    pub fn start() -> Self {
        Rig {
            store: S::start(),
            record: TestRedis::start_with_aof(false),
        }
    }

    pub async fn recorder(&self) -> redis::aio::ConnectionManager {
        redis::Client::open(self.record.url())
            .unwrap()
            .get_connection_manager()
            .await
            .unwrap()
    }

    /// An engine running the `chaos` saga with `workers` workers in this
    /// process.
    pub async fn chaos_engine(&self, chaos: ChaosConfig, workers: usize) -> Engine {
        Engine::builder()
            .backend_arc(self.store.backend(Duration::from_secs(1)).await)
            .saga(Chaos::new(self.recorder().await, "in-process", chaos))
            .lock_retry_delay(Duration::from_millis(50))
            .workers(workers)
            .build()
            .await
            .unwrap()
    }

    /// A `chaos-worker` process on the store.
    pub fn spawn_worker(&self, envs: &[(&str, &str)]) -> Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_chaos-worker"));
        cmd.env("BACKEND_URL", self.store.url())
            .env("RECORD_URL", self.record.url())
            .env("POLL_MS", "50")
            .env("RUST_LOG", "off");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.spawn().expect("spawn chaos-worker")
    }

    /// Every task completed with its output, and its executions as its
    /// record says: no step whose completion was recorded ran again, none
    /// overlapped.
    pub async fn all_completed(&self, engine: &Engine, ids: &[(u64, TaskId)]) {
        let mut recorder = self.recorder().await;
        for (n, id) in ids {
            let task = finish(engine, *id, Duration::from_secs(30)).await;
            assert_eq!(task.status, TaskStatus::Completed, "{task:#?}");
            assert_eq!(task.output_as::<u64>().unwrap().unwrap(), n + 3);
            let executions = Chaos::executions(&mut recorder, *id).await.unwrap();
            check_task(&task, &executions).unwrap();
        }
    }
}

/// A worker process, killed when dropped (a failed assertion must not
/// leave it running).
pub struct Worker(pub Child);

impl Worker {
    /// Whether it has died.
    pub fn exited(&mut self) -> bool {
        self.0.try_wait().unwrap().is_some()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub use sagas_tests::double::finish;
