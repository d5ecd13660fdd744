//! A circuit-breaker key written on `#[saga_step]`: the error names `#[circuit_breaker(..)]`.
use saga_runtime::prelude::*;
pub struct Greet;
#[saga]
impl Greet {
    #[saga_step(1, when_open = fail)]
    async fn shout(&self, name: String) -> Result<String, StepError> {
        Ok(name.to_uppercase())
    }
}
fn main() {}
