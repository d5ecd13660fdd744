//! A compensation opts into unknown outcomes by taking
//! `Outcome<Output, Input>`: by the prelude's name or by path, with the
//! types written as aliases or paths, beside compensations that take the
//! step's output; a type of one's own named `Outcome` without type
//! arguments is a step type like any other.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request;

pub mod model {
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct Uploaded;
    /// A step type of the user's own that happens to be named `Outcome`.
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct Outcome;
}
use model::Uploaded;

type Up = Uploaded;

pub struct CreateZip;

#[saga]
impl CreateZip {
    #[saga_step(1)]
    async fn upload(&self, _req: Request) -> Result<Uploaded, StepError> {
        Ok(Uploaded)
    }

    #[compensate(upload)]
    async fn delete_upload(&self, out: Outcome<Up, crate::Request>, ctx: &StepContext) -> Result<(), StepError> {
        match out {
            Outcome::Completed(_uploaded) => Ok(()),
            Outcome::Unknown(_request) => {
                let _ = ctx.step_idempotency_key();
                Ok(())
            }
        }
    }

    #[saga_step(2)]
    async fn pay(&self, _uploaded: Up) -> Result<model::Outcome, StepError> {
        Ok(model::Outcome)
    }

    #[compensate(pay)]
    async fn refund(&self, _paid: model::Outcome) -> Result<(), StepError> {
        Ok(())
    }

    #[saga_step(3)]
    async fn notify(&self, paid: model::Outcome) -> Result<model::Outcome, StepError> {
        Ok(paid)
    }

    #[compensate(notify)]
    async fn retract(
        &self,
        _out: saga_runtime::Outcome<model::Outcome, model::Outcome>,
    ) -> Result<(), StepError> {
        Ok(())
    }
}

fn main() {
    let steps = CreateZip::definition().steps;
    let handles = |i: usize| steps[i].compensation.as_ref().map(|c| c.handles_unknown);
    assert_eq!(handles(0), Some(true));
    assert_eq!(handles(1), Some(false));
    assert_eq!(handles(2), Some(true));
}
