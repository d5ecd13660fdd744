//! The workers and background duties an engine runs in this process, and
//! how they stop.

use std::future::Future;

use tokio::task::JoinSet;

use super::Engine;
use crate::error::Error;
use crate::worker;

impl Engine {
    /// Spawns `n` background workers and, if there are any, the timer
    /// poller and the janitor (each of which works only while it holds its
    /// lease, so running them in many processes is safe).
    pub(super) fn spawn_workers(&self, n: usize) {
        let tasks = &self.rt.tasks;
        for i in 0..n {
            let rt = self.rt.clone();
            tasks.spawn(async move { worker::run(rt, format!("bg-{i}")).await });
        }
        if n > 0 {
            tasks.spawn(worker::timers(self.rt.clone()));
            tasks.spawn(worker::housekeeping(self.rt.clone()));
            tasks.spawn(worker::partitions(self.rt.clone()));
            for duty in worker::transports::duties(&self.rt, &self.starter()) {
                tasks.spawn(duty);
            }
        }
    }

    /// How a bridge starts a task from a command: as `start_json` does,
    /// through a handle that does not keep the engine running.
    fn starter(&self) -> worker::bridge::Starter {
        let engine = Engine::detached(self.rt.clone());
        std::sync::Arc::new(move |saga, input, key| {
            let engine = engine.clone();
            Box::pin(async move { engine.start_json(saga, input, Some(&key)).await })
        })
    }

    /// Runs `n` workers in this task until [`shutdown`](Self::shutdown) is
    /// called on any clone of this engine, then returns once every worker of
    /// the engine in this process finished.
    ///
    /// It does not listen for signals: whether Ctrl-C stops the process,
    /// and how, is the program's decision. A worker binary usually wants
    /// [`run_workers_until`](Self::run_workers_until) with
    /// [`shutdown_signal`].
    pub async fn run_workers(&self, n: usize) -> Result<(), Error> {
        self.run_workers_until(n, std::future::pending()).await
    }

    /// Runs `n` workers in this task until `signal` completes or
    /// [`shutdown`](Self::shutdown) is called, then shuts the engine down
    /// and returns once every worker of it (these and the background ones)
    /// finished: returning from `main` earlier would drop steps half-way.
    ///
    /// ```no_run
    /// # async fn run(engine: saga_runtime::Engine) -> Result<(), saga_runtime::Error> {
    /// engine.run_workers_until(4, saga_runtime::shutdown_signal()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Use it in worker processes (with `.workers(0)` on the builder). On
    /// shutdown the workers stop taking messages and finish their current
    /// attempt within the grace period; an attempt still running then is
    /// interrupted and its message handed to another worker.
    ///
    /// Dropping the returned future instead aborts these workers where
    /// they are (their messages come back after the visibility timeout).
    pub async fn run_workers_until(
        &self,
        n: usize,
        signal: impl Future<Output = ()>,
    ) -> Result<(), Error> {
        // Tracked as well as joined here: a shutdown called elsewhere
        // waits for them too.
        let tasks = &self.rt.tasks;
        let mut set = JoinSet::new();
        for i in 0..n {
            let rt = self.rt.clone();
            set.spawn(tasks.track_future(async move { worker::run(rt, format!("fg-{i}")).await }));
        }
        if n > 0 {
            set.spawn(tasks.track_future(worker::timers(self.rt.clone())));
            set.spawn(tasks.track_future(worker::housekeeping(self.rt.clone())));
            set.spawn(tasks.track_future(worker::partitions(self.rt.clone())));
            for duty in worker::transports::duties(&self.rt, &self.starter()) {
                set.spawn(tasks.track_future(duty));
            }
        }
        tokio::select! {
            _ = self.rt.shutdown.cancelled() => {}
            _ = signal => tracing::info!("stop signal: stopping the workers"),
        }
        self.shutdown().await;
        while set.join_next().await.is_some() {}
        Ok(())
    }

    /// Stops every worker of this engine in this process (background and
    /// [`run_workers`](Self::run_workers)) and returns once they all
    /// finished.
    ///
    /// Each worker stops taking messages, lets its steps in progress finish
    /// within [`shutdown_grace`](crate::EngineBuilder::shutdown_grace),
    /// interrupts those still running then (they get the
    /// [`stop_grace`](crate::EngineBuilder::stop_grace) to return) and
    /// hands their messages back, so that another worker goes on at once
    /// rather than after the visibility timeout. Awaiting this before the
    /// process exits is what makes a deploy lose no work.
    ///
    /// Calling it again, or from several clones at once, waits for the same
    /// stop. Do not await it from inside a step: the step would wait for
    /// itself until the shutdown interrupts it. Dropping the last clone of the
    /// engine also stops the workers, without waiting.
    pub async fn shutdown(&self) {
        self.rt.shutdown.cancel();
        self.rt.tasks.close();
        self.rt.tasks.wait().await;
    }
}

/// Completes when the process is asked to stop: Ctrl-C, or on unix SIGTERM
/// (what `docker stop`, Kubernetes and systemd send first). For
/// [`Engine::run_workers_until`].
///
/// Once this is polled, those signals no longer end the process on their
/// own: the program ends when it returns from `main`. A signal that cannot
/// be listened for is logged and ignored rather than taken as a request to
/// stop, which would stop a worker as soon as it started.
pub async fn shutdown_signal() {
    let interrupt = async {
        match tokio::signal::ctrl_c().await {
            Ok(()) => "Ctrl-C",
            Err(error) => {
                tracing::warn!(%error, "cannot listen for Ctrl-C");
                std::future::pending().await
            }
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                terminate.recv().await;
                "SIGTERM"
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending().await
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<&str>();
    let signal = tokio::select! {
        signal = interrupt => signal,
        signal = terminate => signal,
    };
    tracing::info!(signal, "asked to stop");
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::backend::memory::MemoryBackend;
    use crate::backend::Delivery;
    use crate::engine::Engine;

    /// What each message's task holds: every spawn copies it, and so does
    /// each change of the task's stage. Unboxed, the saga and process
    /// paths made it about 14 kB, which cost a Redis step about a quarter
    /// more engine instructions (callgrind, `bench_redis 1000 --only
    /// 1x1`: 725 M against 571 M).
    #[tokio::test]
    async fn the_future_spawned_per_message_stays_small() {
        let engine = Engine::builder()
            .backend(MemoryBackend::new())
            .workers(0)
            .build()
            .await
            .unwrap();
        let delivery = Arc::new(Delivery {
            id: "1".into(),
            item: Err("not decoded".into()),
            raw: String::new(),
            deliveries: 1,
            consumer: "c".into(),
            lease: None,
            instance: None,
        });
        let size = crate::worker::message_future_size(engine.rt.clone(), delivery);
        assert!(size <= 2048, "the per-message future is {size} bytes");
    }
}
