//! Timers: delayed saga messages (retry backoffs, handed-back messages) and
//! process-manager timeouts become deliverable when they fall due.
//!
//! One engine at a time moves them, the one holding the `timers` lease, so
//! that pollers in many processes do not all scan. Each entry is moved
//! exactly once even without the lease: the backend moves it atomically.
//!
//! The holder polls at the configured pace (10 times a second by default)
//! but renews its lease only every quarter of the lease's TTL: renewing on
//! every poll cost a backend round trip per poll from every idle engine,
//! which a database pays for as a statement (and a transaction) each. It
//! never polls past the lease it can prove it holds: the lease runs until
//! at least the TTL after the moment it was asked for, and a renewal that
//! fails or is refused ends the polling until the lease is won again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::Leases;
use crate::model::task::Timestamp;
use crate::worker::runtime::Runtime;

/// Entries moved per backend call.
const BATCH: usize = 256;

/// The named lease one timer poller of the deployment holds.
const LEASE: &str = "timers";

/// How often the poller works and renews, from the configured poll.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// How often the holder looks for due entries.
    poll: Duration,
    /// How long the lease lasts from the moment it was asked for.
    ttl: Duration,
}

impl Pace {
    fn new(poll: Duration) -> Self {
        Pace {
            poll,
            // Many polls per lease, and a TTL that a pause of the holder
            // (a slow statement, a busy host) does not outlast at once.
            ttl: (poll * 20).max(Duration::from_secs(2)),
        }
    }

    /// How long a holder goes between renewals: a quarter of the TTL, so
    /// that a renewal that is slow or fails once leaves time for another
    /// before the lease lapses.
    fn renew_every(self) -> Duration {
        self.ttl / 4
    }

    /// How long to wait before the next round: the holder polls at the
    /// configured pace; the others only check, now and then, whether the
    /// holder went away (about as often as the holder renews).
    fn wait(self, holder: bool) -> Duration {
        match holder {
            true => self.poll,
            false => self.renew_every().max(self.poll),
        }
    }
}

/// Polls until the engine shuts down.
pub(crate) async fn run(rt: Arc<Runtime>) {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let pace = Pace::new(rt.settings.timer_poll);
    let shutdown = rt.shutdown.clone();
    hold_and_poll(rt.leases(), &token, pace, &shutdown, |until| {
        move_due(&rt, until)
    })
    .await;
}

/// Takes (and keeps) the `timers` lease under `token`, running `poll` at
/// the configured pace while it holds it, until `shutdown`; then releases
/// it so that another engine takes over at once. `poll` is given the
/// instant the lease is known to last until, past which it must stop.
async fn hold_and_poll<F, Fut>(
    leases: &dyn Leases,
    token: &str,
    pace: Pace,
    shutdown: &CancellationToken,
    mut poll: F,
) where
    F: FnMut(Instant) -> Fut,
    Fut: Future<Output = ()>,
{
    // When the lease was last asked for and granted (`None`: not held).
    // The backend grants it from when it handles the call, which is no
    // earlier, so it lasts at least until this plus the TTL.
    let mut asked: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(pace.wait(asked.is_some())) => {}
        }
        let now = Instant::now();
        if asked.is_none_or(|at| now >= at + pace.renew_every()) {
            asked = match leases.named_lease(LEASE, token, pace.ttl).await {
                Ok(true) => Some(now),
                Ok(false) => None,
                Err(error) => {
                    tracing::warn!(%error, "timer lease failed; will retry");
                    None
                }
            };
        }
        if let Some(until) = asked.map(|at| at + pace.ttl) {
            // A renewal that took longer than the TTL: held no more.
            if Instant::now() < until {
                poll(until).await;
            }
        }
    }
    let _ = leases.release_named_lease(LEASE, token).await;
}

