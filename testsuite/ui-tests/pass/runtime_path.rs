//! `crate = path`: a crate that re-exports the runtime under another name
//! points the generated code there (here a module stands in for it).
use serde::{Deserialize, Serialize};

mod platform {
    pub use saga_runtime as workflows;
}

use platform::workflows::prelude::*;

#[derive(Message, Serialize, Deserialize)]
#[message(crate = platform::workflows)]
pub struct Opened {
    #[correlation_id]
    pub id: String,
}

#[derive(Default, Serialize, Deserialize)]
pub struct Ticket {
    pub opened: bool,
}

pub struct Tickets;

#[process_manager(state = Ticket, crate = platform::workflows)]
impl Tickets {
    #[starts]
    async fn opened(
        &self,
        _msg: Opened,
        state: &mut Ticket,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.opened = true;
        Ok(())
    }
}

pub struct Greet;

#[saga(crate = "platform::workflows")]
impl Greet {
    #[saga_step(1)]
    #[retry_policy(max_retries = 2)]
    async fn shout(&self, name: String) -> Result<String, StepError> {
        Ok(name.to_uppercase())
    }
}

fn main() {
    let _ = Engine::builder().saga(Greet).process_manager(Tickets);
}
