//! Wakes readers and waiters after the engine's own writes commit: this
//! process at once, the other engines with one statement of notifications
//! for all the writes since the last one.
//!
//! Why not `pg_notify` in the writes themselves: a transaction that
//! notifies holds a database-wide lock from the start of its commit to
//! its end, fsync included (so that notifications queue in commit order).
//! Notifying commits run one at a time, so a step's commit that notified
//! capped steps at the disk's serial flush rate, however many workers
//! ran. The engine's continuation writes (a step's commit and the next
//! message it enqueues, a hand-back, a process manager's commit) notify
//! nobody; their writer calls [`Waker`], whose background task sends the
//! notifications: at once after a quiet spell, and under load one
//! statement for all the writes of the last few milliseconds.
//!
//! Writes from outside a running engine (a start, a publish, in a
//! caller's transaction or not; an operator's requeue or cancellation)
//! still notify in their own transaction: their writer may be gone before
//! any waker could send anything. A notification this waker fails to send
//! (the server is down) is sent again; one it never sends (the process
//! ends first) costs the other engines' idle readers at most their
//! receive wait, after which they look anyway.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::listen::{Channels, Signals};
use super::session::Statements;
use crate::model::task::TaskId;
use crate::util::Unpoisoned;

/// Task ids one notification carries: a payload must stay under
/// PostgreSQL's 8000 bytes (37 bytes an id with its separator).
const IDS_PER_NOTIFICATION: usize = 200;

/// The least time between two sends: under load, the notifications of
/// many writes share one statement (at most 200 a second), while a lone
/// write is told at once.
const SPACING: Duration = Duration::from_millis(5);

/// Ended tasks remembered while notifications cannot be sent; past this
/// many the waker forgets them and tells every waiter to look instead.
const MAX_PENDING_IDS: usize = 10_000;

/// What the other engines have not been told yet.
#[derive(Default)]
struct Pending {
    /// Messages became visible (or will, after a delay).
    work: bool,
    /// Tasks that ended.
    finished: Vec<Uuid>,
    /// More tasks ended than remembered: every waiter looks.
    everyone_finished: bool,
    /// The earliest process-manager timeout scheduled (wall-clock ms).
    timer: Option<u64>,
    /// Messages were sent to endpoints.
    endpoints: bool,
}

impl Pending {
    fn is_empty(&self) -> bool {
        !self.work
            && self.finished.is_empty()
            && !self.everyone_finished
            && self.timer.is_none()
            && !self.endpoints
    }

    /// Adds what a failed send did not deliver.
    fn merge(&mut self, other: Pending) {
        self.work |= other.work;
        self.endpoints |= other.endpoints;
        self.everyone_finished |= other.everyone_finished;
        self.timer = match (self.timer, other.timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.finished.extend(other.finished);
        self.bound();
    }

    fn bound(&mut self) {
        if self.finished.len() > MAX_PENDING_IDS {
            self.finished.clear();
            self.everyone_finished = true;
        }
    }

    /// The notifications, as `(channel, payload)` columns.
    fn notifications(&self, channels: &Channels) -> (Vec<String>, Vec<String>) {
        let mut out: Vec<(String, String)> = Vec::new();
        if self.work {
            out.push((channels.work.clone(), String::new()));
        }
        if self.endpoints {
            out.push((channels.endpoints.clone(), String::new()));
        }
        if let Some(due) = self.timer {
            out.push((channels.timers.clone(), due.to_string()));
        }
        if self.everyone_finished {
            out.push((channels.finished.clone(), EVERYONE.to_owned()));
        } else {
            for ids in self.finished.chunks(IDS_PER_NOTIFICATION) {
                let payload = ids.iter().map(Uuid::to_string).collect::<Vec<_>>();
                out.push((channels.finished.clone(), payload.join(",")));
            }
        }
        out.into_iter().unzip()
    }
}

/// The `finished` payload that tells every waiter to look.
pub(super) const EVERYONE: &str = "*";

/// See the module documentation.
pub(super) struct Waker {
    signals: Arc<Signals>,
    pending: Mutex<Pending>,
    ready: Notify,
}

impl Waker {
    /// Starts the background task that notifies the other engines, until
    /// `stop` (then it sends what is pending once more).
    pub(super) fn spawn(
        statements: Statements,
        schema: &str,
        signals: Arc<Signals>,
        stop: CancellationToken,
    ) -> Arc<Waker> {
        let waker = Arc::new(Waker {
            signals,
            pending: Mutex::new(Pending::default()),
            ready: Notify::new(),
        });
        tokio::spawn(send_loop(
            waker.clone(),
            statements,
            Channels::of(schema),
            stop,
        ));
        waker
    }