/// Moves due entries in batches, as long as the lease lasts (`until`).
async fn move_due(rt: &Runtime, until: Instant) {
    let held = || Instant::now() < until;
    while held() {
        // A sum over partitions: a full batch from any one reaches BATCH.
        match rt.backend.release_due(BATCH).await {
            Ok(n) if n >= BATCH => continue,
            Ok(_) => break,
            Err(error) => {
                tracing::warn!(%error, "moving due retries failed; will retry");
                break;
            }
        }
    }
    // Process-manager timeouts too, whether or not this engine runs any
    // process managers: the lease holder moves every timer of the
    // deployment, and may well be a process that runs only sagas. A
    // backend without a process store has none.
    let Ok(processes) = rt.processes() else {
        return;
    };
    while held() {
        match processes
            .process_release_due(Timestamp::now().0, BATCH)
            .await
        {
            Ok(n) if n >= BATCH => continue,
            Ok(_) => break,
            Err(error) => {
                tracing::warn!(%error, "releasing due timeouts failed; will retry");
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;
    use crate::backend::memory::MemoryBackend;
    use crate::backend::BackendError;

    /// Named leases in memory (on tokio's clock, so paused time drives
    /// their expiry), counting the calls, with renewals that take `slow`
    /// and fail while `failing`, and recording until when the lease is
    /// really held.
    #[derive(Default)]
    struct Counting {
        inner: MemoryBackend,
        calls: AtomicUsize,
        slow: Mutex<Duration>,
        failing: Mutex<bool>,
        /// Who holds the lease until when, as last granted.
        held: Mutex<Option<(String, Instant)>>,
    }

    #[async_trait]
    impl Leases for Counting {
        async fn named_lease(
            &self,
            name: &str,
            token: &str,
            ttl: Duration,
        ) -> Result<bool, BackendError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let slow = *self.slow.lock().unwrap();
            tokio::time::sleep(slow).await;
            if *self.failing.lock().unwrap() {
                return Err(BackendError::unavailable("down"));
            }
            let granted = self.inner.named_lease(name, token, ttl).await?;
            if granted {
                *self.held.lock().unwrap() = Some((token.to_owned(), Instant::now() + ttl));
            }
            Ok(granted)
        }

        async fn release_named_lease(&self, name: &str, token: &str) -> Result<bool, BackendError> {
            let released = self.inner.release_named_lease(name, token).await?;
            if released {
                *self.held.lock().unwrap() = None;
            }
            Ok(released)
        }
    }

    impl Counting {
        /// Whether `token` holds the lease now, as the store has it.
        fn holds(&self, token: &str) -> bool {
            matches!(&*self.held.lock().unwrap(),
                Some((holder, until)) if holder == token && Instant::now() < *until)
        }
    }

    /// A poller under `token` on `leases`, counting its polls and failing
    /// the test if it polls without holding the lease.
    fn poller(
        leases: &Arc<Counting>,
        token: &'static str,
        shutdown: &CancellationToken,
    ) -> (tokio::task::JoinHandle<()>, Arc<AtomicUsize>) {
        let polls = Arc::new(AtomicUsize::new(0));
        let (leases, counted, shutdown) = (leases.clone(), polls.clone(), shutdown.clone());
        let pace = Pace::new(Duration::from_millis(100));
        let task = tokio::spawn(async move {
            let store = leases.clone();
            hold_and_poll(&*leases, token, pace, &shutdown, |until| {
                assert!(Instant::now() < until, "polled at its lease's end");
                assert!(store.holds(token), "{token} polled without the lease");
                counted.fetch_add(1, Ordering::SeqCst);
                async {}
            })
            .await;
        });
        (task, polls)
    }

    /// The holder of a 2 s lease (a 100 ms poll) polls about 10 times a
    /// second but renews about twice a second; renewing on every poll made
    /// it about 100 lease calls in these 10 s.
    #[tokio::test(start_paused = true)]
    async fn the_holder_renews_every_quarter_of_the_ttl_and_polls_at_its_pace() {
        let leases = Arc::new(Counting::default());
        let shutdown = CancellationToken::new();
        let (task, polls) = poller(&leases, "a", &shutdown);
        tokio::time::sleep(Duration::from_secs(10)).await;
        shutdown.cancel();
        task.await.unwrap();
        let calls = leases.calls.load(Ordering::SeqCst);
        let polls = polls.load(Ordering::SeqCst);
        assert!((19..=22).contains(&calls), "{calls} lease calls in 10 s");
        assert!(polls >= 95, "{polls} polls in 10 s");
        assert!(!leases.holds("a"), "released on shutdown");
    }

    /// Renewals that take longer than the lease (a stalled database) or
    /// fail: the poller stops polling rather than poll without the lease,
    /// and resumes once it holds it again.
    #[tokio::test(start_paused = true)]
    async fn a_holder_never_polls_past_its_lease() {
        let leases = Arc::new(Counting::default());
        let shutdown = CancellationToken::new();
        let (task, polls) = poller(&leases, "a", &shutdown);
        // It first looks a quarter of the TTL in, then polls.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(polls.load(Ordering::SeqCst) >= 10);

        // Slow renewals: 3 s each, past the 2 s TTL. (The poll closure
        // asserts that no poll happens without the lease.)
        *leases.slow.lock().unwrap() = Duration::from_secs(3);
        tokio::time::sleep(Duration::from_secs(10)).await;
        *leases.slow.lock().unwrap() = Duration::ZERO;

        // Failing renewals: no polls at all once the lease has run out.
        *leases.failing.lock().unwrap() = true;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let before = polls.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(polls.load(Ordering::SeqCst), before, "no lease, no polls");

        *leases.failing.lock().unwrap() = false;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(polls.load(Ordering::SeqCst) > before + 10, "polling again");
        shutdown.cancel();
        task.await.unwrap();
    }

    /// Two pollers: one polls; once it stops, the other takes over within
    /// the TTL.
    #[tokio::test(start_paused = true)]
    async fn one_poller_at_a_time_and_a_takeover_when_it_stops() {
        let leases = Arc::new(Counting::default());
        let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
        let (a, polls_a) = poller(&leases, "a", &stop_a);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (b, polls_b) = poller(&leases, "b", &stop_b);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(polls_a.load(Ordering::SeqCst) >= 45);
        assert_eq!(polls_b.load(Ordering::SeqCst), 0, "one poller at a time");

        stop_a.cancel();
        a.await.unwrap();
        tokio::time::sleep(Pace::new(Duration::from_millis(100)).ttl).await;
        assert!(polls_b.load(Ordering::SeqCst) >= 10, "b took over");
        stop_b.cancel();
        b.await.unwrap();
    }
}
