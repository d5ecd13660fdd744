//! [`Limits`](crate::backend::Limits) (needs [`Backend::limits`](crate::backend::Backend::limits))
//! and [`WorkQueue::wake`](crate::backend::WorkQueue::wake).

use super::*;
use crate::backend::{Acquired, LimitCause, LimitDecision, LimitRequest, Limits, Released};
use crate::limit::{LimitConfig, Rate};

fn limit_part(b: &Arc<dyn Backend>) -> Arc<dyn Limits> {
    b.clone().limits().expect(
        "this case needs `Backend::limits`: for a saga-only backend run `backend_conformance!(fresh, core)`",
    )
}

const SLOTS: LimitConfig = LimitConfig {
    concurrency: Some(2),
    rate: None,
};

fn request<'a>(
    limit: &'a str,
    key: Option<&'a str>,
    config: LimitConfig,
    holder: &'a str,
    wake: Option<&'a str>,
    hold_for: Duration,
) -> LimitRequest<'a> {
    LimitRequest {
        limit,
        key,
        config,
        holder,
        // One waiter per holder name's task: `t1-a1` waits as `t1`.
        waiter: holder.split('-').next().unwrap_or(holder),
        hold_for,
        wake,
    }
}

fn granted() -> Acquired {
    Acquired {
        decision: LimitDecision::Granted,
        wake: Vec::new(),
    }
}

fn waits(acquired: &Acquired, cause: LimitCause) -> (Duration, u64) {
    match acquired.decision {
        LimitDecision::Wait {
            retry_after,
            ahead,
            cause: c,
        } if c == cause => (retry_after, ahead),
        ref other => panic!("expected a wait for {cause:?}, got {other:?}"),
    }
}

/// At most N slots are held; the refused join a line in arrival order and
/// keep their place when they ask again; a release reserves the freed
/// slot for the first in line (whose wake it returns), which a newcomer
/// cannot take; asking again with the same holder takes no second slot.
pub async fn limits_hold_slots_and_hand_them_on_in_line(b: Arc<dyn Backend>) {
    let l = limit_part(&b);
    let hold = TTL;
    let ask = |holder: &'static str, wake: Option<&'static str>| {
        let l = l.clone();
        async move {
            l.limit_acquire(&request("psp", None, SLOTS, holder, wake, hold))
                .await
                .unwrap()
        }
    };
    assert_eq!(ask("t1-a1", Some("w1")).await, granted());
    assert_eq!(ask("t2-a1", Some("w2")).await, granted());
    assert_eq!(
        ask("t1-a1", Some("w1")).await,
        granted(),
        "the same holder asking again holds the slot it has"
    );
    let (retry, ahead) = waits(&ask("t3-a1", Some("w3")).await, LimitCause::Concurrency);
    assert_eq!(ahead, 0, "first in line");
    assert!(
        retry > Duration::ZERO && retry <= hold,
        "come back by the first slot's expiry at the latest: {retry:?}"
    );
    let (_, ahead) = waits(&ask("t4-a1", Some("w4")).await, LimitCause::Concurrency);
    assert_eq!(ahead, 1, "second in line");
    let (_, ahead) = waits(&ask("t3-a1", Some("w3")).await, LimitCause::Concurrency);
    assert_eq!(ahead, 0, "asking again keeps its place");
    let (_, ahead) = waits(&ask("t5-a1", None).await, LimitCause::Concurrency);
    assert_eq!(
        ahead, 2,
        "a request without a wake is told the line's length"
    );
    let usage = l.limit_usage("psp", None, SLOTS).await.unwrap();
    assert_eq!((usage.in_use, usage.waiting), (2, 2), "{usage:?}");

    let released = l.limit_release("psp", None, "t1-a1", SLOTS).await.unwrap();
    assert_eq!(
        released,
        Released {
            released: true,
            wake: vec!["w3".to_owned()]
        },
        "the freed slot is reserved for the first in line"
    );
    assert_eq!(
        l.limit_release("psp", None, "t1-a1", SLOTS).await.unwrap(),
        Released::default(),
        "a second release frees nothing"
    );
    waits(&ask("t6-a1", Some("w6")).await, LimitCause::Concurrency);
    waits(&ask("t5-a1", None).await, LimitCause::Concurrency);
    assert_eq!(
        ask("t3-a2", Some("w3")).await,
        granted(),
        "the woken waiter takes its reservation (with a new attempt's holder)"
    );
    let (_, ahead) = waits(&ask("t4-a1", Some("w4")).await, LimitCause::Concurrency);
    assert_eq!(ahead, 0, "t4 is first now, ahead of t6");
    let usage = l.limit_usage("psp", None, SLOTS).await.unwrap();
    assert_eq!((usage.in_use, usage.waiting), (2, 2), "{usage:?}");

    assert!(
        l.limit_release("psp", None, "t2-a1", SLOTS)
            .await
            .unwrap()
            .released
    );
    assert!(
        l.limit_release("psp", None, "t3-a2", SLOTS)
            .await
            .unwrap()
            .released
    );
    assert_eq!(ask("t4-a2", Some("w4")).await, granted());
    assert_eq!(ask("t6-a2", Some("w6")).await, granted());
    let usage = l.limit_usage("psp", None, SLOTS).await.unwrap();
    assert_eq!((usage.in_use, usage.waiting), (2, 0), "{usage:?}");
    assert_eq!(
        l.limit_release("psp", None, "nobody", SLOTS).await.unwrap(),
        Released::default(),
        "a holder that holds nothing frees nothing"
    );
}

