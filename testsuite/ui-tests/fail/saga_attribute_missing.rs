//! A saga type whose impl lacks `#[saga]`: where it is registered, the
//! error says what to add.
use saga_runtime::prelude::*;

pub struct CreateZip;

impl CreateZip {
    pub async fn upload(&self, req: String) -> Result<String, StepError> {
        Ok(req)
    }
}

fn main() {
    let _ = Engine::builder().saga(CreateZip);
}
