//! `#[cancellable]` above `#[saga]`, a default name, steps without a context,
//! and `#[saga]` written with its full path.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: u64,
}

#[derive(Serialize, Deserialize)]
pub struct Reserved {
    pub id: u64,
}

pub struct ReserveSeats;

#[cancellable]
#[saga_runtime::saga]
impl ReserveSeats {
    #[saga_step(1)]
    async fn reserve(&self, order: Order) -> Result<Reserved, StepError> {
        Ok(Reserved { id: order.id })
    }

    #[saga_runtime::compensate(reserve)]
    async fn release(&self, reserved: Reserved) -> Result<(), StepError> {
        let _ = reserved.id;
        Ok(())
    }

    #[saga_step(2)]
    async fn confirm(&self, reserved: Reserved) -> Result<u64, StepError> {
        Ok(reserved.id)
    }
}

fn assert_cancellable<S: Cancellable>() {}

fn main() {
    assert_cancellable::<ReserveSeats>();
    assert_eq!(<ReserveSeats as Saga>::NAME, "reserve-seats");
    let def = <ReserveSeats as Saga>::definition();
    assert!(def.cancellable);
    assert_eq!(
        def.steps[0].retry,
        saga_runtime::policy::RetryPolicy::NO_RETRY
    );
    // Without a compensation policy, the compensation retries like its step.
    assert_eq!(
        def.steps[0].compensation.as_ref().map(|c| c.retry),
        Some(def.steps[0].retry)
    );
}
