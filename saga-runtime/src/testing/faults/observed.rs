//! The user's saga, wrapped: the engine runs it as it would the saga
//! itself (same name, definition and codecs), and the wrapper counts each
//! body's runs, requests the seeded cancellations, and fails compensations
//! where the seed says so. Counting here rather than in the worker keeps
//! the kit off the engine's hot path entirely.

use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::journal::{Journal, Phase};
use super::report::{CancelPoint, Fault};
use crate::context::StepContext;
use crate::engine::Engine;
use crate::error::StepError;
use crate::saga::{BoxFuture, Saga, SagaDefinition};
use crate::util::Unpoisoned;

/// Where the wrapper finds the engine it runs in (to cancel a task from
/// inside a step); emptied at the end of a run, which breaks the cycle
/// engine -> saga -> engine.
pub(super) type EngineSlot = Arc<Mutex<Option<Engine>>>;

pub(super) struct Observed<S> {
    pub(super) saga: S,
    pub(super) journal: Arc<Journal>,
    pub(super) engine: EngineSlot,
}

impl<S: Saga> Observed<S> {
    async fn cancel(&self, ctx: &StepContext, index: usize, at: CancelPoint) {
        let engine = self.engine.locked().clone();
        if let Some(engine) = engine {
            let cancelled = engine.cancel_by_id(ctx.task_id()).await;
            if matches!(cancelled, Ok(crate::engine::CancelResult::Cancelled)) {
                self.journal.fault(index, Fault::Cancelled { at });
            }
        }
    }

    fn name(def: &SagaDefinition, order: u32, phase: Phase) -> &'static str {
        let Some(step) = def.step(order) else {
            return "?";
        };
        match (phase, &step.compensation) {
            (Phase::Compensation, Some(c)) => c.name,
            _ => step.name,
        }
    }
}

impl<S: Saga> Saga for Observed<S> {
    type Input = S::Input;
    type Output = S::Output;
    const NAME: &'static str = S::NAME;

    fn encode_input(input: &Self::Input) -> Result<Value, StepError> {
        S::encode_input(input)
    }

    fn decode_input(input: Value) -> Result<Self::Input, StepError> {
        S::decode_input(input)
    }

    fn decode_output(output: Value) -> Result<Self::Output, StepError> {
        S::decode_output(output)
    }

    fn definition() -> &'static SagaDefinition {
        S::definition()
    }

    fn execute_step<'a>(
        &'a self,
        order: u32,
        input: Value,
        ctx: &'a StepContext,
    ) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move {
            let name = Self::name(S::definition(), order, Phase::Step);
            let begun = self.journal.begin(ctx.task_id(), Phase::Step, order, name);
            let Some(index) = begun.index else {
                return self.saga.execute_step(order, input, ctx).await;
            };
            if begun.cancel_before {
                self.cancel(ctx, index, CancelPoint::BeforeStep(name.to_owned()))
                    .await;
            }
            let result = self.saga.execute_step(order, input, ctx).await;
            self.journal.end(index, name, begun.run, result.is_ok());
            if begun.cancel_after {
                self.cancel(ctx, index, CancelPoint::AfterStep(name.to_owned()))
                    .await;
            }
            result
        })
    }

    fn compensate_step<'a>(
        &'a self,
        order: u32,
        output: Value,
        ctx: &'a StepContext,
    ) -> BoxFuture<'a, Result<(), StepError>> {
        Box::pin(async move {
            let name = Self::name(S::definition(), order, Phase::Compensation);
            let index = self.journal.index(ctx.task_id());
            let Some(index) = index else {
                return self.saga.compensate_step(order, output, ctx).await;
            };
            // The run number this one would be, to decide before it runs.
            let next_run = {
                let state = self.journal.state();
                state.tasks[index].runs.get(name).copied().unwrap_or(0) + 1
            };
            let injected = StepError::transient("fault kit: injected compensation failure");
            let fail = self.journal.fail_compensation(index, name, next_run);
            if fail == Some(false) {
                // Failed before its body ran: nothing happened, nothing counted.
                return Err(injected);
            }
            let begun = self
                .journal
                .begin(ctx.task_id(), Phase::Compensation, order, name);
            let result = self.saga.compensate_step(order, output, ctx).await;
            // Ran, then failed: its effect happened and it runs again.
            let result = match result {
                Ok(()) if fail == Some(true) => Err(injected),
                other => other,
            };
            self.journal.end(index, name, begun.run, result.is_ok());
            result
        })
    }
}
