//! Test kits. [`faults`]: run your saga (or process manager) under seeded
//! faults and see how many times each body ran ([`FaultKit`]). Here:
//! [`ProcessTest`], a test kit for process managers: drive one with
//! messages and virtual time, then assert on its state, the messages it
//! sent and published, and the timeouts it scheduled.
//!
//! It runs the real routing, correlation and save code (the same dispatch
//! the workers run) against an in-memory store, synchronously: each call
//! returns once the message, and anything it caused to be redelivered at
//! once, has been handled. Time only moves when you call
//! [`advance`](ProcessTest::advance).
//!
//! ```
//! # use saga_runtime::prelude::*;
//! # use saga_runtime::testing::ProcessTest;
//! # use serde::{Deserialize, Serialize};
//! #[derive(Message, Serialize, Deserialize)]
//! struct Opened { #[correlation_id] id: String }
//! #[derive(Message, Serialize, Deserialize)]
//! struct Nudge;
//! #[derive(Default, Serialize, Deserialize)]
//! struct Ticket { nudged: bool }
//! struct Support;
//! #[process_manager(state = Ticket)]
//! impl Support {
//!     #[starts]
//!     async fn opened(&self, _m: Opened, _s: &mut Ticket, ctx: &mut ProcessContext) -> Result<(), ProcessError> {
//!         ctx.request_timeout(std::time::Duration::from_secs(3600), Nudge);
//!         Ok(())
//!     }
//!     #[timeout]
//!     async fn nudge(&self, _t: Nudge, s: &mut Ticket, _ctx: &mut ProcessContext) -> Result<(), ProcessError> {
//!         s.nudged = true;
//!         Ok(())
//!     }
//! }
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let mut t = ProcessTest::new(Support);
//! t.when(Opened { id: "t-1".into() }).await;
//! assert_eq!(t.scheduled().await.len(), 1);
//! t.advance(std::time::Duration::from_secs(3600)).await;
//! assert!(t.state("t-1").await.unwrap().nudged);
//! # }
//! ```
// A test kit: a failed expectation here is a failed test, reported by
// the panic where it happened.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
pub mod faults;

pub use faults::{FaultKit, FaultReport, Faults};

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::backend::memory::MemoryBackend;
use crate::backend::{
    DeadLetters, Endpoints, ProcessInstance, ProcessStore, Tallies, WorkItem, WorkQueue,
};
use crate::process::{Dispatched, Envelope, EnvelopeKind, Message, ProcessManager};
use crate::worker::process::dispatch::{dispatch, DispatchEnv};

/// The virtual clock's origin (wall-clock ms), so scheduled times look real.
const ORIGIN_MS: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

/// A message a process manager sent or published.
#[derive(Debug, Clone, PartialEq)]
pub struct SentMessage {
    /// `Message::TYPE`.
    pub message_type: String,
    /// The message as JSON.
    pub payload: Value,
}

impl SentMessage {
    /// Decodes the payload.
    pub fn decode<M: Message>(&self) -> Option<M> {
        (self.message_type == M::TYPE)
            .then(|| serde_json::from_value(self.payload.clone()).ok())
            .flatten()
    }
}

/// A scheduled timeout (or delayed retry).
#[derive(Debug, Clone, PartialEq)]
pub struct Scheduled {
    /// Time from now until it is due.
    pub due_in: Duration,
    /// `Message::TYPE`.
    pub message_type: String,
    /// The instance it is for (timeouts).
    pub instance_id: Option<String>,
    /// Whether it is a retry of a failed message (not a timeout, not a
    /// held message).
    pub retry: bool,
    /// Whether it is a message held for an instance that does not exist
    /// yet: due when its hold ends.
    pub held: bool,
}

/// Drives one process manager; see the [module docs](self).
pub struct ProcessTest<P: ProcessManager> {
    pm: Arc<P>,
    backend: MemoryBackend,
    now_ms: u64,
    hold_unmatched: Duration,
    dead_letter_unmatched: bool,
    _marker: PhantomData<P>,
}

impl<P: ProcessManager> ProcessTest<P> {
    /// A test of `pm` with an empty store, at virtual time zero.
    pub fn new(pm: P) -> Self {
        ProcessTest {
            pm: Arc::new(pm),
            backend: MemoryBackend::new(),
            now_ms: ORIGIN_MS,
            hold_unmatched: crate::DEFAULT_HOLD_UNMATCHED,
            dead_letter_unmatched: true,
            _marker: PhantomData,
        }
    }

