//! Process managers: message-driven workflows whose state is correlated to
//! incoming messages.
//!
//! Where a step saga follows a fixed chain, a process manager decides what to
//! do next from what it has already seen: messages arrive at different times,
//! in any order, possibly twice, and the coordination state must survive
//! restarts. `#[process_manager]` generates the routing; this module holds
//! the definitions it generates (this file), the handler's context
//! (`context`), its errors (`error`), tallies (`tally`) and the protocol's
//! pure core (`machine`: what a handler's run does to the instance); the
//! worker (`worker::process`) loads, runs and writes. The protocol:
//!
//! 1. A message is routed to every process manager with a handler for its
//!    type (one queue entry per process manager).
//! 2. The handler's correlation finds the instance: by the message's
//!    `#[correlation_id]`, or through an index from a state property
//!    (`#[correlate(state.order_number = msg.order_number)]`).
//! 3. The state is loaded (or default-constructed for a `#[starts]` message),
//!    handed to the handler, and saved when it returns `Ok`, together with
//!    everything it sent, published and scheduled, and the acknowledgement of
//!    the message: one atomic write (an outbox). On `Err` nothing is saved or
//!    sent, and `#[on_error]` decides.
//! 4. Saves are optimistic (a version compared on write); a conflict re-runs
//!    the handler on the fresh state, a bounded number of times, apart from
//!    the business retries of `#[on_error]`.

mod context;
mod error;
pub(crate) mod machine;
pub mod tally;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

pub use crate::model::envelope::{Envelope, EnvelopeKind};
pub use crate::model::message::{HasCorrelationId, Message};
pub use context::{Outgoing, ProcessContext, ScheduledTimeout, Target};
pub use error::{ErrorAction, Failure, FailureKind, ProcessError};
pub use machine::Dispatched;
pub use machine::HOLD_CAP;
pub use tally::{TallyCheck, TallyCompleted, TallyRef, TallyStatus};

use crate::util::BoxFuture;

/// Whether a handler may create an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerKind {
    /// `#[starts]`: creates the instance if none exists (`strict`: fails if
    /// one does).
    Starts {
        /// `#[starts(strict)]`.
        strict: bool,
    },
    /// `#[handles]`: continues an existing instance (`strict`: a missing
    /// instance is an error for `#[on_error]` instead of a dropped message).
    Handles {
        /// `#[handles(strict)]`.
        strict: bool,
        /// `#[handles(many)]`: the message reaches every instance whose
        /// correlated field holds its value, each on its own.
        many: bool,
    },
    /// `#[timeout]`: delivered to the instance that requested it; ignored if
    /// the instance is complete or gone.
    Timeout,
}

/// How a handler's message finds its instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Correlation {
    /// By the message's `#[correlation_id]`.
    Id,
    /// `#[correlate(state.<state_field> = msg.<message_field>)]`.
    Field {
        /// The state's field.
        state_field: &'static str,
        /// The message's field.
        message_field: &'static str,
    },
    /// A timeout: by the instance that requested it.
    Instance,
}

/// One handler of a process manager.
#[derive(Debug)]
pub struct HandlerDefinition {
    /// The method's name.
    pub method: &'static str,
    /// `Message::TYPE` of its message.
    pub message_type: &'static str,
    /// Starts, handles or timeout.
    pub kind: HandlerKind,
    /// How its message finds the instance.
    pub correlation: Correlation,
    /// `#[limit(..)]`s, in the order written (the key reads the message).
    pub limits: &'static [crate::limit::LimitSpec],
    /// What becomes of its message when no instance is found
    /// (`#[handles(hold = "..", then = ..)]`; for `#[handles]` only).
    pub unmatched: Unmatched,
}

/// What becomes of a `#[handles]` message that finds no instance: it is
/// **held**, durably, under the correlation value it looked for, and
/// released (in the order held) by the write that creates the instance or
/// claims the value; once its hold is over with no instance, `then`
/// decides. Messages of one workflow arrive in any order (from brokers,
/// from other services, from engines racing each other): a message that
/// is early is not a message that is wrong.
///
/// Each part left `None` takes the engine's setting
/// ([`EngineBuilder::hold_unmatched`](crate::EngineBuilder::hold_unmatched),
/// [`EngineBuilder::dead_letter_unmatched`](crate::EngineBuilder::dead_letter_unmatched)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Unmatched {
    /// How long the message waits for its instance
    /// (`#[handles(hold = "10m")]`); zero: not held at all.
    pub hold: Option<std::time::Duration>,
    /// What happens once it has waited that long (`then = dead_letter` or
    /// `then = drop`).
    pub then: Option<AfterHold>,
}

/// What happens to a message whose hold ended without an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterHold {
    /// Parked on the dead-letter queue with the reason (an operator can
    /// requeue it once the instance exists).
    DeadLetter,
    /// Dropped with a warning and counted as `unmatched`.
    Drop,
}

