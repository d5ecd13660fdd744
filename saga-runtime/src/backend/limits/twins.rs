//! A store's [`Limits`] and the [limit machine](crate::limit::machine) side by
//! side: the same requests, at (nearly) the same moments, must get the
//! same answers from both. This is how the stores that decide in the
//! server (Redis's scripts, PostgreSQL's functions) are held to the one
//! machine; the conformance suite runs it on every store
//! (`limits_decide_as_the_machine_does`).

// A test kit: a failed call fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Acquired, LimitCause, LimitDecision, LimitRequest, Limits};
use crate::limit::machine::LimitState;
use crate::limit::LimitConfig;

/// What one step of a sequence does to one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitOpKind {
    /// Ask to start (the holder `t{task}-a{attempt}`, waiting as `t{task}`).
    Acquire,
    /// Release the holder's slot.
    Release,
    /// Renew the holder's slot.
    Renew,
    /// Read the use.
    Usage,
    /// The waiter stops waiting.
    Leave,
}

/// One operation on one limit, as a seeded sequence draws it.
#[derive(Debug, Clone, Copy)]
pub struct LimitOp<'a> {
    /// The limit's name.
    pub name: &'a str,
    /// What it allows.
    pub config: LimitConfig,
    /// The key's value, for a keyed use.
    pub key: Option<&'a str>,
    /// The task: its waiter is `t{task}`.
    pub task: u32,
    /// The attempt: its holder is `t{task}-a{attempt}`.
    pub attempt: u32,
    /// What it does.
    pub kind: LimitOpKind,
    /// Whether an acquire queues (with the waiter's name as its wake).
    pub wakes: bool,
}

/// The two sides and what they went through, so that a test can tell it
/// covered the protocol.
pub struct LimitTwins {
    store: Arc<dyn Limits>,
    machine: HashMap<(String, Option<String>), LimitState>,
    epoch: Instant,
    seen: BTreeMap<&'static str, usize>,
}

/// A decision in short: `G` granted, `C<ahead>` waits for a slot with
/// that many ahead, `R` waits for a token.
fn short(acquired: &Acquired) -> String {
    match acquired.decision {
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
    }
}

impl LimitTwins {
    /// `store` beside a machine that has seen nothing.
    pub fn new(store: Arc<dyn Limits>) -> Self {
        LimitTwins {
            store,
            machine: HashMap::new(),
            epoch: Instant::now(),
            seen: BTreeMap::new(),
        }
    }

    fn saw(&mut self, what: &'static str, n: usize) {
        *self.seen.entry(what).or_default() += n;
    }

    /// Runs `f` on the machine's state of `(name, key)` at the time now,
    /// dropping it once idle, as a store drops an idle key.
    fn decide<T>(&mut self, op: &LimitOp<'_>, f: impl FnOnce(&mut LimitState, Duration) -> T) -> T {
        let now = self.epoch.elapsed();
        let id = (op.name.to_owned(), op.key.map(str::to_owned));
        let state = self.machine.entry(id.clone()).or_default();
        let out = f(state, now);
        if state.is_idle(now) {
            self.machine.remove(&id);
        }
        out
    }

    /// Runs `op` on both and asserts the same answer: the same decision,
    /// place in line, wakes, release and use, and a wait within `slack`
    /// of the other's. `at` names the step in a failure.
    pub async fn run(&mut self, op: &LimitOp<'_>, hold: Duration, slack: Duration, at: &str) {
        let holder = format!("t{}-a{}", op.task, op.attempt);
        let waiter = format!("t{}", op.task);
        let (name, key, config) = (op.name, op.key, op.config);
        match op.kind {
            LimitOpKind::Acquire => {
                let request = LimitRequest {
                    limit: name,
                    key,
                    config,
                    holder: &holder,
                    waiter: &waiter,
                    hold_for: hold,
                    wake: op.wakes.then_some(waiter.as_str()),
                };
                let got = self.store.limit_acquire(&request).await.unwrap();
                let machine = self.decide(op, |l, now| l.acquire(&request, now));
                assert_eq!(
                    (short(&got), &got.wake),
                    (short(&machine), &machine.wake),
                    "{at}: acquire (store, machine)"
                );
                if let (
                    LimitDecision::Wait { retry_after: a, .. },
                    LimitDecision::Wait { retry_after: b, .. },
                ) = (&got.decision, &machine.decision)
                {
                    assert!(a.abs_diff(*b) <= slack, "{at}: waits {a:?} and {b:?}");
                }
                let decision = match got.decision {
                    LimitDecision::Granted => "G",
                    LimitDecision::Wait {
                        cause: LimitCause::Concurrency,
                        ..
                    } => "C",
                    LimitDecision::Wait { .. } => "R",
                };
                self.saw(decision, 1);
                self.saw("woken", got.wake.len());
            }
            LimitOpKind::Release | LimitOpKind::Leave => {
                let leave = op.kind == LimitOpKind::Leave;
                let got = if leave {
                    self.store.limit_leave(name, key, &waiter, config).await
                } else {
                    self.store.limit_release(name, key, &holder, config).await
                };
                let got = got.unwrap();
                let machine = self.decide(op, |l, now| {
                    if leave {
                        l.leave(&waiter, config, now)
                    } else {
                        l.release(&holder, config, now)
                    }
                });
                let what = if leave { "left" } else { "freed" };
                assert_eq!(got, machine, "{at}: {what} (store, machine)");
                self.saw("woken", got.wake.len());
                self.saw(what, usize::from(got.released));
            }
            LimitOpKind::Renew => {
                let got = self.store.limit_renew(name, key, &holder, hold).await;
                let machine = self.decide(op, |l, now| l.renew(&holder, hold, now));
                assert_eq!(got.unwrap(), machine, "{at}: renew (store, machine)");
            }
            LimitOpKind::Usage => {
                let got = self.store.limit_usage(name, key, config).await.unwrap();
                let machine = self.decide(op, |l, now| l.usage(now));
                assert_eq!(got, machine, "{at}: usage (store, machine)");
                self.saw("booked", got.booked as usize);
            }
        }
    }

    /// Asserts the sequence went through each of `kinds` (`G`, `C`, `R`,
    /// `woken`, `freed`, `left`, `booked`) at least `least` times.
    pub fn covered(&self, kinds: &[&str], least: usize) {
        for kind in kinds {
            let n = self.seen.get(kind).copied().unwrap_or(0);
            assert!(n >= least, "{kind}: {:?}", self.seen);
        }
    }
}
