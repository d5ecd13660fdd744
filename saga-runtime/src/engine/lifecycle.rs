//! The workers and background duties an engine runs in this process.

use tokio::task::JoinSet;

use super::Engine;
use crate::error::Error;
use crate::worker;

impl Engine {
    /// Spawns `n` background workers and, if there are any, the timer
    /// poller and the janitor (each of which works only while it holds its
    /// lease, so running them in many processes is safe).
    pub(super) fn spawn_workers(&self, n: usize) {
        for i in 0..n {
            let rt = self.rt.clone();
            tokio::spawn(async move { worker::run(rt, format!("bg-{i}")).await });
        }
        if n > 0 {
            tokio::spawn(worker::timers(self.rt.clone()));
            tokio::spawn(worker::housekeeping(self.rt.clone()));
        }
    }

    /// Runs `n` workers in this task until Ctrl-C or [`shutdown`](Self::shutdown).
    ///
    /// Use it in worker processes (with `.workers(0)` on the builder). On
    /// shutdown the workers stop taking messages and finish their current
    /// attempt within the grace period; an attempt still running then is
    /// abandoned and its message redelivered to another worker.
    pub async fn run_workers(&self, n: usize) -> Result<(), Error> {
        let mut set = JoinSet::new();
        for i in 0..n {
            let rt = self.rt.clone();
            set.spawn(async move { worker::run(rt, format!("fg-{i}")).await });
        }
        if n > 0 {
            set.spawn(worker::timers(self.rt.clone()));
            set.spawn(worker::housekeeping(self.rt.clone()));
        }
        let shutdown = self.rt.shutdown.clone();
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::signal::ctrl_c() => {
                tracing::info!("Ctrl-C: stopping workers");
                shutdown.cancel();
            }
        }
        while set.join_next().await.is_some() {}
        Ok(())
    }

    /// Stops every worker of this engine (background and `run_workers`).
    pub fn shutdown(&self) {
        self.rt.shutdown.cancel();
    }
}
