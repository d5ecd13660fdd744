//! The order of one instance's messages inside one engine.
//!
//! The worker loop reads messages in the order the store hands them out,
//! then runs each as a task of its own: until they queue on their
//! instance's lock (`instance_lock`), which is fair, the I/O each does on
//! the way (placement, limits) completes in any order, so two messages of
//! one instance read in order could be handled the other way round. A lane
//! is what a message is routed by (its process manager, and the instance
//! it names or its correlation value): the loop hands each message a
//! ticket in its lane as it reads it, synchronously, and a message goes
//! on to its instance's lock only once the message before it in its lane
//! has queued there (or ended another way). Messages of different lanes
//! never wait for each other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::util::Unpoisoned;
use tokio::sync::Notify;

/// Every lane with a message on its way to its lock, in this engine.
#[derive(Default)]
pub(crate) struct Lanes {
    lanes: Mutex<HashMap<String, Arc<Lane>>>,
}

#[derive(Default)]
struct Lane {
    turns: Mutex<Turns>,
    passed: Notify,
}

#[derive(Default)]
struct Turns {
    /// The next ticket to hand out.
    next: u64,
    /// The ticket whose turn it is: every lower one passed.
    serving: u64,
    /// Tickets above `serving` that passed before their turn (their
    /// messages ended early).
    early: std::collections::BTreeSet<u64>,
}

/// A message's place in its lane: its turn comes once every earlier
/// ticket passed; it passes when dropped, if not before.
pub(crate) struct Ticket {
    lanes: Arc<Lanes>,
    lane: String,
    number: u64,
    passed: bool,
}

impl Lanes {
    /// A ticket at the back of `lane`.
    pub(crate) fn enter(self: &Arc<Self>, lane: String) -> Ticket {
        let mut lanes = self.lanes.locked();
        let entry = lanes.entry(lane.clone()).or_default();
        let mut turns = entry.turns.locked();
        let number = turns.next;
        turns.next += 1;
        drop(turns);
        Ticket {
            lanes: self.clone(),
            lane,
            number,
            passed: false,
        }
    }

    fn lane(&self, lane: &str) -> Option<Arc<Lane>> {
        self.lanes.locked().get(lane).cloned()
    }

    /// How many lanes have a message on its way: bounded by the messages
    /// in flight (a lane goes once its last ticket passed).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lanes.locked().len()
    }
}

impl Ticket {
    /// Waits until every earlier message of the lane passed.
    pub(crate) async fn turn(&self) {
        let Some(lane) = self.lanes.lane(&self.lane) else {
            return;
        };
        loop {
            let passed = lane.passed.notified();
            tokio::pin!(passed);
            passed.as_mut().enable();
            if lane.turns.locked().serving >= self.number {
                return;
            }
            passed.await;
        }
    }

    /// Lets the next message of the lane go on (this one queued on its
    /// instance's lock, or ended). A ticket passes once, in its turn: one
    /// dropped early (its message ended before its turn came) passes when
    /// the turn reaches it.
    pub(crate) fn pass(&mut self) {
        if self.passed {
            return;
        }
        self.passed = true;
        let mut lanes = self.lanes.lanes.locked();
        let Some(lane) = lanes.get(&self.lane).cloned() else {
            return;
        };
        let mut turns = lane.turns.locked();
        turns.early.insert(self.number);
        loop {
            let serving = turns.serving;
            if !turns.early.remove(&serving) {
                break;
            }
            turns.serving += 1;
        }
        let empty = turns.serving >= turns.next;
        drop(turns);
        if empty {
            lanes.remove(&self.lane);
        }
        drop(lanes);
        lane.passed.notify_waiters();
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.pass();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_ticket_waits_for_the_earlier_ones_of_its_lane_only() {
        let lanes = Arc::new(Lanes::default());
        let mut first = lanes.enter("pm:a".into());
        let second = lanes.enter("pm:a".into());
        let other = lanes.enter("pm:b".into());
        first.turn().await;
        other.turn().await;
        let waiting = tokio::spawn(async move {
            second.turn().await;
            second
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiting.is_finished(), "went before the first passed");
        first.pass();
        let second = waiting.await.unwrap();
        drop(second);
        drop(other);
        drop(first);
        assert_eq!(lanes.len(), 0, "lanes are forgotten once empty");
    }

    #[tokio::test(start_paused = true)]
    async fn a_ticket_dropped_before_its_turn_does_not_block_the_lane() {
        let lanes = Arc::new(Lanes::default());
        let first = lanes.enter("pm:a".into());
        let second = lanes.enter("pm:a".into());
        let third = lanes.enter("pm:a".into());
        drop(second);
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), third.turn())
            .await
            .expect("the third's turn came");
    }
}
