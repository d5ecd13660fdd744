//! `crate = ..` that is not a path.
use saga_runtime::prelude::*;

pub struct Greet;

#[saga(crate = 5)]
impl Greet {
    #[saga_step(1)]
    async fn shout(&self, name: String) -> Result<String, StepError> {
        Ok(name)
    }
}

fn main() {}
