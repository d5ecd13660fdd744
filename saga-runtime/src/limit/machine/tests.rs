//! The limit machine at exact moments: every time below is the test's.

use std::time::Duration;

use super::*;

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn slots(n: u32) -> LimitConfig {
    LimitConfig {
        concurrency: Some(n),
        rate: None,
    }
}

fn paced(count: u32, per: Duration, burst: u32) -> LimitConfig {
    LimitConfig {
        concurrency: None,
        rate: Some(Rate { count, per, burst }),
    }
}

/// Asks as `holder` (waiting as the part before `-`), queueing when
/// `wake`, holding for 10 s.
fn ask(
    l: &mut LimitState,
    config: LimitConfig,
    holder: &str,
    wake: bool,
    now: Duration,
) -> Acquired {
    let waiter = holder.split('-').next().unwrap();
    l.acquire(
        &LimitRequest {
            limit: "psp",
            key: None,
            config,
            holder,
            waiter,
            hold_for: 10 * S,
            wake: wake.then_some(waiter),
        },
        now,
    )
}

fn wait(retry_after: Duration, ahead: u64, cause: LimitCause) -> LimitDecision {
    LimitDecision::Wait {
        retry_after,
        ahead,
        cause,
    }
}

/// A full limit tells a newcomer exactly when the first slot expires and
/// its place; a release reserves the slot for the first in line (woken),
/// which a newcomer cannot take and the woken one then holds.
#[test]
fn a_release_hands_the_slot_to_the_first_in_line() {
    let mut l = LimitState::default();
    let one = slots(1);
    assert_eq!(
        ask(&mut l, one, "a-1", true, Duration::ZERO).decision,
        LimitDecision::Granted
    );
    let b = ask(&mut l, one, "b-1", true, 3 * S);
    assert_eq!(b.decision, wait(7 * S, 0, LimitCause::Concurrency));
    let c = ask(&mut l, one, "c-1", true, 4 * S);
    assert_eq!(c.decision, wait(6 * S, 1, LimitCause::Concurrency));
    let freed = l.release("a-1", one, 5 * S);
    assert_eq!(
        freed,
        Released {
            released: true,
            wake: vec!["b".to_owned()]
        }
    );
    assert_eq!(
        l.release("a-1", one, 5 * S),
        Released::default(),
        "freed once"
    );
    let c = ask(&mut l, one, "c-1", true, 6 * S);
    assert_eq!(
        c.decision,
        wait(9 * S, 0, LimitCause::Concurrency),
        "b's reservation (held 10 s from the release) is not c's"
    );
    assert_eq!(
        ask(&mut l, one, "b-1", true, 7 * S).decision,
        LimitDecision::Granted
    );
    assert_eq!(
        l.usage(7 * S),
        LimitUsage {
            in_use: 1,
            waiting: 1,
            booked: 0
        }
    );
}

/// A waiter must ask again by its deadline (the wait it was told plus its
/// hold): at the deadline it is still in line, just after it is not.
#[test]
fn a_waiter_that_stays_away_past_its_deadline_leaves_the_line() {
    let mut l = LimitState::default();
    let one = slots(1);
    ask(&mut l, one, "a-1", true, Duration::ZERO);
    ask(&mut l, one, "b-1", true, Duration::ZERO);
    // Told 10 s, holding 10 s: its deadline is 20 s.
    assert!(l.renew("a-1", 30 * S, 5 * S), "a holds until 35 s");
    assert_eq!(l.usage(20 * S).waiting, 1);
    assert_eq!(l.usage(20 * S + MS).waiting, 0);
    assert_eq!(l.release("a-1", one, 21 * S).wake, Vec::<String>::new());
}

