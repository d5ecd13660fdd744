//! A saga registered with `.process_manager(..)`: the error says to register it with `.saga(..)`.
use saga_runtime::prelude::*;
pub struct Greet;
#[saga]
impl Greet {
    #[saga_step(1)]
    async fn shout(&self, name: String) -> Result<String, StepError> {
        Ok(name.to_uppercase())
    }
}
fn main() {
    let _ = Engine::builder().process_manager(Greet);
}
