//! The engine driven by a hand-written `Saga` impl: pins the contract between
//! the generated code and the runtime without going through the macro.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use saga_runtime::__private::*;
use saga_runtime::{Engine, StepStatus, TaskStatus};

#[derive(Default)]
struct Counting {
    calls: [AtomicU32; 3],
    compensations: [AtomicU32; 3],
    fail_step: Option<u32>,
}

#[derive(Clone)]
struct Handle(Arc<Counting>);

impl Saga for Handle {
    type Input = u32;
    type Output = u32;
    const NAME: &'static str = "counting";
    fn encode_input(input: &u32) -> Result<Value, StepError> {
        Ok(Value::from(*input))
    }
    fn decode_output(output: Value) -> Result<u32, StepError> {
        decode(output)
    }
    fn definition() -> &'static SagaDefinition {
        static DEF: SagaDefinition = SagaDefinition {
            name: "counting",
            version: 1,
            fingerprint: 0x0123_4567_89ab_cdef,
            type_name: "Counting",
            cancellable: false,
            steps: &[
                StepDefinition {
                    name: "one",
                    order: 1,
                    retry: RetryPolicy::new(2, BackoffKind::Constant, 10),
                    compensation: Some(CompensationDefinition {
                        name: "undo_one",
                        retry: RetryPolicy::NO_RETRY,
                        handles_unknown: false,
                    }),
                    circuit_breaker: None,
                    timeout: None,
                    input_type: "u32",
                    limits: &[],
                    output_type: "u32",
                },
                StepDefinition {
                    name: "two",
                    order: 2,
                    retry: RetryPolicy::new(2, BackoffKind::Constant, 10),
                    compensation: Some(CompensationDefinition {
                        name: "undo_two",
                        retry: RetryPolicy::NO_RETRY,
                        handles_unknown: false,
                    }),
                    circuit_breaker: None,
                    timeout: None,
                    input_type: "u32",
                    limits: &[],
                    output_type: "u32",
                },
                StepDefinition {
                    name: "three",
                    order: 3,
                    retry: RetryPolicy::new(1, BackoffKind::Constant, 10),
                    compensation: None,
                    circuit_breaker: None,
                    timeout: None,
                    input_type: "u32",
                    limits: &[],
                    output_type: "u32",
                },
            ],
        };
        &DEF
    }
    fn execute_step<'a>(
        &'a self,
        order: u32,
        input: Value,
        _ctx: &'a StepContext,
    ) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move {
            let n: u32 = decode(input)?;
            self.0.calls[order as usize - 1].fetch_add(1, Ordering::SeqCst);
            if self.0.fail_step == Some(order) {
                return Err(StepError::transient("boom"));
            }
            encode(Ok(n + 1))
        })
    }
    fn compensate_step<'a>(
        &'a self,
        order: u32,
        _output: Value,
        _ctx: &'a StepContext,
    ) -> BoxFuture<'a, Result<(), StepError>> {
        Box::pin(async move {
            self.0.compensations[order as usize - 1].fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn three_steps_complete_and_chain_outputs() {
    let saga = Arc::new(Counting::default());
    let engine = Engine::builder()
        .saga(Handle(saga.clone()))
        .build()
        .await
        .unwrap();
    let id = engine.start::<Handle>(10).await.unwrap();
    let task = engine.wait(id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.output_as::<u32>().unwrap().unwrap(), 13);
    let calls: Vec<u32> = saga
        .calls
        .iter()
        .map(|c| c.load(Ordering::SeqCst))
        .collect();
    assert_eq!(calls, [1, 1, 1]);
}

#[tokio::test(start_paused = true)]
async fn failure_at_step_three_compensates_two_then_one() {
    let saga = Arc::new(Counting {
        fail_step: Some(3),
        ..Default::default()
    });
    let engine = Engine::builder()
        .saga(Handle(saga.clone()))
        .build()
        .await
        .unwrap();
    let id = engine.start::<Handle>(1).await.unwrap();
    let task = engine.wait(id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Compensated);
    assert_eq!(
        saga.calls[2].load(Ordering::SeqCst),
        2,
        "max_retries = 1 means two calls"
    );
    assert_eq!(task.steps_with(StepStatus::Compensated), ["one", "two"]);
    assert_eq!(task.steps[2].attempt_count, 2);
    let compensated: Vec<_> = task
        .audit_log
        .iter()
        .filter(|e| e.action == saga_runtime::AuditAction::StepCompensated)
        .map(|e| e.step.clone().unwrap())
        .collect();
    assert_eq!(compensated, ["two", "one"]);
}
