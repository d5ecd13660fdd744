//! [`ProcessContext`]: what a handler may do besides changing its state.
//! Everything it collects is written in the same atomic save as the state.

use std::time::Duration;

use serde_json::Value;

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
    pub(crate) message_id: String,
    pub(crate) outgoing: Vec<Outgoing>,
    pub(crate) timeouts: Vec<ScheduledTimeout>,
    pub(crate) complete: bool,
    pub(crate) stop: bool,
    pub(crate) error: Option<String>,
}

impl ProcessContext {
    pub(crate) fn new(process: &'static str, instance_id: String, message_id: String) -> Self {
        ProcessContext {
            process,
            instance_id,
            message_id,
            outgoing: Vec::new(),
            timeouts: Vec::new(),
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

    /// Sends `msg` to the endpoint `endpoint` (another service's queue),
    /// when the handler returns `Ok`.
    pub fn send<M: Message>(&mut self, endpoint: &str, msg: M) {
        if let Some(payload) = self.encode(&msg) {
            self.outgoing.push(Outgoing {
                target: Target::Endpoint(endpoint.to_owned()),
                message_type: M::TYPE.to_owned(),
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