/// What happens to a completed instance's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnComplete {
    /// Keep it (queryable; later messages are ignored with an audit entry).
    #[default]
    Keep,
    /// Delete it (a later starting message would create a new instance).
    Delete,
}

/// How concurrent messages to one instance are serialised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Concurrency {
    /// A version compared on save; a conflict re-runs the handler.
    #[default]
    Optimistic,
    /// The instance's lease is held while its handler runs.
    Pessimistic,
}

/// The static shape of a process manager, produced by `#[process_manager]`.
#[derive(Debug)]
pub struct ProcessDefinition {
    /// `#[process_manager(name = "..")]`.
    pub name: &'static str,
    /// The state type's name, for messages.
    pub state_type: &'static str,
    /// Its handlers (not `#[on_error]`).
    pub handlers: &'static [HandlerDefinition],
    /// `#[process_manager(on_complete = keep | delete)]`.
    pub on_complete: OnComplete,
    /// `#[process_manager(concurrency = optimistic | pessimistic)]`.
    pub concurrency: Concurrency,
}

impl ProcessDefinition {
    /// The handler of a message type.
    pub fn handler(&self, message_type: &str) -> Option<&'static HandlerDefinition> {
        self.handlers
            .iter()
            .find(|h| h.message_type == message_type)
    }

    /// Whether instances share values of the state field `field` (a
    /// `#[handles(many)]` handler correlates by it): its index is a set of
    /// instances per value, not one owner.
    pub fn is_shared(&self, field: &str) -> bool {
        self.handlers.iter().any(|h| {
            matches!(h.kind, HandlerKind::Handles { many: true, .. })
                && matches!(h.correlation, Correlation::Field { state_field, .. } if state_field == field)
        })
    }
}

/// A process manager: implemented by `#[process_manager]`, not by hand.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a process manager",
    label = "not a process manager",
    note = "a process manager is a type whose `impl` block of handlers has `#[process_manager(state = ..)]`: add it there",
    note = "if `{Self}` is a `#[saga]`, register it with `.saga(..)` instead of `.process_manager(..)`, and start its tasks with `engine.start::<{Self}>(input)`"
)]
///
/// `State` is `Default + Serialize + Deserialize` (the macro checks it, with
/// one error on the type); the trait does not repeat the bound, so that a
/// missing derive is not reported again wherever the process manager is
/// used. Generic code goes through [`new_state`](Self::new_state),
/// [`encode_state`](Self::encode_state) and
/// [`decode_state`](Self::decode_state).
pub trait ProcessManager: Send + Sync + 'static {
    /// The coordination state.
    type State: Send + Sync + 'static;
    /// Its name.
    const NAME: &'static str;

    /// The static shape.
    fn definition() -> &'static ProcessDefinition
    where
        Self: Sized;

    /// A fresh state, for a starting message.
    fn new_state() -> Self::State
    where
        Self: Sized;

    /// The state as it is stored.
    fn encode_state(state: &Self::State) -> Result<Value, ProcessError>
    where
        Self: Sized;

    /// A stored state, typed.
    fn decode_state(state: Value) -> Result<Self::State, ProcessError>
    where
        Self: Sized;

    /// Runs the handler of `message_type` on the decoded message.
    fn handle<'a>(
        &'a self,
        message_type: &'a str,
        message: Value,
        state: &'a mut Self::State,
        ctx: &'a mut ProcessContext,
    ) -> BoxFuture<'a, Result<(), ProcessError>>;

    /// The values of the state's correlated fields (`#[correlate]`), as
    /// index keys: `(state field, value)`.
    fn state_keys(state: &Self::State) -> Vec<(&'static str, String)>
    where
        Self: Sized;

    /// The correlation value of an incoming message for its handler: the
    /// correlation id, or the mapped field's value.
    fn message_key(message_type: &str, message: &Value) -> Result<Option<String>, ProcessError>
    where
        Self: Sized;

    /// Seeds a fresh state from a starting message: copies the mapped field
    /// (`state.order_number = msg.order_number`), so the new instance is
    /// findable by it even if the handler does not set it.
    fn seed(
        message_type: &str,
        message: &Value,
        state: &mut Self::State,
    ) -> Result<(), ProcessError>
    where
        Self: Sized;

    /// `#[on_error]`, or the default policy: retry after 100 ms, 200 ms, then
    /// stop the instance and dead-letter the message.
    fn on_error(&self, failure: &Failure) -> ErrorAction {
        ErrorAction::default_for(failure)
    }
}

