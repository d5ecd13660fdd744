//! `#[retry_policy(max_retries = 3)]` alone: the documented defaults
//! (exponential backoff from 1 s) fill in the rest.
use saga_runtime::__private::{BackoffKind, RetryPolicy};
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request;

pub struct CreateZip;

#[saga]
impl CreateZip {
    #[saga_step(1)]
    #[retry_policy(max_retries = 3)]
    async fn upload(&self, req: Request) -> Result<Request, StepError> {
        Ok(req)
    }

    #[compensate(upload)]
    async fn undo(&self, _req: Request) -> Result<(), StepError> {
        Ok(())
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 2, base_delay_ms = 50)]
    #[compensation_retry_policy(max_retries = 1, backoff = constant)]
    async fn pay(&self, req: Request) -> Result<Request, StepError> {
        Ok(req)
    }

    #[compensate(pay)]
    async fn refund(&self, _req: Request) -> Result<(), StepError> {
        Ok(())
    }
}

fn main() {
    let steps = CreateZip::definition().steps;
    assert_eq!(
        steps[0].retry,
        RetryPolicy::new(3, BackoffKind::Exponential, 1000)
    );
    assert_eq!(steps[1].retry, RetryPolicy::new(2, BackoffKind::Exponential, 50));
    let refund = steps[1].compensation.as_ref().unwrap();
    assert_eq!(refund.retry, RetryPolicy::new(1, BackoffKind::Constant, 1000));
}
