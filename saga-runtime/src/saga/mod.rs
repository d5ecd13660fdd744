//! What `#[saga]` generates: a static [`SagaDefinition`] and an implementation
//! of [`Saga`] that runs a step by number on JSON values.
//!
//! The engine never sees the user's types: each step's input and output cross
//! the boundary as `serde_json::Value`, because they are persisted between
//! steps anyway. Type safety comes from the macro, which checks at compile time
//! that step N's input is step N-1's output.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::circuit::CircuitBreakerConfig;
use crate::context::StepContext;
use crate::error::StepError;
use crate::policy::RetryPolicy;

pub(crate) mod admission;
mod outcome;
mod registry;
pub(crate) mod state_machine;

pub use outcome::Outcome;
pub(crate) use outcome::{completed_json, unknown_json};
#[doc(hidden)]
pub use outcome::{CompletedIsOutputOf, IsOutcome, UnknownIsInputOf};

pub(crate) use registry::SagaRegistry;

pub use crate::util::BoxFuture;

/// The static shape of a saga, produced by `#[saga]`.
#[derive(Debug)]
pub struct SagaDefinition {
    /// The saga's name (`#[saga(name = "..")]`, default: kebab-case of the type).
    pub name: &'static str,
    /// `#[saga(version = N)]` (default 1). Each task runs to its end on the
    /// version it started with; several versions of one saga can be
    /// registered side by side while old tasks drain.
    pub version: u32,
    /// A hash of the steps' numbers, names and types as written, computed
    /// at compile time. A task records it, and a worker whose definition of
    /// that version has another fingerprint (the steps changed without a
    /// version bump) does not run the task.
    pub fingerprint: u64,
    /// The Rust type the saga is declared on.
    pub type_name: &'static str,
    /// Whether `#[cancellable]` is present.
    pub cancellable: bool,
    /// The steps, in order (`steps[i].order == i + 1`).
    pub steps: &'static [StepDefinition],
}

impl SagaDefinition {
    /// [`fingerprint`](Self::fingerprint) as tasks record it: 16 hex digits
    /// (a JSON number would lose bits in JavaScript readers).
    pub fn fingerprint_hex(&self) -> String {
        format!("{:016x}", self.fingerprint)
    }

    /// The step numbered `order`.
    pub fn step(&self, order: u32) -> Option<&'static StepDefinition> {
        self.steps.get(order.checked_sub(1)? as usize)
    }
}

/// One `#[saga_step(n)]` method.
#[derive(Debug)]
pub struct StepDefinition {
    /// The method's name.
    pub name: &'static str,
    /// `n` in `#[saga_step(n)]`.
    pub order: u32,
    /// `#[retry_policy]`, or [`RetryPolicy::NO_RETRY`].
    pub retry: RetryPolicy,
    /// The `#[compensate(..)]` method, if any.
    pub compensation: Option<CompensationDefinition>,
    /// `#[circuit_breaker]`, if any.
    pub circuit_breaker: Option<CircuitBreakerConfig>,
    /// `#[saga_step(n, timeout_ms = ..)]`: how long one attempt may run before it is cancelled and counted as a transient failure; `None` uses the engine's default.
    pub timeout: Option<std::time::Duration>,
    /// The input type as written, for messages.
    pub input_type: &'static str,
    /// The output type as written, for messages.
    pub output_type: &'static str,
    /// `#[limit(..)]`s, in the order written: flow control shared by the
    /// deployment (see [`crate::limit`](mod@crate::limit)).
    pub limits: &'static [crate::limit::LimitSpec],
}

/// The compensation of one step.
#[derive(Debug)]
pub struct CompensationDefinition {
    /// The compensation method's name.
    pub name: &'static str,
    /// `#[compensation_retry_policy]`, or else the step's own policy.
    pub retry: RetryPolicy,
    /// Whether it takes [`Outcome`]: it is then also called for a step
    /// whose attempt began and whose outcome was lost
    /// ([`StepRecord::lost_outcomes`](crate::StepRecord::lost_outcomes)),
    /// with `{"Unknown": input}`, and with `{"Completed": output}` for a
    /// completed one; otherwise with the output alone, for completed steps
    /// only.
    pub handles_unknown: bool,
}