/// Canonical string of a correlation value: a JSON string's contents, else
/// the value's JSON text (so `42`, `"42"` and a UUID all read naturally).
#[doc(hidden)]
pub fn correlation_value<T: Serialize + ?Sized>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// The process manager's declared state is the state type a handler takes
/// (the same type, however it is spelled).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "this handler takes `&mut {Handler}` as its state, but the process manager's state is `{Self}`",
    label = "expected `{Self}`",
    note = "the second parameter of a handler is the state declared in `#[process_manager(state = {Self})]`: write `&mut {Self}`"
)]
pub trait SameState<Handler> {
    #[doc(hidden)]
    fn same(&mut self) -> &mut Handler;
}

#[diagnostic::do_not_recommend]
impl<T> SameState<T> for T {
    fn same(&mut self) -> &mut T {
        self
    }
}

/// Hands the instance's state to a handler as the handler's state type.
#[doc(hidden)]
pub fn same_state<State: SameState<Handler>, Handler>(state: &mut State) -> &mut Handler {
    state.same()
}

/// The two fields of a `#[correlate(state.a = msg.b)]` have one type: an
/// instance is found by the value of its field that equals the message's.
/// A trait rather than rustc's "mismatched types", whose advice for a
/// `Vec` field (wrap the message's field in `vec![..]`) is the wrong fix.
/// Implemented by the message's field, so that the error points there.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`#[correlate]` maps a state field of type `{StateField}` to a message field of type `{Self}`: they must be the same type",
    label = "expected `{StateField}`, the state field's type",
    note = "an instance is found by the one value of its state field that equals the message's field; a field holding several values (a `Vec`) is not an index key: correlate a field holding one value, and if several instances hold the same value, mark the handler `#[handles(many)]` to reach them all"
)]
pub trait SameField<StateField> {
    #[doc(hidden)]
    fn same(&mut self) -> &mut StateField;
}

#[diagnostic::do_not_recommend]
impl<T> SameField<T> for T {
    fn same(&mut self) -> &mut T {
        self
    }
}

/// The correlated state and message fields, as one type: `[state,
/// message]`. The bound is on the message's field, whose type is still
/// unknown when the state's argument is checked: bound on the state's,
/// rustc would infer the message's from the one impl and report
/// "mismatched types" instead of the bound's message.
#[doc(hidden)]
pub fn same_field<'a, State, MessageField: SameField<State>>(
    state: &'a mut State,
    message: &'a mut MessageField,
) -> [&'a mut State; 2] {
    [state, message.same()]
}

/// Decodes a message payload for a handler.
#[doc(hidden)]
pub fn decode_message<T: DeserializeOwned>(message: Value) -> Result<T, ProcessError> {
    // Where and what kind, not the value: the text is a dead letter's reason.
    crate::model::decode::decode(message).map_err(|e| {
        ProcessError::invalid_payload(format!(
            "message does not deserialize as `{}`: {e}",
            std::any::type_name::<T>()
        ))
    })
}

/// How a message for `pm` finds its instance, as the sender can tell:
/// `(key, key_field)` for [`Envelope::key`] and [`Envelope::key_field`].
/// `(None, None)` when it cannot (no handler, a timeout, a payload the
/// handler would not accept): the worker then finds the instance itself.
pub(crate) fn routing_key(
    pm: &dyn ErasedProcess,
    message_type: &str,
    payload: &Value,
) -> (Option<String>, Option<String>) {
    let Some(handler) = pm.definition().handler(message_type) else {
        return (None, None);
    };
    let key = || pm.message_key(message_type, payload).ok().flatten();
    match handler.correlation {
        Correlation::Instance => (None, None),
        Correlation::Id => (key(), None),
        // A shared field has no single owner to load with the message.
        Correlation::Field { state_field, .. } if pm.definition().is_shared(state_field) => {
            (None, None)
        }
        Correlation::Field { state_field, .. } => match key() {
            Some(key) => (Some(key), Some(state_field.to_owned())),
            None => (None, None),
        },
    }
}

/// What a message finds its instance by, once its handler is known: an
/// instance id (`None` field) or a value of a correlated state field.
/// `None` when that is a set of instances (a `#[handles(many)]` message
/// before it is fanned out, or an ambiguous one) or cannot be told.
pub(crate) fn lookup(
    pm: &dyn ErasedProcess,
    envelope: &Envelope,
) -> Option<(String, Option<&'static str>)> {
    let def = pm.definition();
    let handler = def.handler(&envelope.message_type)?;
    let key = || {
        pm.message_key(&envelope.message_type, &envelope.payload)
            .ok()
            .flatten()
    };
    match handler.correlation {
        Correlation::Instance => Some((envelope.instance_id.clone()?, None)),
        Correlation::Id => Some((key()?, None)),
        Correlation::Field { state_field, .. } if def.is_shared(state_field) => {
            match (handler.kind, &envelope.instance_id) {
                (HandlerKind::Handles { many: true, .. }, Some(id)) => Some((id.clone(), None)),
                _ => None,
            }
        }
        Correlation::Field { state_field, .. } => Some((key()?, Some(state_field))),
    }
}