    /// How long a continuing message that finds no instance is held, as
    /// [`EngineBuilder::hold_unmatched`](crate::EngineBuilder::hold_unmatched)
    /// (default 1 hour; the handler's `hold = ".."` goes first).
    pub fn hold_unmatched(mut self, hold: Duration) -> Self {
        self.hold_unmatched = hold;
        self
    }

    /// Whether such a message is dead-lettered once its hold is over, as
    /// [`EngineBuilder::dead_letter_unmatched`](crate::EngineBuilder::dead_letter_unmatched)
    /// (default: yes).
    pub fn dead_letter_unmatched(mut self, yes: bool) -> Self {
        self.dead_letter_unmatched = yes;
        self
    }

    /// Virtual time elapsed since the start.
    pub fn elapsed(&self) -> Duration {
        Duration::from_millis(self.now_ms - ORIGIN_MS)
    }

    /// Handles `msg` as if it had been published; same as [`when`](Self::when),
    /// named for the arrange part of a test.
    pub async fn given<M: Message>(&mut self, msg: M) -> Dispatched {
        self.when(msg).await
    }

    /// Handles `msg` (with a fresh message id), then anything it made due at
    /// once (an immediate retry, a message it published to itself).
    pub async fn when<M: Message>(&mut self, msg: M) -> Dispatched {
        self.when_with_id(&uuid::Uuid::new_v4().to_string(), msg)
            .await
    }

    /// [`when`](Self::when) with an explicit message id: call it twice with
    /// the same id to test duplicate delivery.
    pub async fn when_with_id<M: Message>(&mut self, message_id: &str, msg: M) -> Dispatched {
        let payload = serde_json::to_value(&msg).expect("message serializes");
        self.when_raw(message_id, M::TYPE, payload).await
    }

    /// [`when_with_id`](Self::when_with_id) with the message as JSON.
    pub(crate) async fn when_raw(
        &mut self,
        message_id: &str,
        message_type: &str,
        payload: Value,
    ) -> Dispatched {
        let def = P::definition();
        assert!(
            def.handler(message_type).is_some(),
            "process manager `{}` has no handler for `{}`",
            def.name,
            message_type
        );
        let envelope = Envelope {
            traceparent: crate::otel::current(),
            due_ms: None,
            hops: 0,
            hold_until: None,
            message_id: message_id.to_owned(),
            process: def.name.to_owned(),
            message_type: message_type.to_owned(),
            payload,
            kind: EnvelopeKind::Message,
            instance_id: None,
            generation: None,
            failures: 0,
            key: None,
            key_field: None,
        };
        // Through the queue, like a real delivery, so that dead-lettering
        // and acknowledgement behave as in production.
        self.backend
            .enqueue(&[WorkItem::Process(envelope)])
            .await
            .expect("memory store");
        self.drain()
            .await
            .into_iter()
            .next()
            .expect("the message was just enqueued")
    }

    /// Moves virtual time forward by `by`, delivering every timeout (and
    /// delayed retry) that falls due, in order. Returns their outcomes.
    pub async fn advance(&mut self, by: Duration) -> Vec<Dispatched> {
        let target = self.now_ms + by.as_millis() as u64;
        let mut outcomes = Vec::new();
        loop {
            let next = self
                .backend
                .process_scheduled()
                .await
                .expect("memory store")
                .first()
                .map(|(due, _)| *due);
            match next {
                Some(due) if due <= target => {
                    self.now_ms = self.now_ms.max(due);
                    self.backend
                        .process_release_due(self.now_ms, usize::MAX)
                        .await
                        .expect("memory store");
                    outcomes.extend(self.drain().await);
                }
                _ => break,
            }
        }
        self.now_ms = target;
        outcomes
    }

