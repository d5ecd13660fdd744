//! `crate = path` naming a module that re-exports the prelude: one error, on the path, saying it must name the crate.
mod platform {
    pub use saga_runtime::prelude::*;
}
use platform::*;
pub struct Greet;
#[saga(crate = platform)]
impl Greet {
    #[saga_step(1)]
    async fn shout(&self, name: String) -> Result<String, StepError> {
        Ok(name.to_uppercase())
    }
}
fn main() {
    let _ = Engine::builder().saga(Greet);
}