/// A slot expires when its holder stops renewing it (a killed worker),
/// and the slot goes to the first in line, woken by whoever notices; a
/// renewed slot outlives its first expiry; an expired holder can neither
/// renew nor free the slot now held by another.
pub async fn limits_expire_renew_and_never_free_twice(b: Arc<dyn Backend>) {
    let l = limit_part(&b);
    let one = LimitConfig {
        concurrency: Some(1),
        rate: None,
    };
    let short = Duration::from_millis(300);
    let ask = |holder: &'static str, wake: Option<&'static str>| {
        let l = l.clone();
        async move {
            l.limit_acquire(&request("mail", None, one, holder, wake, short))
                .await
                .unwrap()
        }
    };
    assert_eq!(ask("t1-a1", Some("w1")).await, granted());
    tokio::time::sleep(short / 2).await;
    assert!(l.limit_renew("mail", None, "t1-a1", short).await.unwrap());
    tokio::time::sleep(short / 2 + WAIT).await;
    let (retry, _) = waits(&ask("t2-a1", Some("w2")).await, LimitCause::Concurrency);
    assert!(
        retry <= short,
        "renewed: still held past its first expiry; t2 waits at most until it expires: {retry:?}"
    );
    tokio::time::sleep(short + WAIT).await;
    // t1 stopped renewing: its slot expired. Whoever calls next notices
    // and hands it to t2, the first in line.
    let noticed = ask("t3-a1", Some("w3")).await;
    waits(&noticed, LimitCause::Concurrency);
    assert_eq!(noticed.wake, vec!["w2".to_owned()], "t2 is woken");
    assert!(
        !l.limit_renew("mail", None, "t1-a1", short).await.unwrap(),
        "an expired holder cannot renew"
    );
    assert_eq!(
        l.limit_release("mail", None, "t1-a1", one).await.unwrap(),
        Released::default(),
        "an expired holder frees nothing (t2's reservation stands)"
    );
    assert_eq!(ask("t2-a1", Some("w2")).await, granted());
    tokio::time::sleep(2 * short + WAIT).await;
    // t2 never released, and t3 stayed away past its deadline (the wait
    // it was told plus its hold): both lapse, and a newcomer finds the
    // limit free.
    assert_eq!(ask("t9-a1", None).await, granted());
    let usage = l.limit_usage("mail", None, one).await.unwrap();
    assert_eq!((usage.in_use, usage.waiting), (1, 0), "{usage:?}");
}

