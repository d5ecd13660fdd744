//! Positional values in an attribute: one error for all of them, not one per value.
use saga_runtime::prelude::*;
pub struct Greet;
#[saga]
impl Greet {
    #[saga_step(1)]
    #[retry_policy(5, exponential, 200)]
    async fn shout(&self, name: String) -> Result<String, StepError> {
        Ok(name.to_uppercase())
    }
}
fn main() {}
