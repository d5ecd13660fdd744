//! The flow-control limit scripts and `wake.lua`, case by case: slots
//! held once per holder, released once, not renewed nor released once
//! expired, the line kept in order, keys that expire, keys whose values
//! are long or odd.

use std::time::Duration;

use super::Fixture;
use crate::backend::limits::twins::{LimitOp, LimitOpKind, LimitTwins};
use crate::backend::redis::keys::limit_id;
use crate::backend::redis::scripts::{self as s, LimitKeys};
use crate::backend::{Acquired, LimitCause, LimitDecision, LimitUsage, Released};
use crate::limit::{LimitConfig, Rate};

const PARTS: [&str; 6] = ["holders", "line", "waiting", "waiters", "bookings", "state"];

fn slots(n: u32) -> LimitConfig {
    LimitConfig {
        concurrency: Some(n),
        rate: None,
    }
}

/// What a request decided, in short: `G` granted, `C<ahead>` waits for a
/// slot with that many ahead, `R` waits for a token; and the wakes.
fn short(acquired: &Acquired) -> (String, Vec<String>) {
    let decision = match acquired.decision {
        LimitDecision::Granted => "G".to_owned(),
        LimitDecision::Wait {
            cause: LimitCause::Concurrency,
            ahead,
            ..
        } => format!("C{ahead}"),
        LimitDecision::Wait {
            cause: LimitCause::Rate,
            ..
        } => "R".to_owned(),
    };
    (decision, acquired.wake.clone())
}

impl Fixture {
    fn limit(&self, key: Option<&str>) -> LimitKeys {
        LimitKeys::new(&self.keys, "psp", key)
    }

    /// Asks as `holder` (its waiter: the part before `-`), waking as the
    /// waiter's name when `queues`.
    async fn ask(
        &mut self,
        key: Option<&str>,
        config: LimitConfig,
        holder: &str,
        queues: bool,
        hold_for: Duration,
    ) -> Acquired {
        let waiter = holder.split('-').next().unwrap();
        let call = s::LimitAcquire {
            keys: self.limit(key),
            config,
            holder,
            waiter,
            hold_for,
            wake: queues.then_some(waiter),
        };
        self.call(&call).await.unwrap()
    }

    async fn release(&mut self, key: Option<&str>, holder: &str, n: u32) -> Released {
        let call = s::LimitRelease {
            keys: self.limit(key),
            holder,
            concurrency: Some(n),
        };
        self.call(&call).await.unwrap()
    }

    async fn renew(&mut self, key: Option<&str>, holder: &str, hold_for: Duration) -> bool {
        let call = s::LimitRenew {
            keys: self.limit(key),
            holder,
            hold_for,
        };
        self.call(&call).await.unwrap()
    }

    async fn usage(&mut self, key: Option<&str>) -> LimitUsage {
        let call = s::LimitUse {
            keys: self.limit(key),
        };
        self.call(&call).await.unwrap()
    }

    /// When the limit's `part` key expires (unix ms).
    async fn expiry(&mut self, part: &str) -> i64 {
        let key = self.keys.limit("psp", None, part);
        self.cmd(&["PEXPIRETIME", &key]).await
    }

    /// The time to live of each of the limit's keys (ms; -2: no key).
    async fn ttls(&mut self, key: Option<&str>) -> Vec<i64> {
        let mut ttls = Vec::new();
        for part in PARTS {
            ttls.push(
                self.cmd(&["PTTL", &self.keys.limit("psp", key, part)])
                    .await,
            );
        }
        ttls
    }
}