/// A rate starts at most `burst` at once, then one per interval; a
/// refused waiter books the next token and is told when it is due, keeps
/// that booking when it asks early, and starts on it when it comes back;
/// later waiters book later tokens, in order.
pub async fn limits_pace_starts_and_book_tokens_in_order(b: Arc<dyn Backend>) {
    let l = limit_part(&b);
    let interval = Duration::from_millis(200);
    let paced = LimitConfig {
        concurrency: None,
        rate: Some(Rate {
            count: 5,
            per: Duration::from_secs(1),
            burst: 2,
        }),
    };
    let ask = |holder: &'static str| {
        let l = l.clone();
        async move {
            l.limit_acquire(&request("api", None, paced, holder, None, TTL))
                .await
                .unwrap()
        }
    };
    assert_eq!(ask("t1-a1").await, granted());
    assert_eq!(ask("t2-a1").await, granted(), "a burst of 2");
    let (first, ahead) = waits(&ask("t3-a1").await, LimitCause::Rate);
    assert_eq!(ahead, 0);
    assert!(
        first <= interval && first > interval / 2,
        "the next token is an interval away: {first:?}"
    );
    let (second, _) = waits(&ask("t4-a1").await, LimitCause::Rate);
    assert!(
        second > first + interval / 2 && second <= 2 * interval,
        "t4 books the token after t3's: {second:?} after {first:?}"
    );
    let (again, _) = waits(&ask("t3-a1").await, LimitCause::Rate);
    assert!(again <= first, "asking early keeps the booking: {again:?}");
    let usage = l.limit_usage("api", None, paced).await.unwrap();
    assert_eq!(usage.booked, 2, "{usage:?}");
    tokio::time::sleep(first + WAIT).await;
    assert_eq!(ask("t3-a2").await, granted(), "t3's booking is due");
    let (_, _) = waits(&ask("t4-a1").await, LimitCause::Rate);
    tokio::time::sleep(second.saturating_sub(first)).await;
    assert_eq!(ask("t4-a1").await, granted(), "t4's booking is due");
    let usage = l.limit_usage("api", None, paced).await.unwrap();
    assert_eq!(usage.booked, 0, "{usage:?}");
    // With both, a request refused a slot spends no token.
    let both = LimitConfig {
        concurrency: Some(1),
        rate: Some(Rate {
            count: 1,
            per: Duration::from_secs(60),
            burst: 1,
        }),
    };
    let ask_both = |holder: &'static str| {
        let l = l.clone();
        async move {
            l.limit_acquire(&request("both", None, both, holder, Some(holder), TTL))
                .await
                .unwrap()
        }
    };
    assert_eq!(ask_both("t1-a1").await, granted());
    waits(&ask_both("t2-a1").await, LimitCause::Concurrency);
    let usage = l.limit_usage("both", None, both).await.unwrap();
    assert_eq!((usage.in_use, usage.booked), (1, 0), "{usage:?}");
    let released = l.limit_release("both", None, "t1-a1", both).await.unwrap();
    assert_eq!(released.wake, vec!["t2-a1".to_owned()]);
    let (retry, _) = waits(&ask_both("t2-a1").await, LimitCause::Rate);
    assert!(
        retry > Duration::from_secs(50),
        "the one token a minute is spent: {retry:?}"
    );
}

