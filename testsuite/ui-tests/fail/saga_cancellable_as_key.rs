//! `#[saga(cancellable)]`: one error saying `#[cancellable]` is an attribute of its own, and no knock-on at `engine.cancel::<S>`.
use saga_runtime::prelude::*;
pub struct Greet;
#[saga(cancellable)]
impl Greet {
    #[saga_step(1)]
    async fn shout(&self, name: String) -> Result<String, StepError> {
        Ok(name.to_uppercase())
    }
}
async fn cancel(engine: Engine, id: TaskId) {
    let _ = engine.cancel::<Greet>(id).await;
}
fn main() {}