/// A table of asks and releases on one limit of two slots, each with what
/// it must answer: the line keeps its order across asks again, a holder
/// asking again keeps its one slot, a release frees once and hands the
/// slot to the first in line, whom no newcomer passes.
#[tokio::test]
async fn slots_are_held_once_released_once_and_handed_on_in_line() {
    let mut f = Fixture::new().await;
    let hold = Duration::from_secs(30);
    enum Step {
        Ask(&'static str, bool, &'static str, &'static [&'static str]),
        Release(&'static str, bool, &'static [&'static str]),
    }
    use Step::*;
    let steps = [
        Ask("t1-a1", true, "G", &[]),
        Ask("t1-a1", true, "G", &[]), // the same holder: no second slot
        Ask("t2-a1", true, "G", &[]),
        Ask("t3-a1", true, "C0", &[]),
        Ask("t4-a1", true, "C1", &[]),
        Ask("t5-a1", true, "C2", &[]),
        Ask("t4-a1", true, "C1", &[]),  // asking again keeps its place
        Ask("t9-a1", false, "C3", &[]), // no wake: told the line's length
        Release("t1-a1", true, &["t3"]),
        Release("t1-a1", false, &[]), // a second release frees nothing
        Release("nobody", false, &[]),
        Ask("t6-a1", true, "C2", &[]), // no newcomer takes t3's slot
        Ask("t3-a2", true, "G", &[]),  // t3 takes it with a new attempt
        Release("t2-a1", true, &["t4"]),
        Release("t3-a2", true, &["t5"]),
        Ask("t6-a1", true, "C0", &[]),
    ];
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Ask(holder, queues, decision, wake) => {
                let got = f.ask(None, slots(2), holder, queues, hold).await;
                assert_eq!(
                    short(&got),
                    (decision.to_owned(), strings(wake)),
                    "step {i}"
                );
            }
            Release(holder, released, wake) => {
                let got = f.release(None, holder, 2).await;
                assert_eq!(
                    (got.released, got.wake),
                    (released, strings(wake)),
                    "step {i}"
                );
            }
        }
    }
    let usage = f.usage(None).await;
    assert_eq!(
        (usage.in_use, usage.waiting),
        (2, 1),
        "t4 and t5 reserved; t6 waits (t9 did not queue)"
    );
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// A slot not renewed expires: its holder can neither renew nor release
/// it once it went to another, the first waiter is woken by whoever
/// notices, and a waiter that stays away past its deadline leaves the
/// line.
#[tokio::test]
async fn an_expired_holder_can_neither_renew_nor_release() {
    let mut f = Fixture::new().await;
    let short_hold = Duration::from_millis(150);
    assert_eq!(
        short(&f.ask(None, slots(1), "t1-a1", true, short_hold).await).0,
        "G"
    );
    assert!(f.renew(None, "t1-a1", short_hold).await, "held: renewed");
    assert_eq!(
        short(&f.ask(None, slots(1), "t2-a1", true, short_hold).await).0,
        "C0"
    );
    tokio::time::sleep(short_hold + Duration::from_millis(30)).await;
    let noticed = f.ask(None, slots(1), "t3-a1", true, short_hold).await;
    assert_eq!(short(&noticed), ("C0".to_owned(), strings(&["t2"])));
    assert!(
        !f.renew(None, "t1-a1", short_hold).await,
        "expired: no renewal"
    );
    assert_eq!(f.release(None, "t1-a1", 1).await, Released::default());
    assert_eq!(f.usage(None).await.in_use, 1, "t2's reservation stands");
    // Nobody comes back: the reservation expires, t3 lapses (its deadline
    // is its wait plus its hold), and the limit is free again.
    tokio::time::sleep(3 * short_hold).await;
    assert_eq!(f.usage(None).await, LimitUsage::default());
    assert_eq!(
        short(&f.ask(None, slots(1), "t9-a1", false, short_hold).await).0,
        "G"
    );
}

