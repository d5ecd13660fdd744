//! `#[saga]` on a trait impl whose steps are used elsewhere: one error, on
//! the trait, and none where the saga is started or registered.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request;

pub trait Steps {
    async fn upload(&self, req: Request) -> Result<Request, StepError>;
}

pub struct CreateZip;

#[saga]
impl Steps for CreateZip {
    #[saga_step(1)]
    async fn upload(&self, req: Request) -> Result<Request, StepError> {
        Ok(req)
    }
}

async fn start(engine: &Engine) {
    let _ = engine.start::<CreateZip>(Request).await;
    let _ = Engine::builder().saga(CreateZip);
}

fn main() {
    let _ = start;
}
