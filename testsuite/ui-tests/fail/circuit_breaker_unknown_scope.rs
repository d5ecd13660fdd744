//! A breaker scope that does not exist.
use saga_runtime::prelude::*;

pub struct Notify;

#[saga]
impl Notify {
    #[saga_step(1)]
    #[circuit_breaker(failure_threshold = 5, duration_secs = 30, scope = shraed)]
    async fn send(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

fn main() {}