/// Every key of a limit expires after the last thing it holds (plus one
/// to two margins), the line's three keys at once; a call that needs no
/// later expiry sets none; and the keys go as soon as nothing is held,
/// waiting or booked.
#[tokio::test]
async fn limit_keys_expire_and_go_once_idle() {
    let mut f = Fixture::new().await;
    let hold = Duration::from_secs(20);
    let margin = s::LIMIT_KEEP_MARGIN.as_millis() as i64;
    f.ask(None, slots(1), "t1-a1", true, hold).await;
    f.ask(None, slots(1), "t2-a1", true, hold).await;
    let hold_ms = hold.as_millis() as i64;
    for (part, ttl) in PARTS.iter().zip(f.ttls(None).await) {
        // t1's slot: its hold; t2's deadline: t1's expiry plus its own
        // hold. (+1: the expiry is rounded up to the millisecond.)
        let least = match *part {
            "holders" => hold_ms + margin,
            _ => 2 * hold_ms + margin,
        };
        match *part {
            "bookings" | "state" => assert_eq!(ttl, -2, "{part}: no rate, no key"),
            _ => assert!(
                ttl > least - 2_000 && ttl <= least + margin + 1,
                "{part}: {ttl}"
            ),
        }
    }
    let line = [
        f.expiry("line").await,
        f.expiry("waiting").await,
        f.expiry("waiters").await,
    ];
    assert!(line.iter().all(|at| *at == line[0]), "{line:?}");
    let before = f.expiry("holders").await;
    assert!(f.renew(None, "t1-a1", hold).await);
    assert_eq!(
        f.expiry("holders").await,
        before,
        "renewed within a margin: the expiry needs no move"
    );
    assert_eq!(f.release(None, "t1-a1", 1).await.wake, ["t2"]);
    f.ask(None, slots(1), "t2-a2", true, hold).await;
    f.release(None, "t2-a2", 1).await;
    assert_eq!(f.ttls(None).await, [-2; 6], "idle: every key gone");

    // A rate keeps its next start: the state lasts until it is rested.
    let paced = LimitConfig {
        concurrency: None,
        rate: Some(Rate {
            count: 1,
            per: Duration::from_secs(100),
            burst: 1,
        }),
    };
    assert_eq!(
        short(&f.ask(None, paced, "t1-a1", false, hold).await).0,
        "G"
    );
    let ttls = f.ttls(None).await;
    assert!(
        ttls[5] > 100_000 + margin - 2_000 && ttls[5] <= 100_000 + 2 * margin + 1,
        "the state lives until the next token is due: {ttls:?}"
    );
    assert_eq!(
        short(&f.ask(None, paced, "t2-a1", false, hold).await).0,
        "R"
    );
    let ttls = f.ttls(None).await;
    let grace = crate::backend::BOOKING_GRACE.as_millis() as i64;
    assert!(
        ttls[4] > 100_000 + grace + margin - 2_000 && ttls[4] <= 100_000 + grace + 2 * margin + 1,
        "a booking is kept until its grace runs out: {ttls:?}"
    );
}

/// A booking past its grace is dropped by the next call (its waiter never
/// came back), and a waiter that comes back on time spends its booking.
#[tokio::test]
async fn stale_bookings_are_dropped() {
    let mut f = Fixture::new().await;
    let paced = LimitConfig {
        concurrency: None,
        rate: Some(Rate {
            count: 10,
            per: Duration::from_secs(1),
            burst: 1,
        }),
    };
    let hold = Duration::from_secs(1);
    assert_eq!(
        short(&f.ask(None, paced, "t1-a1", false, hold).await).0,
        "G"
    );
    assert_eq!(
        short(&f.ask(None, paced, "t2-a1", false, hold).await).0,
        "R"
    );
    assert_eq!(
        short(&f.ask(None, paced, "t3-a1", false, hold).await).0,
        "R"
    );
    assert_eq!(f.usage(None).await.booked, 2);
    // t3's booking was due long ago, past the grace.
    let bookings = f.keys.limit("psp", None, "bookings");
    let (secs, micros): (i64, i64) = f.cmd(&["TIME"]).await;
    let stale = (secs * 1_000_000 + micros - 61_000_000).to_string();
    let _: () = f.cmd(&["ZADD", &bookings, &stale, "t3"]).await;
    assert_eq!(f.usage(None).await.booked, 1, "t3's booking is dropped");
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(
        short(&f.ask(None, paced, "t2-a1", false, hold).await).0,
        "G"
    );
    assert_eq!(f.usage(None).await.booked, 0);
}