/// A saga: implemented by `#[saga]`, not by hand.
///
/// Register it with [`EngineBuilder::saga`](crate::engine::EngineBuilder::saga),
/// then start tasks with [`Engine::start`](crate::engine::Engine::start).
///
/// `Input` and `Output` are `Serialize + Deserialize` (the macro checks it,
/// with an error that names the step); the trait does not repeat that
/// bound so that a type missing a derive gives that one error and not a
/// second one here. Generic code converts them with
/// [`encode_input`](Self::encode_input) and
/// [`decode_output`](Self::decode_output).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a saga",
    label = "not a saga",
    note = "a saga is a type whose `impl` block of steps has `#[saga]`: add it there",
    note = "if `{Self}` is a `#[process_manager]`, register it with `.process_manager(..)` instead of `.saga(..)`: a process manager is started by its `#[starts]` message, not by `engine.start`"
)]
pub trait Saga: Send + Sync + 'static {
    /// Step 1's input.
    type Input: Send + Sync + 'static;
    /// The last step's output.
    type Output: Send + Sync + 'static;
    /// The saga's name.
    const NAME: &'static str;

    /// The input as it is stored with the task.
    fn encode_input(input: &Self::Input) -> Result<Value, StepError>
    where
        Self: Sized;

    /// An input given as JSON (a request to the HTTP API), typed: checks
    /// it before a task is created from it. `#[saga]` generates it; a
    /// hand-written saga without it cannot be started by name.
    fn decode_input(input: Value) -> Result<Self::Input, StepError>
    where
        Self: Sized,
    {
        let _ = input;
        Err(StepError::permanent(format!(
            "saga `{}` does not decode its input from JSON",
            Self::NAME
        )))
    }

    /// A completed task's recorded output, typed.
    fn decode_output(output: Value) -> Result<Self::Output, StepError>
    where
        Self: Sized;

    /// The saga's static shape.
    fn definition() -> &'static SagaDefinition
    where
        Self: Sized;

    /// Runs step `order` on its JSON input, returning its JSON output.
    fn execute_step<'a>(
        &'a self,
        order: u32,
        input: Value,
        ctx: &'a StepContext,
    ) -> BoxFuture<'a, Result<Value, StepError>>;

    /// Runs the compensation of step `order` on the step's JSON output
    /// (for a compensation that [handles unknown
    /// outcomes](CompensationDefinition::handles_unknown), the JSON of an
    /// [`Outcome`]).
    fn compensate_step<'a>(
        &'a self,
        order: u32,
        output: Value,
        ctx: &'a StepContext,
    ) -> BoxFuture<'a, Result<(), StepError>>;
}

/// Marks a saga declared `#[cancellable]`; required by
/// [`Engine::cancel`](crate::engine::Engine::cancel).
///
/// The message can't tell a saga from a process manager (a diagnostic
/// can't ask what else `{Self}` implements), and `engine.cancel::<P>` is
/// the same mistake for both; so it says what each needs: a saga, the
/// attribute; a process manager, which has no tasks to cancel, how its
/// instances end.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a cancellable saga: `engine.cancel` takes a saga declared `#[cancellable]`",
    label = "not a `#[cancellable]` saga",
    note = "if `{Self}` is a saga, add `#[cancellable]` next to `#[saga]` on `impl {Self}` to allow `engine.cancel::<{Self}>(..)`",
    note = "if `{Self}` is a `#[process_manager]`, its instances are not tasks and are not cancelled: an instance ends when one of its handlers calls `ctx.mark_complete()` (later messages are ignored) or `ctx.stop()` (its state is deleted), or when `#[on_error]` answers `ErrorAction::Stop`; to end one from outside, `engine.publish(..)` a message it handles whose handler does so"
)]
pub trait Cancellable: Saga {}

/// The object-safe face of [`Saga`] that the engine stores.
pub(crate) trait ErasedSaga: Send + Sync + 'static {
    fn definition(&self) -> &'static SagaDefinition;
    /// `input` as the saga stores it, if it decodes as its input type.
    fn check_input(&self, input: Value) -> Result<Value, StepError>;
    fn execute_step<'a>(
        &'a self,
        order: u32,
        input: Value,
        ctx: &'a StepContext,
    ) -> BoxFuture<'a, Result<Value, StepError>>;
    fn compensate_step<'a>(
        &'a self,
        order: u32,
        output: Value,
        ctx: &'a StepContext,
    ) -> BoxFuture<'a, Result<(), StepError>>;
}

impl<S: Saga> ErasedSaga for S {
    fn definition(&self) -> &'static SagaDefinition {
        S::definition()
    }
    fn check_input(&self, input: Value) -> Result<Value, StepError> {
        S::encode_input(&S::decode_input(input)?)
    }
    fn execute_step<'a>(
        &'a self,
        order: u32,
        input: Value,
        ctx: &'a StepContext,
    ) -> BoxFuture<'a, Result<Value, StepError>> {
        Saga::execute_step(self, order, input, ctx)
    }
    fn compensate_step<'a>(
        &'a self,
        order: u32,
        output: Value,
        ctx: &'a StepContext,
    ) -> BoxFuture<'a, Result<(), StepError>> {
        Saga::compensate_step(self, order, output, ctx)
    }
}

/// How generated code stores a step type whose impl is known at expansion
/// (no generic parameters): `(&Codec::<T>::NEW).encode(..)` picks
/// [`Persist`] when `T` is `Serialize + Deserialize` and otherwise
/// [`NotPersistable`] (method lookup prefers the impl that needs no
/// auto-reference). The second never runs: a type without the derives
/// fails the generated check that names its step, and this keeps that the
/// only error instead of adding one per place the type is stored.
#[doc(hidden)]
pub struct Codec<T>(std::marker::PhantomData<fn() -> T>);

