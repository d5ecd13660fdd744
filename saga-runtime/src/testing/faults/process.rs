//! The fault kit for process managers: the same messages delivered three
//! ways through the real dispatch ([`ProcessTest`]): once each in the
//! given order (the baseline), in that order with duplicates (same message
//! id, delivered again later), and in a seeded shuffled order with the
//! duplicates.
//!
//! The engine promises that a duplicate changes nothing: the duplicated
//! run must end with the baseline's instances and handler runs, or the run
//! fails with its seed. Whether a process manager reaches the same state
//! whatever the order its messages arrive in is its own design's business:
//! the report says so ([`ProcessFaultReport::order_independent`]) for a
//! test to assert when it should hold.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::journal::roll;
use crate::process::{
    ErrorAction, Failure, Message, ProcessContext, ProcessDefinition, ProcessError, ProcessManager,
};
use crate::saga::BoxFuture;
use crate::testing::ProcessTest;
use crate::util::Unpoisoned;

/// Handler runs per message type.
type Runs = Arc<Mutex<BTreeMap<String, u32>>>;

/// The user's process manager, counting its handlers' runs.
struct Counted<P> {
    pm: P,
    runs: Runs,
}

impl<P: ProcessManager> ProcessManager for Counted<P> {
    type State = P::State;
    const NAME: &'static str = P::NAME;

    fn definition() -> &'static ProcessDefinition {
        P::definition()
    }

    fn new_state() -> Self::State {
        P::new_state()
    }

    fn encode_state(state: &Self::State) -> Result<Value, ProcessError> {
        P::encode_state(state)
    }

    fn decode_state(state: Value) -> Result<Self::State, ProcessError> {
        P::decode_state(state)
    }

    fn handle<'a>(
        &'a self,
        message_type: &'a str,
        message: Value,
        state: &'a mut Self::State,
        ctx: &'a mut ProcessContext,
    ) -> BoxFuture<'a, Result<(), ProcessError>> {
        *self
            .runs
            .locked()
            .entry(message_type.to_owned())
            .or_insert(0) += 1;
        self.pm.handle(message_type, message, state, ctx)
    }

    fn state_keys(state: &Self::State) -> Vec<(&'static str, String)> {
        P::state_keys(state)
    }

    fn message_key(message_type: &str, message: &Value) -> Result<Option<String>, ProcessError> {
        P::message_key(message_type, message)
    }

    fn seed(
        message_type: &str,
        message: &Value,
        state: &mut Self::State,
    ) -> Result<(), ProcessError> {
        P::seed(message_type, message, state)
    }

    fn on_error(&self, failure: &Failure) -> ErrorAction {
        self.pm.on_error(failure)
    }
}

/// What a [`ProcessFaultKit`] run found; the same seed gives the same one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessFaultReport {
    /// The seed.
    pub seed: u64,
    /// The messages (by position among those given) delivered twice.
    pub duplicated: Vec<usize>,
    /// The shuffled run's delivery order, duplicates included.
    pub order: Vec<usize>,
    /// Handler runs per message type in the baseline run.
    pub baseline_runs: BTreeMap<String, u32>,
    /// Handler runs per message type in the shuffled run.
    pub runs: BTreeMap<String, u32>,
    /// Whether the shuffled run ended with the baseline's instances.
    pub order_independent: bool,
}

/// Runs a process manager's messages three ways: once each in the given
/// order (the baseline), in that order with duplicates (the same message
/// id delivered again later), and shuffled with the duplicates. The run
/// fails, printing its seed, when the duplicates changed the instances or
/// the handler runs (the engine deduplicates by message id); whether the
/// shuffled order did is reported, for a process manager meant to be
/// order-independent to assert.
pub struct ProcessFaultKit<P: ProcessManager> {
    make: Box<dyn Fn() -> P + Send + Sync>,
    messages: Vec<(&'static str, Value)>,
    seed: u64,
    duplicate: f64,
}

impl<P: ProcessManager> ProcessFaultKit<P> {
    /// A kit for the process manager `make` builds (once per delivery
    /// run), with no messages yet, seed 0, and a third of the messages
    /// duplicated.
    pub fn new(make: impl Fn() -> P + Send + Sync + 'static) -> Self {
        ProcessFaultKit {
            make: Box::new(make),
            messages: Vec::new(),
            seed: 0,
            duplicate: 0.35,
        }
    }