/// A slot not renewed is gone at its expiry: its holder can neither renew
/// nor release it, and the first call after wakes the first in line.
#[test]
fn an_expired_slot_frees_itself_for_the_line() {
    let mut l = LimitState::default();
    let one = slots(1);
    ask(&mut l, one, "a-1", true, Duration::ZERO);
    ask(&mut l, one, "b-1", true, S);
    assert!(
        l.renew("a-1", 10 * S, 10 * S - MS),
        "renewed just before its expiry"
    );
    assert!(!l.renew("a-1", 10 * S, 20 * S), "expired at 20 s - 1 ms");
    let c = ask(&mut l, one, "c-1", true, 20 * S);
    assert_eq!(c.wake, ["b"], "whoever notices the expiry wakes b");
    assert_eq!(c.decision, wait(10 * S, 0, LimitCause::Concurrency));
    assert_eq!(l.release("a-1", one, 20 * S), Released::default());
}

/// Two a second with a burst of two: the burst starts at once, then each
/// newcomer books the next free time, half a second after the last
/// booking, and starts when it comes back at it.
#[test]
fn a_rate_books_tokens_spaced_by_its_interval() {
    let mut l = LimitState::default();
    let rate = paced(2, S, 2);
    let half = 500 * MS;
    assert_eq!(
        ask(&mut l, rate, "a-1", false, Duration::ZERO).decision,
        LimitDecision::Granted
    );
    assert_eq!(
        ask(&mut l, rate, "b-1", false, Duration::ZERO).decision,
        LimitDecision::Granted
    );
    assert_eq!(
        ask(&mut l, rate, "c-1", false, Duration::ZERO).decision,
        wait(half, 0, LimitCause::Rate)
    );
    assert_eq!(
        ask(&mut l, rate, "d-1", false, Duration::ZERO).decision,
        wait(S, 0, LimitCause::Rate)
    );
    assert_eq!(
        ask(&mut l, rate, "d-1", false, 100 * MS).decision,
        wait(900 * MS, 0, LimitCause::Rate),
        "asking early keeps the booking"
    );
    assert_eq!(
        ask(&mut l, rate, "c-1", false, half).decision,
        LimitDecision::Granted
    );
    assert_eq!(
        ask(&mut l, rate, "e-1", false, half).decision,
        wait(S, 0, LimitCause::Rate),
        "a newcomer books after d"
    );
    assert_eq!(
        ask(&mut l, rate, "d-1", false, S).decision,
        LimitDecision::Granted
    );
    assert_eq!(l.usage(S).booked, 1);
}

/// Waiters that come back late all at once start one interval apart, in
/// the order of their bookings; a newcomer does not take a token owed to
/// a waiter whose booking fell due within `LATE`.
#[test]
fn late_waiters_start_spaced_and_keep_their_tokens() {
    let mut l = LimitState::default();
    let rate = paced(1, S, 1);
    ask(&mut l, rate, "a-1", false, Duration::ZERO);
    assert_eq!(
        ask(&mut l, rate, "b-1", false, Duration::ZERO).decision,
        wait(S, 0, LimitCause::Rate)
    );
    assert_eq!(
        ask(&mut l, rate, "c-1", false, Duration::ZERO).decision,
        wait(2 * S, 0, LimitCause::Rate)
    );
    // Both come back at 2.5 s: b (due 1 s) starts and the bucket's next
    // token is at 3.5 s; c (due 2 s) keeps its booking and is told so.
    let late = 2500 * MS;
    assert_eq!(
        ask(&mut l, rate, "b-1", false, late).decision,
        LimitDecision::Granted
    );
    assert_eq!(
        ask(&mut l, rate, "c-1", false, late).decision,
        wait(S, 0, LimitCause::Rate)
    );
    // A newcomer books the bucket's next token after c's booking.
    let d = ask(&mut l, rate, "d-1", false, 2600 * MS);
    assert_eq!(d.decision, wait(900 * MS, 0, LimitCause::Rate));
    assert_eq!(
        ask(&mut l, rate, "c-1", false, 3500 * MS).decision,
        LimitDecision::Granted
    );

    // The bucket has a token at 1.5 s, but it is owed to b, due at 1 s:
    // the newcomer books behind it, and b, 0.6 s late, still starts.
    let mut l = LimitState::default();
    ask(&mut l, rate, "a-1", false, Duration::ZERO);
    ask(&mut l, rate, "b-1", false, Duration::ZERO);
    let x = ask(&mut l, rate, "x-1", false, 1500 * MS);
    assert_eq!(x.decision, wait(500 * MS, 0, LimitCause::Rate));
    assert_eq!(
        ask(&mut l, rate, "b-1", false, 1600 * MS).decision,
        LimitDecision::Granted
    );
    // More than LATE past its due time, a booking is owed nothing.
    let mut l = LimitState::default();
    ask(&mut l, rate, "a-1", false, Duration::ZERO);
    ask(&mut l, rate, "b-1", false, Duration::ZERO);
    let y = ask(&mut l, rate, "y-1", false, 2 * S + MS);
    assert_eq!(
        y.decision,
        LimitDecision::Granted,
        "b is more than a second late"
    );
}

