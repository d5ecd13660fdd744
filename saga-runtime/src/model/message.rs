//! The traits of what process managers handle, send, publish and schedule.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A message a process manager can handle, send, publish or schedule:
/// `#[derive(Message)]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a message: add `#[derive(Message, Serialize, Deserialize)]` to it",
    label = "not a message",
    note = "what process managers handle, send, publish and schedule is routed by its `Message::TYPE` and stored as JSON"
)]
pub trait Message: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The message type's name on the wire (default: the Rust type's name;
    /// `#[message(name = "..")]` overrides it). Keep it stable across
    /// deploys: queued messages and timeouts carry it.
    const TYPE: &'static str;

    /// The value of the `#[correlation_id]` field, as a string; `None` for a
    /// message without one (timeouts, commands addressed elsewhere).
    fn correlation_id(&self) -> Option<String>;
}

/// A message with a `#[correlation_id]` field: required of the messages of
/// `#[starts]` and `#[handles]` handlers that have no `#[correlate(..)]`,
/// since the correlation id is then how they find their instance.
/// `#[derive(Message)]` implements it when a field is marked. Not a
/// subtrait of [`Message`]: a message missing a serde derive then gets one
/// error (on its `Message` impl), not a second one here.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a message with a `#[correlation_id]`, so this handler could never find its instance",
    label = "found by the message's correlation id, which `{Self}` does not have",
    note = "`#[derive(Message)]` on `{Self}` and mark its identifying field `#[correlation_id]`, or map a state property with `#[correlate(state.x = msg.x)]` on the handler"
)]
pub trait HasCorrelationId {}