/// A key's value is user data: however long or odd, the key names stay
/// short and brace-free, and `(name, key)` pairs that would read alike
/// stay apart.
#[tokio::test]
async fn long_and_odd_key_values_stay_apart_and_short() {
    let mut f = Fixture::new().await;
    let long = "x".repeat(10_000);
    let ids = [
        limit_id("a|b", None),
        limit_id("a", Some("b")),
        limit_id("a=b", None),
        limit_id("a", Some("")),
        limit_id("a", None),
        limit_id("a", Some("{b}")),
        limit_id("a", Some(&long)),
        limit_id(&long, None),
    ];
    let distinct: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), ids.len(), "{ids:?}");
    assert_eq!(ids[1], "a=b", "short plain values are readable");
    for id in &ids {
        assert!(id.len() <= 65 && !id.contains(['{', '}']), "{id}");
    }
    let hold = Duration::from_secs(30);
    let odd = "{merchant} 42:\u{e9}|x";
    for key in [Some(long.as_str()), Some(odd), Some("b")] {
        assert_eq!(
            short(&f.ask(key, slots(1), "t1-a1", true, hold).await).0,
            "G"
        );
        assert_eq!(
            short(&f.ask(key, slots(1), "t2-a1", true, hold).await).0,
            "C0"
        );
        let holders = f.keys.limit("psp", key, "holders");
        assert!(holders.len() < 120, "{holders}");
    }
    assert_eq!(
        short(&f.ask(None, slots(1), "t2-a1", true, hold).await).0,
        "G"
    );
}

/// `wake.lua` moves the delayed entry a commit left onto the queue, once,
/// whether its delay ran out already (the timer poller has not moved it
/// yet) or not; one not there is left alone.
#[tokio::test]
async fn wake_moves_a_parked_message_once() {
    let mut f = Fixture::new().await;
    let (delayed, queue) = (f.keys.delayed(0), f.keys.queue(0));
    let (secs, _): (i64, i64) = f.cmd(&["TIME"]).await;
    let later = ((secs + 3600) * 1000).to_string();
    let past = ((secs - 10) * 1000).to_string();
    let _: () = f.cmd(&["ZADD", &delayed, &later, "0:parked"]).await;
    let _: () = f.cmd(&["ZADD", &delayed, &past, "0:due"]).await;
    let wake = |payload: &str| s::Wake {
        delayed: delayed.clone(),
        queue: queue.clone(),
        payload: payload.to_owned(),
    };
    let cases = [
        ("parked: moved", "parked", true),
        ("moved already", "parked", false),
        ("due, not yet moved: moved", "due", true),
        ("due, moved already", "due", false),
        ("never delayed", "other", false),
    ];
    for (case, payload, moved) in cases {
        assert_eq!(f.call(&wake(payload)).await.unwrap(), moved, "{case}");
    }
    let entries = f.entries(&queue).await;
    let payloads: Vec<&[String]> = entries.iter().map(|e| e.1.as_slice()).collect();
    assert_eq!(payloads, [["payload", "parked"], ["payload", "due"]]);
    let left: Vec<String> = f.cmd(&["ZRANGE", &delayed, "0", "-1"]).await;
    assert!(left.is_empty(), "{left:?}");
}

/// The limits of a backend on the fixture's server beside the machine,
/// every script loaded (so that no call of a timed sequence pays a second
/// round trip to load its script).
async fn twins(f: &Fixture) -> LimitTwins {
    use crate::backend::{Backend, LimitRequest};

    let backend = std::sync::Arc::new(
        crate::backend::redis::RedisBackend::connect(&f._server.url())
            .await
            .unwrap(),
    );
    let limits = backend.limits().unwrap();
    let config = LimitConfig {
        concurrency: Some(1),
        rate: None,
    };
    let request = LimitRequest {
        limit: "warm",
        key: None,
        config,
        holder: "h",
        waiter: "w",
        hold_for: Duration::from_secs(1),
        wake: None,
    };
    limits.limit_acquire(&request).await.unwrap();
    limits
        .limit_renew("warm", None, "h", Duration::from_secs(1))
        .await
        .unwrap();
    limits.limit_usage("warm", None, config).await.unwrap();
    limits.limit_leave("warm", None, "w", config).await.unwrap();
    limits
        .limit_release("warm", None, "h", config)
        .await
        .unwrap();
    LimitTwins::new(limits)
}