/// Keys are independent: one key's full limit holds up no other key, nor
/// the unkeyed use of the name, nor another name; a wake for a delayed
/// saga message makes it due now, once.
pub async fn limits_keep_keys_apart_and_wake_delayed_messages(b: Arc<dyn Backend>) {
    let l = limit_part(&b);
    let one = LimitConfig {
        concurrency: Some(1),
        rate: None,
    };
    let ask = |key: Option<&'static str>, holder: &'static str| {
        let l = l.clone();
        async move {
            l.limit_acquire(&request("merchant", key, one, holder, Some(holder), TTL))
                .await
                .unwrap()
        }
    };
    assert_eq!(ask(Some("42"), "t1-a1").await, granted());
    waits(&ask(Some("42"), "t2-a1").await, LimitCause::Concurrency);
    assert_eq!(ask(Some("43"), "t3-a1").await, granted(), "another key");
    assert_eq!(ask(None, "t4-a1").await, granted(), "the unkeyed limit");
    let other = request("other", Some("42"), one, "t5-a1", None, TTL);
    assert_eq!(
        l.limit_acquire(&other).await.unwrap(),
        granted(),
        "another name"
    );
    let usage = l.limit_usage("merchant", Some("42"), one).await.unwrap();
    assert_eq!((usage.in_use, usage.waiting), (1, 1), "{usage:?}");

    // Waking: a delayed saga message becomes due now; a second wake, or
    // one for a message not delayed, does nothing.
    let t = task("s");
    create(&*b, &t).await;
    let d = receive(&*b, "a").await;
    let lease = lock(&*b, t.id).await;
    let mut cur = b.load_task(t.id).await.unwrap().unwrap();
    cur.seq += 1;
    let parked = message(&cur);
    let mut c = commit(&cur, &lease, Settle::Ack(&d));
    c.next = Some(Next {
        message: parked.clone(),
        delay: Duration::from_secs(3600),
    });
    b.commit(c).await.unwrap().unwrap();
    nothing_for(&*b, "a", WAIT).await;
    let mut other = parked.clone();
    other.seq += 1;
    assert!(!b.wake(&other).await.unwrap(), "not the delayed message");
    assert!(b.wake(&parked).await.unwrap(), "woken");
    assert!(
        !b.wake(&parked).await.unwrap(),
        "a second wake does nothing"
    );
    let woken = receive(&*b, "a").await;
    assert_eq!(woken.item, Ok(WorkItem::Saga(parked)));
}

/// Waiters that come back late, all at once, start no faster than the
/// bucket allows: the first takes the token, the others keep their
/// bookings and are told to come back one interval apart, in booking
/// order. A newcomer does not take the token of a waiter just due.
pub async fn limits_pace_waiters_that_come_back_late(b: Arc<dyn Backend>) {
    let l = limit_part(&b);
    let interval = Duration::from_millis(200);
    let paced = LimitConfig {
        concurrency: None,
        rate: Some(Rate {
            count: 5,
            per: Duration::from_secs(1),
            burst: 1,
        }),
    };
    let ask = |holder: &'static str| {
        let l = l.clone();
        async move {
            l.limit_acquire(&request("late", None, paced, holder, None, TTL))
                .await
                .unwrap()
        }
    };
    assert_eq!(ask("t1-a1").await, granted());
    for holder in ["t2-a1", "t3-a1", "t4-a1"] {
        waits(&ask(holder).await, LimitCause::Rate);
    }
    // All three bookings fall due; their waiters come back late, together.
    tokio::time::sleep(4 * interval).await;
    assert_eq!(
        ask("t2-a1").await,
        granted(),
        "the first due booking starts"
    );
    let (t3, _) = waits(&ask("t3-a1").await, LimitCause::Rate);
    let (t4, _) = waits(&ask("t4-a1").await, LimitCause::Rate);
    assert!(
        t3 <= interval && t3 > interval / 2,
        "t3 comes back when the bucket has a token: {t3:?}"
    );
    assert!(
        t4 > t3 + interval / 2 && t4 <= t3 + interval,
        "t4 one interval after t3: {t4:?} after {t3:?}"
    );
    let (_, _) = waits(&ask("t5-a1").await, LimitCause::Rate);
    tokio::time::sleep(t3).await;
    assert_eq!(ask("t3-a1").await, granted());
    let (again, _) = waits(&ask("t4-a1").await, LimitCause::Rate);
    assert!(again <= interval, "{again:?}");
    let usage = l.limit_usage("late", None, paced).await.unwrap();
    assert_eq!(usage.booked, 2, "t4 and t5 still booked: {usage:?}");

    // A newcomer finding the bucket's token while a waiter's booking has
    // just fallen due books behind it rather than take its token.
    let ask = |holder: &'static str| {
        let l = l.clone();
        async move {
            l.limit_acquire(&request("owed", None, paced, holder, None, TTL))
                .await
                .unwrap()
        }
    };
    assert_eq!(ask("o1-a1").await, granted());
    waits(&ask("o2-a1").await, LimitCause::Rate);
    tokio::time::sleep(interval + interval / 2).await;
    let (newcomer, _) = waits(&ask("o3-a1").await, LimitCause::Rate);
    assert!(
        newcomer <= interval / 2 + WAIT && newcomer > Duration::ZERO,
        "booked one interval after o2's token: {newcomer:?}"
    );
    assert_eq!(ask("o2-a1").await, granted(), "o2's token was kept for it");
}