/// The error for a message type the process manager has no handler for.
#[doc(hidden)]
pub fn unknown_message<'a, T: Send + 'a>(
    pm: &str,
    message_type: &str,
) -> BoxFuture<'a, Result<T, ProcessError>> {
    let error = ProcessError::invalid_payload(format!(
        "process manager `{pm}` has no handler for `{message_type}`"
    ));
    Box::pin(async move { Err(error) })
}

/// Marker the macro uses to check the state type, with a message that says
/// what is missing.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "the state type `{Self}` of a process manager must be `Default + Serialize + DeserializeOwned`",
    label = "state type missing `Default`, `Serialize` or `Deserialize`",
    note = "add `#[derive(Default, Serialize, Deserialize)]` to `{Self}`: state is default-constructed for a starting message and persisted as JSON"
)]
pub trait ProcessState: Default + Serialize + DeserializeOwned + Send + Sync + 'static {}

impl<T: Default + Serialize + DeserializeOwned + Send + Sync + 'static> ProcessState for T {}

/// What generated code does with a process manager's state, through one
/// function ([`state_ops`]) whose bound is the one check: a state type
/// missing a derive fails it with the same diagnostic wherever it is used,
/// and rustc shows that once.
#[doc(hidden)]
pub struct StateOps<S> {
    pub fresh: fn() -> S,
    pub encode: fn(&S) -> Result<Value, ProcessError>,
    pub decode: fn(Value) -> Result<S, ProcessError>,
}

#[doc(hidden)]
pub const fn state_ops<S: ProcessState>() -> StateOps<S> {
    StateOps {
        fresh: S::default,
        encode: encode_state::<S>,
        decode: decode_state::<S>,
    }
}

fn encode_state<S: Serialize>(state: &S) -> Result<Value, ProcessError> {
    serde_json::to_value(state)
        .map_err(|e| ProcessError::new(format!("state does not serialize as JSON: {e}")))
}

fn decode_state<S: DeserializeOwned>(state: Value) -> Result<S, ProcessError> {
    crate::model::decode::decode(state).map_err(|e| {
        ProcessError::invalid_payload(format!(
            "stored state does not deserialize as `{}`: {e}",
            std::any::type_name::<S>()
        ))
    })
}

/// The same for a message type ([`message_ops`]).
#[doc(hidden)]
pub struct MessageOps<M> {
    pub type_name: &'static str,
    pub decode: fn(Value) -> Result<M, ProcessError>,
    pub correlation_id: fn(&M) -> Option<String>,
}

#[doc(hidden)]
pub const fn message_ops<M: Message>() -> MessageOps<M> {
    MessageOps {
        type_name: M::TYPE,
        decode: decode_message::<M>,
        correlation_id: <M as Message>::correlation_id,
    }
}

/// A handler's result as the engine stores it: the new state as JSON and
/// its correlation entries.
pub(crate) type Handled = (Value, Vec<(&'static str, String)>);

/// The object-safe face of [`ProcessManager`] the engine stores.
pub(crate) trait ErasedProcess: Send + Sync + 'static {
    fn definition(&self) -> &'static ProcessDefinition;
    fn handle_json<'a>(
        &'a self,
        message_type: &'a str,
        message: Value,
        state: Option<Value>,
        seed: bool,
        ctx: &'a mut ProcessContext,
    ) -> BoxFuture<'a, Result<Handled, ProcessError>>;
    fn message_key(
        &self,
        message_type: &str,
        message: &Value,
    ) -> Result<Option<String>, ProcessError>;
    fn on_error(&self, failure: &Failure) -> ErrorAction;
}

impl<P: ProcessManager> ErasedProcess for P {
    fn definition(&self) -> &'static ProcessDefinition {
        P::definition()
    }

    fn handle_json<'a>(
        &'a self,
        message_type: &'a str,
        message: Value,
        state: Option<Value>,
        seed: bool,
        ctx: &'a mut ProcessContext,
    ) -> BoxFuture<'a, Result<Handled, ProcessError>> {
        Box::pin(async move {
            let mut state: P::State = match state {
                Some(value) => P::decode_state(value)?,
                None => P::new_state(),
            };
            if seed {
                P::seed(message_type, &message, &mut state)?;
            }
            self.handle(message_type, message, &mut state, ctx).await?;
            let keys = P::state_keys(&state);
            Ok((P::encode_state(&state)?, keys))
        })
    }

    fn message_key(
        &self,
        message_type: &str,
        message: &Value,
    ) -> Result<Option<String>, ProcessError> {
        P::message_key(message_type, message)
    }

    fn on_error(&self, failure: &Failure) -> ErrorAction {
        ProcessManager::on_error(self, failure)
    }
}
