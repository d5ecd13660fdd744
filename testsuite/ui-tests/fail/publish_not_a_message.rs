//! Publishing a type that is not a message: one error, saying what to derive.
use saga_runtime::prelude::*;
use serde::Serialize;

#[derive(Serialize)]
pub struct Plain;

async fn publish(engine: &Engine) -> Result<(), saga_runtime::Error> {
    engine.publish(Plain).await?;
    Ok(())
}

fn main() {
    let _ = publish;
}