/// Starts never exceed `burst + count * T / per` over any window `T`,
/// however the requests come: a seeded sequence of asks (newcomers, and
/// waiters coming back early, on time and late) on a rate of 3 a second
/// with a burst of 2, every start's moment checked against every other.
#[test]
fn starts_never_exceed_the_rate_over_any_window() {
    use rand::{Rng, SeedableRng};
    let seed = std::env::var("LIMIT_SEED").map_or(11, |s| s.parse().expect("LIMIT_SEED: a number"));
    println!("LIMIT_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let rate = paced(3, S, 2);
    let mut l = LimitState::default();
    let mut now = Duration::ZERO;
    let mut starts: Vec<Duration> = Vec::new();
    let mut next_task = 0u32;
    let mut told: Vec<(u32, Duration)> = Vec::new();
    for _ in 0..3000 {
        now += Duration::from_micros(rng.gen_range(0..400_000));
        let (task, _) = if !told.is_empty() && rng.gen_bool(0.7) {
            told.swap_remove(rng.gen_range(0..told.len()))
        } else {
            next_task += 1;
            (next_task, now)
        };
        match ask(&mut l, rate, &format!("t{task}-1"), false, now).decision {
            LimitDecision::Granted => starts.push(now),
            LimitDecision::Wait { retry_after, .. } => told.push((task, now + retry_after)),
        }
    }
    assert!(starts.len() > 1000, "the sequence started {}", starts.len());
    let interval = rate.rate.unwrap().interval();
    for (i, first) in starts.iter().enumerate() {
        for (j, last) in starts.iter().enumerate().skip(i) {
            let window = *last - *first;
            let allowed = 2 + (window.as_nanos() / interval.as_nanos()) as usize;
            assert!(
                j - i < allowed,
                "{} starts in {window:?} (seed {seed})",
                j - i + 1
            );
        }
    }
}

/// A booking its waiter never claims is dropped `BOOKING_GRACE` after it
/// was due, and the state is idle once nothing is held, waits or is
/// booked and the bucket refilled.
#[test]
fn what_nobody_claims_runs_out_and_the_state_goes_idle() {
    let mut l = LimitState::default();
    let rate = paced(1, S, 1);
    ask(&mut l, rate, "a-1", false, Duration::ZERO);
    ask(&mut l, rate, "b-1", false, Duration::ZERO);
    assert!(!l.is_idle(S), "b's booking");
    assert_eq!(l.usage(S + BOOKING_GRACE - MS).booked, 1);
    assert_eq!(l.usage(S + BOOKING_GRACE).booked, 0);
    assert!(l.is_idle(S + BOOKING_GRACE));
    let mut held = LimitState::default();
    ask(&mut held, slots(1), "a-1", false, Duration::ZERO);
    assert!(!held.is_idle(10 * S - MS));
    held.prune(10 * S);
    assert!(held.is_idle(10 * S));
}
