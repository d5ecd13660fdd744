//! Notifications: `LISTEN` on the schema's channels on one connection of
//! its own, turned into in-process signals. A message made visible wakes
//! idle readers (`work`); a task's end wakes its waiters (`finished`); a
//! cancellation reaches the process that runs the task (`cancel`); a
//! process-manager timeout scheduled anywhere tells the timer poller when
//! to look (`timers`); a message for an endpoint wakes its consumers
//! (`endpoints`).
//!
//! A notification sent while the connection is down is lost: after a
//! reconnection every waiter is woken to look for itself, and readers
//! also look on their own now and then (`PostgresConfig::poll_interval`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::{broadcast, Notify};
use tokio_util::sync::CancellationToken;

use uuid::Uuid;

use super::migrate::channel;
use super::wake::EVERYONE;
use crate::model::task::TaskId;

/// What notifications signal in this process.
pub(super) struct Signals {
    /// A message became visible.
    pub work: Notify,
    /// Tasks that ended, by id; the nil id: any may have (look).
    pub finished: broadcast::Sender<TaskId>,
    /// Tasks whose cancellation was requested, by id.
    pub cancellations: broadcast::Sender<TaskId>,
    /// The earliest due time (wall-clock ms) of a process-manager timeout
    /// scheduled since the timer poller last looked: `0` says "look now"
    /// (after a reconnection, when notifications may have been lost).
    pub next_timer: AtomicU64,
    /// A message was sent to an endpoint.
    pub endpoints: Notify,
    /// Whether the listening connection is up.
    pub listening: AtomicBool,
}

impl Signals {
    fn wake_everyone(&self) {
        self.work.notify_waiters();
        self.endpoints.notify_waiters();
        self.next_timer.store(0, Ordering::SeqCst);
    }

    /// Lowers the earliest known timer due time to `due_ms`.
    pub fn timer_at(&self, due_ms: u64) {
        self.next_timer.fetch_min(due_ms, Ordering::SeqCst);
    }
}

/// Starts listening for `schema`'s channels until `stop`.
pub(super) fn spawn(pool: PgPool, schema: &str, stop: CancellationToken) -> Arc<Signals> {
    let signals = Arc::new(Signals {
        work: Notify::new(),
        finished: broadcast::channel(1024).0,
        cancellations: broadcast::channel(1024).0,
        next_timer: AtomicU64::new(0),
        endpoints: Notify::new(),
        listening: AtomicBool::new(false),
    });
    let names = Channels::of(schema);
    tokio::spawn(listen(pool, names, signals.clone(), stop));
    signals
}

/// The schema's channel names.
pub(super) struct Channels {
    pub work: String,
    pub finished: String,
    pub cancel: String,
    pub timers: String,
    pub endpoints: String,
}

impl Channels {
    pub(super) fn of(schema: &str) -> Self {
        Channels {
            work: channel(schema, "work"),
            finished: channel(schema, "finished"),
            cancel: channel(schema, "cancel"),
            timers: channel(schema, "timers"),
            endpoints: channel(schema, "endpoints"),
        }
    }

    fn all(&self) -> [&str; 5] {
        [
            &self.work,
            &self.finished,
            &self.cancel,
            &self.timers,
            &self.endpoints,
        ]
    }
}

async fn listen(pool: PgPool, names: Channels, signals: Arc<Signals>, stop: CancellationToken) {
    let mut pause = Duration::from_millis(100);
    while !stop.is_cancelled() {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen_all(names.all()).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = tokio::select! {
            _ = stop.cancelled() => return,
            connected = connected => match connected {
                Ok(listener) => listener,
                Err(error) => {
                    tracing::debug!(%error, "listening for notifications failed; will retry");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(5));
                    continue;
                }
            },
        };
        pause = Duration::from_millis(100);
        signals.listening.store(true, Ordering::SeqCst);
        // Whatever was sent while nobody listened is looked for now.
        signals.wake_everyone();
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                next = listener.try_recv() => next,
            };
            match next {
                Ok(Some(n)) => handle(&names, &signals, n.channel(), n.payload()),
                // The connection went: reconnect, then look again.
                Ok(None) | Err(_) => break,
            }
        }
        signals.listening.store(false, Ordering::SeqCst);
        signals.wake_everyone();
    }
}

fn handle(names: &Channels, signals: &Signals, channel: &str, payload: &str) {
    if channel == names.work {
        signals.work.notify_waiters();
    } else if channel == names.endpoints {
        signals.endpoints.notify_waiters();
    } else if channel == names.timers {
        signals.timer_at(payload.parse().unwrap_or(0));
    } else if channel == names.finished {
        // Ids separated by commas (an engine sends those of many tasks at
        // once), or `*`: every waiter looks.
        if payload == EVERYONE {
            let _ = signals.finished.send(TaskId(Uuid::nil()));
        }
        for id in payload.split(',').filter_map(|id| id.parse().ok()) {
            let _ = signals.finished.send(id);
        }
    } else if channel == names.cancel {
        if let Ok(id) = payload.parse() {
            let _ = signals.cancellations.send(id);
        }
    }
}