    /// Adds a message, as if published (it gets its own message id).
    ///
    /// # Panics
    ///
    /// If it does not serialize.
    pub fn message<M: Message>(mut self, message: M) -> Self {
        let payload = serde_json::to_value(&message)
            .unwrap_or_else(|e| panic!("`{}` does not serialize: {e}", M::TYPE));
        self.messages.push((M::TYPE, payload));
        self
    }

    /// The seed (`SAGA_FAULT_SEED` overrides it).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The share of messages delivered twice, in [0, 1].
    pub fn duplicates(mut self, share: f64) -> Self {
        self.duplicate = share;
        self
    }

    /// Delivers the messages the three ways and compares.
    ///
    /// # Panics
    ///
    /// When duplicates changed the outcome (the message has the seed).
    pub async fn run(&self) -> ProcessFaultReport {
        let seed = std::env::var(super::SEED_VAR)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(self.seed);
        let dice = |i: usize, tag: &str| roll(seed, i, tag, 0);
        let n = self.messages.len();
        let duplicated: Vec<usize> = (0..n)
            .filter(|&i| dice(i, "pm-duplicate") < self.duplicate)
            .collect();
        // In order, each duplicate right after a later message (or last).
        let mut in_order: Vec<usize> = (0..n).collect();
        for &i in duplicated.iter().rev() {
            let later = i + 1 + (dice(i, "pm-dup-at") * (n - i) as f64) as usize;
            in_order.insert(later.min(in_order.len()), i);
        }
        let mut shuffled = in_order.clone();
        for k in (1..shuffled.len()).rev() {
            let j = (dice(k, "pm-shuffle") * (k + 1) as f64) as usize;
            shuffled.swap(k, j.min(k));
        }
        let once: Vec<usize> = (0..n).collect();
        let (base_state, baseline_runs) = self.deliver(&once).await;
        let (dup_state, dup_runs) = self.deliver(&in_order).await;
        let (shuffled_state, runs) = self.deliver(&shuffled).await;
        let report = ProcessFaultReport {
            seed,
            duplicated,
            order: shuffled,
            baseline_runs: baseline_runs.clone(),
            runs,
            order_independent: shuffled_state == base_state,
        };
        if dup_state != base_state || dup_runs != baseline_runs {
            panic!(
                "fault kit: seed {seed}: duplicate deliveries changed the outcome of `{}`\n  \
                 handler runs {baseline_runs:?} once each, {dup_runs:?} with duplicates\n  \
                 instances once each: {base_state:?}\n  with duplicates: {dup_state:?}\n\
                 replay it with ProcessFaultKit::seed({seed}) or SAGA_FAULT_SEED={seed}",
                P::NAME
            );
        }
        report
    }

    /// Delivers the messages in `order` (an index twice: the same message
    /// id twice), lets every retry and timeout fall due, and returns the
    /// instances (as comparable text, sorted) and the handler runs.
    async fn deliver(&self, order: &[usize]) -> (Vec<String>, BTreeMap<String, u32>) {
        let runs = Runs::default();
        let mut test = ProcessTest::new(Counted {
            pm: (self.make)(),
            runs: runs.clone(),
        });
        for &i in order {
            let (message_type, payload) = &self.messages[i];
            test.when_raw(&format!("fault-kit-{i}"), message_type, payload.clone())
                .await;
        }
        test.advance(Duration::from_secs(7 * 24 * 3600)).await;
        let mut instances: Vec<String> = test
            .instances()
            .await
            .into_iter()
            .map(|i| format!("{:?} {:?} {}", i.keys, i.status, i.state))
            .collect();
        instances.sort();
        let runs = runs.locked().clone();
        (instances, runs)
    }
}
