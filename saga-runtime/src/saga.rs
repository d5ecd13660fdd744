//! What `#[saga]` generates: a static [`SagaDefinition`] and an implementation
//! of [`Saga`] that runs a step by number on JSON values.
//!
//! The engine never sees the user's types: each step's input and output cross
//! the boundary as `serde_json::Value`, because they are persisted between
//! steps anyway. Type safety comes from the macro, which checks at compile time
//! that step N's input is step N-1's output.

use std::future::Future;
use std::pin::Pin;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::circuit::CircuitBreakerConfig;
use crate::context::StepContext;
use crate::error::StepError;
use crate::policy::RetryPolicy;

pub(crate) mod state_machine;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The static shape of a saga, produced by `#[saga]`.
#[derive(Debug)]
pub struct SagaDefinition {
    /// The saga's name (`#[saga(name = "..")]`, default: kebab-case of the type).
    pub name: &'static str,
    /// The Rust type the saga is declared on.
    pub type_name: &'static str,
    /// Whether `#[cancellable]` is present.
    pub cancellable: bool,
    /// The steps, in order (`steps[i].order == i + 1`).
    pub steps: &'static [StepDefinition],
}

impl SagaDefinition {
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
}

/// The compensation of one step.
#[derive(Debug)]
pub struct CompensationDefinition {
    /// The compensation method's name.
    pub name: &'static str,
    /// `#[compensation_retry_policy]`, or else the step's own policy.
    pub retry: RetryPolicy,
}

/// A saga: implemented by `#[saga]`, not by hand.
///
/// Register it with [`EngineBuilder::saga`](crate::engine::EngineBuilder::saga),
/// then start tasks with [`Engine::start`](crate::engine::Engine::start).
pub trait Saga: Send + Sync + 'static {
    /// Step 1's input.
    type Input: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// The last step's output.
    type Output: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// The saga's name.
    const NAME: &'static str;

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

    /// Runs the compensation of step `order` on the step's JSON output.
    fn compensate_step<'a>(
        &'a self,
        order: u32,
        output: Value,
        ctx: &'a StepContext,
    ) -> BoxFuture<'a, Result<(), StepError>>;
}

/// Marks a saga declared `#[cancellable]`; required by
/// [`Engine::cancel`](crate::engine::Engine::cancel).
#[diagnostic::on_unimplemented(
    message = "the saga `{Self}` is not cancellable",
    label = "`{Self}` is not declared `#[cancellable]`",
    note = "add `#[cancellable]` next to `#[saga]` on `impl {Self}` to allow `engine.cancel::<{Self}>(..)`"
)]
pub trait Cancellable: Saga {}

/// The object-safe face of [`Saga`] that the engine stores.
pub(crate) trait ErasedSaga: Send + Sync + 'static {
    fn definition(&self) -> &'static SagaDefinition;
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

/// Deserializes a persisted value into a step's parameter type.
#[doc(hidden)]
pub fn decode<T: DeserializeOwned>(value: Value) -> Result<T, StepError> {
    serde_json::from_value(value).map_err(|e| {
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