    /// A message was enqueued or handed back.
    pub(super) fn work(&self) {
        self.signals.work.notify_waiters();
        self.add(|p| p.work = true);
    }

    /// A task ended.
    pub(super) fn finished(&self, id: TaskId) {
        let _ = self.signals.finished.send(id);
        self.add(|p| {
            p.finished.push(id.0);
            p.bound();
        });
    }

    /// A process-manager timeout was scheduled, due at `due_ms`.
    pub(super) fn timer(&self, due_ms: u64) {
        self.signals.timer_at(due_ms);
        self.add(|p| p.timer = Some(p.timer.map_or(due_ms, |t| t.min(due_ms))));
    }

    /// Messages were sent to endpoints.
    pub(super) fn endpoints(&self) {
        self.signals.endpoints.notify_waiters();
        self.add(|p| p.endpoints = true);
    }

    fn add(&self, change: impl FnOnce(&mut Pending)) {
        change(&mut self.pending.locked());
        self.ready.notify_one();
    }

    fn take(&self) -> Pending {
        std::mem::take(&mut *self.pending.locked())
    }
}

async fn send_loop(
    waker: Arc<Waker>,
    statements: Statements,
    channels: Channels,
    stop: CancellationToken,
) {
    let mut pause = Duration::from_millis(50);
    loop {
        let stopping = tokio::select! {
            _ = stop.cancelled() => true,
            _ = waker.ready.notified() => false,
        };
        let batch = waker.take();
        if !batch.is_empty() {
            let sent_at = tokio::time::Instant::now();
            match send(&statements, &channels, &batch).await {
                Ok(()) => {
                    pause = Duration::from_millis(50);
                    if !stopping {
                        tokio::select! {
                            _ = stop.cancelled() => {}
                            _ = tokio::time::sleep_until(sent_at + SPACING) => {}
                        }
                    }
                }
                Err(error) if !stopping => {
                    tracing::debug!(%error, "notifying the other engines failed; will retry");
                    waker.add(|p| p.merge(batch));
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(_) => {}
            }
        }
        if stopping {
            return;
        }
    }
}

async fn send(
    statements: &Statements,
    channels: &Channels,
    batch: &Pending,
) -> Result<(), sqlx::Error> {
    let (names, payloads) = batch.notifications(channels);
    let mut session = statements.session().await?;
    sqlx::query("SELECT count(pg_notify(c, p)) FROM unnest($1::text[], $2::text[]) AS n(c, p)")
        .bind(names)
        .bind(payloads)
        .execute(session.conn())
        .await?;
    session.done().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channels() -> Channels {
        Channels::of("saga")
    }

    #[test]
    fn nothing_pending_sends_nothing() {
        let pending = Pending::default();
        assert!(pending.is_empty());
        assert_eq!(pending.notifications(&channels()).0.len(), 0);
    }

    #[test]
    fn ended_tasks_go_in_payloads_under_the_size_limit() {
        let pending = Pending {
            finished: (0..450).map(|_| Uuid::new_v4()).collect(),
            ..Pending::default()
        };
        let (names, payloads) = pending.notifications(&channels());
        assert_eq!(names.len(), 3);
        assert!(payloads.iter().all(|p| p.len() < 8000));
        let ids: usize = payloads.iter().map(|p| p.split(',').count()).sum();
        assert_eq!(ids, 450);
    }

    #[test]
    fn too_many_ended_tasks_tell_everyone_to_look() {
        let mut pending = Pending::default();
        pending.merge(Pending {
            finished: vec![Uuid::nil(); MAX_PENDING_IDS + 1],
            ..Pending::default()
        });
        assert!(pending.finished.is_empty());
        let (names, payloads) = pending.notifications(&channels());
        assert_eq!(names, vec![channels().finished]);
        assert_eq!(payloads, vec![EVERYONE.to_owned()]);
    }

    #[test]
    fn merging_keeps_the_earliest_timer_and_every_flag() {
        let mut pending = Pending {
            timer: Some(50),
            ..Pending::default()
        };
        pending.merge(Pending {
            work: true,
            endpoints: true,
            timer: Some(20),
            ..Pending::default()
        });
        assert!(pending.work && pending.endpoints);
        assert_eq!(pending.timer, Some(20));
    }
}