    async fn dispatch(
        &self,
        envelope: &Envelope,
        delivery: &crate::backend::Delivery,
    ) -> Dispatched {
        let own = P::definition();
        let subscribers = |t: &str| -> Vec<&'static str> {
            if own.handler(t).is_some() {
                vec![own.name]
            } else {
                Vec::new()
            }
        };
        let pm = self.pm.clone();
        let routing_key =
            move |process: &str, message_type: &str, payload: &Value| match process == own.name {
                true => crate::process::routing_key(pm.as_ref(), message_type, payload),
                false => (None, None),
            };
        let env = DispatchEnv {
            backend: &self.backend,
            placement: &self.backend,
            subscribers: &subscribers,
            routing_key: &routing_key,
            now_ms: self.now_ms,
            delivery: Some(delivery),
            cached: None,
            stale_read: false,
            saved: None,
            dead_letter_unmatched: self.dead_letter_unmatched,
            hold_unmatched: self.hold_unmatched,
            // Virtual time: a handler is never timed out here.
            handler_timeout: Duration::from_secs(365 * 24 * 60 * 60),
            tombstone_ttl: crate::worker::runtime::DEFAULT_PROCESS_TOMBSTONE_TTL,
            metrics: None,
            joiners: None,
        };
        dispatch(self.pm.as_ref(), &env, envelope)
            .await
            .expect("the in-memory store does not fail")
    }

    /// Handles everything queued (retries, messages published to itself).
    async fn drain(&self) -> Vec<Dispatched> {
        let mut outcomes = Vec::new();
        while let Some(delivery) = self
            .backend
            .receive("test", crate::backend::Interest::ALL, Duration::ZERO)
            .await
            .expect("memory store")
        {
            let Ok(WorkItem::Process(envelope)) = &delivery.item else {
                panic!(
                    "the test kit's queue holds only envelopes: {}",
                    delivery.raw
                );
            };
            outcomes.push(self.dispatch(envelope, &delivery).await);
        }
        outcomes
    }

    /// Checks `item` off `tally`, as a worker would with
    /// [`Engine::tally`](crate::Engine::tally), then handles what that made
    /// due (the completion, on the last item).
    pub async fn check(
        &mut self,
        tally: &crate::process::TallyRef,
        item: &str,
    ) -> (crate::process::TallyCheck, Vec<Dispatched>) {
        let checked = self
            .backend
            .tally_check(tally, item)
            .await
            .expect("memory store");
        (checked, self.drain().await)
    }

    /// The progress of `tally` (`None` if it does not exist).
    pub async fn tally_status(
        &self,
        tally: &crate::process::TallyRef,
    ) -> Option<crate::process::TallyStatus> {
        let progress = self
            .backend
            .tally_progress(tally, crate::process::tally::MISSING_LISTED, false)
            .await
            .expect("memory store")?;
        Some(crate::process::tally::status_of(tally, progress, false))
    }

    /// The instance `id`.
    pub async fn instance(&self, id: &str) -> Option<ProcessInstance> {
        self.backend
            .process_load(P::definition().name, id)
            .await
            .expect("memory store")
    }

    /// Every instance, oldest first.
    pub async fn instances(&self) -> Vec<ProcessInstance> {
        self.backend
            .process_list(P::definition().name)
            .await
            .expect("memory store")
    }

    /// The state of instance `id`.
    pub async fn state(&self, id: &str) -> Option<P::State> {
        let instance = self.instance(id).await?;
        Some(P::decode_state(instance.state).expect("state decodes"))
    }

    /// The state of the instance whose correlated field `field` is `value`.
    pub async fn state_by(&self, field: &str, value: &str) -> Option<P::State> {
        let instance = self
            .backend
            .process_find(P::definition().name, field, value)
            .await
            .expect("memory store")?;
        Some(P::decode_state(instance.state).expect("state decodes"))
    }

    /// Messages sent to `endpoint`, oldest first.
    pub async fn sent(&self, endpoint: &str) -> Vec<SentMessage> {
        self.endpoint(endpoint).await
    }

    /// Messages published, oldest first.
    pub async fn published(&self) -> Vec<SentMessage> {
        self.endpoint("published").await
    }

    async fn endpoint(&self, name: &str) -> Vec<SentMessage> {
        self.backend
            .endpoint_messages(name)
            .await
            .expect("memory store")
            .iter()
            .filter_map(|raw| {
                let v: Value = serde_json::from_str(raw).ok()?;
                Some(SentMessage {
                    message_type: v["message_type"].as_str()?.to_owned(),
                    payload: v["payload"].clone(),
                })
            })
            .collect()
    }

    /// Pending timeouts and delayed retries, soonest first.
    pub async fn scheduled(&self) -> Vec<Scheduled> {
        self.backend
            .process_scheduled()
            .await
            .expect("memory store")
            .into_iter()
            .map(|(due, envelope)| Scheduled {
                due_in: Duration::from_millis(due.saturating_sub(self.now_ms)),
                message_type: envelope.message_type,
                instance_id: envelope.instance_id,
                retry: envelope.kind == EnvelopeKind::Message && envelope.hold_until.is_none(),
                held: envelope.hold_until.is_some(),
            })
            .collect()
    }

    /// The dead-lettered messages (strict-routing stops, malformed payloads).
    pub async fn dead_letters(&self) -> Vec<crate::backend::DeadLetter> {
        let query = crate::backend::DeadLetterQuery {
            after: None,
            limit: usize::MAX,
        };
        let mut letters = self
            .backend
            .dead_letters(&query)
            .await
            .expect("memory store")
            .items;
        letters.reverse();
        letters
    }
}