/// Asserts that every limit key a sequence left will expire: however a
/// key was emptied and written again, none is kept for ever.
async fn bounded(f: &mut Fixture) {
    let keys: Vec<String> = f.cmd(&["KEYS", "*limit*"]).await;
    assert!(!keys.is_empty());
    for key in keys {
        let ttl: i64 = f.cmd(&["PTTL", &key]).await;
        assert!(ttl > 0, "{key}: {ttl}");
    }
}

/// The scripts against the limit machine when waiters come back late: a
/// seeded sequence on a rate of one start a second (alone, and with two
/// slots) run in real time, with idle moments, so that bookings fall due,
/// waiters come back after their due time (within
/// [`crate::backend::LATE`] and beyond it, on their own and several at
/// once, spaced after those ahead), newcomers find owed bookings, and
/// waiters leave. Operation `i` runs at `i * 130 ms`: every moment the
/// protocol compares with the time (an operation's time plus whole
/// intervals of 1 s: LATE, the grace and the holds are whole intervals
/// too) is then at least 10 ms from the time of any later operation
/// (13 * i is a multiple of 100 for no i below 100), so that the two
/// clocks (well under a millisecond apart, the scripts loaded) decide
/// alike even on a busy machine whose timers fire a few ms late.
#[tokio::test]
async fn the_scripts_pace_late_waiters_as_the_machine_does() {
    use rand::{Rng, SeedableRng};
    use LimitOpKind::{Acquire, Leave, Release, Usage};
    const KINDS: [Option<LimitOpKind>; 12] = [
        Some(Acquire),
        Some(Acquire),
        Some(Acquire),
        Some(Acquire),
        Some(Acquire),
        Some(Leave),
        Some(Release),
        Some(Usage),
        None,
        None,
        None,
        None,
    ];

    let mut f = Fixture::new().await;
    let mut twins = twins(&f).await;
    let rate = Rate {
        count: 2,
        per: Duration::from_secs(2),
        burst: 2,
    };
    let configs = [
        (
            "late",
            LimitConfig {
                concurrency: None,
                rate: Some(rate),
            },
        ),
        (
            "late-one",
            LimitConfig {
                concurrency: None,
                rate: Some(Rate { burst: 1, ..rate }),
            },
        ),
        (
            "late-slots",
            LimitConfig {
                concurrency: Some(2),
                rate: Some(Rate { burst: 1, ..rate }),
            },
        ),
    ];
    let hold = Duration::from_secs(60);
    let spacing = Duration::from_millis(130);
    // A seed whose sequence spaces waiters that came back late behind
    // others (the scripts fail it if they do not).
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let start = tokio::time::Instant::now();
    for step in 0..95u32 {
        tokio::time::sleep_until(start + spacing * step).await;
        let (name, config) = configs[rng.gen_range(0..configs.len())];
        // Asks (a waiter asks again some steps later: on time, late, or
        // very late), leaves, releases, reads, and idle moments (`None`).
        let kind = KINDS[rng.gen_range(0..KINDS.len())];
        let task = rng.gen_range(0..6);
        let Some(kind) = kind else {
            continue;
        };
        let op = LimitOp {
            name,
            config,
            key: None,
            task,
            attempt: 0,
            kind,
            wakes: true,
        };
        let at = format!("step {step}: {name} t{}", op.task);
        twins.run(&op, hold, Duration::from_millis(8), &at).await;
    }
    twins.covered(&["G", "C", "R", "left", "booked"], 1);
    bounded(&mut f).await;
}
