//! [`ProcessContext`]: what a handler may do besides changing its state.
//! Everything it collects is written in the same atomic save as the state.

use std::time::Duration;

use serde_json::Value;

use super::tally::{self, OpenTally, TallyOpening, TallyRef};
use super::Message;

/// Where an outgoing message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A named endpoint (another service's queue).
    Endpoint(String),
    /// Every process manager that handles the type (and the published-
    /// messages log).
    Publish,
}

/// A message a handler sent or published.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    /// Where to.
    pub target: Target,
    /// `Message::TYPE`.
    pub message_type: String,
    /// The message as JSON.
    pub payload: Value,
    /// Its `#[correlation_id]`, if it has one (for the envelope).
    pub correlation_id: Option<String>,
}

/// A timeout a handler requested.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledTimeout {
    /// Delay from the handler's "now".
    pub delay: Duration,
    /// `Message::TYPE`.
    pub message_type: String,
    /// The timeout message as JSON.
    pub payload: Value,
}

/// Passed to every handler.
#[derive(Debug)]
pub struct ProcessContext {
    pub(crate) process: &'static str,
    pub(crate) instance_id: String,
    pub(crate) generation: String,
    pub(crate) message_id: String,
    pub(crate) outgoing: Vec<Outgoing>,
    pub(crate) timeouts: Vec<ScheduledTimeout>,
    pub(crate) tallies: Vec<TallyOpening>,
    /// Tally reports asked for: `(delay, tally name)`.
    pub(crate) polls: Vec<(Duration, String)>,
    pub(crate) complete: bool,
    pub(crate) stop: bool,
    pub(crate) error: Option<String>,
}

impl ProcessContext {
    pub(crate) fn new(
        process: &'static str,
        instance_id: String,
        generation: String,
        message_id: String,
    ) -> Self {
        ProcessContext {
            process,
            instance_id,
            generation,
            message_id,
            outgoing: Vec::new(),
            timeouts: Vec::new(),
            tallies: Vec::new(),
            polls: Vec::new(),
            complete: false,
            stop: false,
            error: None,
        }
    }

    /// The process manager's name.
    pub fn process(&self) -> &'static str {
        self.process
    }

    /// The instance handling the message.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The id of the message being handled.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    fn encode<M: Message>(&mut self, msg: &M) -> Option<Value> {
        match serde_json::to_value(msg) {
            Ok(v) => Some(v),
            Err(e) => {
                // Surfaced as the handler's error at save time.
                self.error = Some(format!("`{}` does not serialize as JSON: {e}", M::TYPE));
                None
            }
        }
    }

    /// Sends `msg` to the endpoint `endpoint` (another service's queue,
    /// see [`crate::endpoint`]), when the handler returns `Ok`. Endpoint
    /// names use `A-Z a-z 0-9 - _ .`; another name fails the handler.
    pub fn send<M: Message>(&mut self, endpoint: &str, msg: M) {
        if let Some(payload) = self.encode(&msg) {
            if let Err(e) = crate::name::check("endpoint name", endpoint) {
                self.error.get_or_insert(e);
            }
            self.outgoing.push(Outgoing {
                target: Target::Endpoint(endpoint.to_owned()),
                message_type: M::TYPE.to_owned(),
                correlation_id: msg.correlation_id(),
                payload,
            });
        }
    }

    /// Publishes `msg` to every process manager that handles its type, when
    /// the handler returns `Ok`.
    pub fn publish<M: Message>(&mut self, msg: M) {
        if let Some(payload) = self.encode(&msg) {
            self.outgoing.push(Outgoing {
                target: Target::Publish,
                message_type: M::TYPE.to_owned(),
                correlation_id: msg.correlation_id(),
                payload,
            });
        }
    }

    /// Delivers `msg` to this instance's `#[timeout]` handler after `delay`
    /// (durably: the schedule survives restarts). Ignored if the instance is
    /// complete or gone by then.
    pub fn request_timeout<M: Message>(&mut self, delay: Duration, msg: M) {
        if let Some(payload) = self.encode(&msg) {
            self.timeouts.push(ScheduledTimeout {
                delay,
                message_type: M::TYPE.to_owned(),
                payload,
            });
        }
    }

    /// Opens a tally of `items` for fan-in (see [`tally`](super::tally)):
    /// written with this handler's save, so it exists exactly when the
    /// state that opened it does. Hand its [`reference`](OpenTally::reference)
    /// to whoever does the items; each checks its own off
    /// ([`Engine::tally`](crate::Engine::tally)) without touching this
    /// instance, and the instance receives one
    /// [`TallyCompleted`](super::TallyCompleted) when the last is checked
    /// (at once, for no items). Items are non-empty strings; duplicates
    /// count once.
    ///
    /// `name` is unique per instance (`A-Z a-z 0-9 - _ .`): opening a name
    /// the instance has opened before fails the handler.
    pub fn open_tally<I>(&mut self, name: &str, items: I) -> OpenTally<'_>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        if let Err(e) = crate::name::check("tally name", name) {
            self.error.get_or_insert(e);
        }
        let reference = self.tally(name);
        let items: Vec<String> = items.into_iter().map(Into::into).collect();
        if items.iter().any(String::is_empty) {
            self.error.get_or_insert(format!(
                "tally `{name}` has an empty item; items are non-empty strings"
            ));
        }
        let index = self.tallies.len();
        self.tallies.push(TallyOpening {
            name: name.to_owned(),
            items,
            deadline: None,
            keep_for: tally::DEFAULT_TALLY_KEEP,
        });
        OpenTally {
            opening: &mut self.tallies[index],
            reference,
        }
    }

    /// The reference of this instance's tally `name` (opened by this
    /// handler or an earlier one).
    pub fn tally(&self, name: &str) -> TallyRef {
        TallyRef {
            process: self.process.to_owned(),
            instance: self.instance_id.clone(),
            generation: self.generation.clone(),
            name: name.to_owned(),
        }
    }

    /// Delivers the [`TallyStatus`](super::TallyStatus) of this instance's
    /// tally `name` to it after `delay` (`deadline: false`), read when it
    /// is due: the periodic poll, for a process that would rather look at
    /// the sheet every so often than be told per item (ask again from the
    /// handler to keep polling). Not delivered if the tally is gone by
    /// then.
    pub fn poll_tally(&mut self, name: &str, delay: Duration) {
        self.polls.push((delay, name.to_owned()));
    }

    /// Marks the instance complete: later messages and timeouts are ignored
    /// (with an audit entry). The record is kept unless the process manager
    /// says `on_complete = delete`.
    pub fn mark_complete(&mut self) {
        self.complete = true;
    }

    /// Stops the instance and deletes its state (and its correlation
    /// entries). A later starting message creates a new instance.
    pub fn stop(&mut self) {
        self.stop = true;
    }

    /// Messages sent or published so far by this handler.
    pub fn outgoing(&self) -> &[Outgoing] {
        &self.outgoing
    }
}
