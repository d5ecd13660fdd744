//! `scope` and `when_open` reach the step's definition.
use saga_runtime::__private::{BreakerScope, CircuitBreakerConfig, WhenOpen};
use saga_runtime::prelude::*;

pub struct Notify;

#[saga]
impl Notify {
    #[saga_step(1)]
    #[circuit_breaker(failure_threshold = 5, duration_secs = 30, scope = shared, when_open = wait)]
    async fn send(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[saga_step(2)]
    #[circuit_breaker(failure_threshold = 2, duration_secs = 5)]
    async fn log(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

fn main() {
    let steps = Notify::definition().steps;
    assert_eq!(
        steps[0].circuit_breaker,
        Some(
            CircuitBreakerConfig::new(5, 30)
                .with_scope(BreakerScope::Shared)
                .with_when_open(WhenOpen::Wait)
        )
    );
    let defaults = steps[1].circuit_breaker.unwrap();
    assert_eq!(
        (defaults.scope, defaults.when_open),
        (BreakerScope::Process, WhenOpen::Fail)
    );
}