/// A waiter that leaves (its task was cancelled while parked) gives up
/// its place in line and a slot reserved for it, which goes to the next
/// in line at once; its booked token is dropped.
pub async fn limits_a_waiter_that_leaves_frees_its_place(b: Arc<dyn Backend>) {
    let l = limit_part(&b);
    let one = LimitConfig {
        concurrency: Some(1),
        rate: None,
    };
    let ask = |holder: &'static str| {
        let l = l.clone();
        async move {
            l.limit_acquire(&request("leave", None, one, holder, Some(holder), TTL))
                .await
                .unwrap()
        }
    };
    assert_eq!(ask("t1-a1").await, granted());
    waits(&ask("t2-a1").await, LimitCause::Concurrency);
    waits(&ask("t3-a1").await, LimitCause::Concurrency);
    waits(&ask("t4-a1").await, LimitCause::Concurrency);
    let left = l.limit_leave("leave", None, "t3", one).await.unwrap();
    assert_eq!(
        left,
        Released {
            released: true,
            wake: Vec::new()
        },
        "t3 was in line"
    );
    let released = l.limit_release("leave", None, "t1-a1", one).await.unwrap();
    assert_eq!(released.wake, vec!["t2-a1".to_owned()], "t2 is first");
    // t2 was cancelled meanwhile: its reservation goes to t4 at once.
    let left = l.limit_leave("leave", None, "t2", one).await.unwrap();
    assert_eq!(
        left,
        Released {
            released: true,
            wake: vec!["t4-a1".to_owned()]
        },
        "t2's reserved slot goes to the next in line"
    );
    assert_eq!(ask("t4-a1").await, granted());
    let usage = l.limit_usage("leave", None, one).await.unwrap();
    assert_eq!((usage.in_use, usage.waiting), (1, 0), "{usage:?}");
    assert_eq!(
        l.limit_leave("leave", None, "t9", one).await.unwrap(),
        Released::default(),
        "a waiter that was not waiting"
    );
    // A rate booking is dropped with its waiter.
    let paced = LimitConfig {
        concurrency: None,
        rate: Some(Rate {
            count: 1,
            per: Duration::from_secs(60),
            burst: 1,
        }),
    };
    let book = |holder: &'static str| {
        let l = l.clone();
        async move {
            l.limit_acquire(&request("leave-rate", None, paced, holder, None, TTL))
                .await
                .unwrap()
        }
    };
    assert_eq!(book("r1-a1").await, granted());
    waits(&book("r2-a1").await, LimitCause::Rate);
    assert!(
        l.limit_leave("leave-rate", None, "r2", paced)
            .await
            .unwrap()
            .released
    );
    let usage = l.limit_usage("leave-rate", None, paced).await.unwrap();
    assert_eq!(usage.booked, 0, "{usage:?}");
}