impl<T> Codec<T> {
    #[doc(hidden)]
    pub const NEW: Self = Codec(std::marker::PhantomData);
}

/// See [`Codec`].
#[doc(hidden)]
pub trait Persist<T> {
    fn encode(&self, value: &T) -> Result<Value, StepError>;
    fn decode(&self, value: Value) -> Result<T, StepError>;
}

impl<T: Serialize + DeserializeOwned> Persist<T> for Codec<T> {
    fn encode(&self, value: &T) -> Result<Value, StepError> {
        encode(Ok(value))
    }
    fn decode(&self, value: Value) -> Result<T, StepError> {
        decode(value)
    }
}

/// See [`Codec`].
#[doc(hidden)]
pub trait NotPersistable<T> {
    fn encode(&self, value: &T) -> Result<Value, StepError>;
    fn decode(&self, value: Value) -> Result<T, StepError>;
}

impl<T> NotPersistable<T> for &Codec<T> {
    fn encode(&self, _: &T) -> Result<Value, StepError> {
        Err(not_persistable::<T>())
    }
    fn decode(&self, _: Value) -> Result<T, StepError> {
        Err(not_persistable::<T>())
    }
}

fn not_persistable<T>() -> StepError {
    StepError::permanent(format!(
        "`{}` is not `Serialize + Deserialize`",
        std::any::type_name::<T>()
    ))
}

/// The saga's input type must be stored: checked by a generated `where`
/// clause spanned on the type, so the error lands where the type is written.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "the saga's input `{Self}` is stored with each task as JSON, so it must implement `Serialize` and `Deserialize`",
    label = "stored as JSON",
    note = "add `#[derive(Serialize, Deserialize)]` to `{Self}` (the type's fields need them too); a type from another crate goes in a type of yours that derives them, or enable that crate's `serde` feature"
)]
pub trait SagaInput {}

#[diagnostic::do_not_recommend]
impl<T: Serialize + DeserializeOwned> SagaInput for T {}

/// A step's output must be stored between steps (see [`SagaInput`]).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "step {STEP} returns `{Self}`, which is stored as JSON between steps, so it must implement `Serialize` and `Deserialize`",
    label = "stored as JSON",
    note = "add `#[derive(Serialize, Deserialize)]` to `{Self}` (the type's fields need them too); a type from another crate goes in a type of yours that derives them, or enable that crate's `serde` feature"
)]
pub trait StepOutput<const STEP: u32> {}

#[diagnostic::do_not_recommend]
impl<const STEP: u32, T: Serialize + DeserializeOwned> StepOutput<STEP> for T {}

/// Step `STEP` takes what step `PREV` returns: the compiler judges the
/// equality, so aliases and paths to the same type pass.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "step {STEP} takes `{Self}`, but step {PREV} returns `{Prev}`: a step's input must be the previous step's output",
    label = "expected `{Prev}`",
    note = "change this parameter to `{Prev}`, or step {PREV}'s return type to `Result<{Self}, StepError>`"
)]
pub trait TakesOutputOf<const STEP: u32, const PREV: u32, Prev> {}

#[diagnostic::do_not_recommend]
impl<const STEP: u32, const PREV: u32, T> TakesOutputOf<STEP, PREV, T> for T {}

/// A compensation takes the output of the step it undoes.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "this compensation of step {STEP} takes `{Self}`, but step {STEP} returns `{Output}`: a compensation receives the output of the step it undoes",
    label = "expected `{Output}`",
    note = "change this parameter to `{Output}`"
)]
pub trait UndoesOutputOf<const STEP: u32, Output> {}

#[diagnostic::do_not_recommend]
impl<const STEP: u32, T> UndoesOutputOf<STEP, T> for T {}

/// Deserializes a persisted value into a step's parameter type. The
/// error names the place and kind of the mismatch, not the value: it
/// becomes the task's `error`, a dead letter's reason, a 422 body.
#[doc(hidden)]
pub fn decode<T: DeserializeOwned>(value: Value) -> Result<T, StepError> {
    crate::model::decode::decode(value).map_err(|e| {
        StepError::invalid_payload(format!(
            "payload does not deserialize as `{}`: {e}",
            std::any::type_name::<T>()
        ))
    })
}

/// Serializes a step's output for persistence.
#[doc(hidden)]
pub fn encode<T: Serialize>(result: Result<T, StepError>) -> Result<Value, StepError> {
    let value = result?;
    serde_json::to_value(value).map_err(|e| {
        StepError::permanent(format!(
            "output does not serialize as JSON (`{}`): {e}",
            std::any::type_name::<T>()
        ))
    })
}

/// The error for a step number the saga does not have.
#[doc(hidden)]
pub fn unknown_step<'a, T: Send + 'a>(
    saga: &str,
    order: u32,
) -> BoxFuture<'a, Result<T, StepError>> {
    let error = StepError::invalid_payload(format!("saga `{saga}` has no step {order}"));
    Box::pin(async move { Err(error) })
}
