//! `#[handles(hold = "..", then = ..)]`: how long a message that finds no
//! instance waits for it, and what happens after.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct Opened {
    #[correlation_id]
    pub id: String,
}

#[derive(Message, Serialize, Deserialize)]
pub struct Paid {
    #[correlation_id]
    pub id: String,
}

#[derive(Message, Serialize, Deserialize)]
pub struct Shipped {
    #[correlation_id]
    pub id: String,
}

#[derive(Message, Serialize, Deserialize)]
pub struct Noted {
    #[correlation_id]
    pub id: String,
}

#[derive(Default, Serialize, Deserialize)]
pub struct Order {}

pub struct Orders;

#[process_manager(state = Order)]
impl Orders {
    #[starts]
    async fn opened(&self, _m: Opened, _s: &mut Order, _c: &mut ProcessContext) -> Result<(), ProcessError> {
        Ok(())
    }

    #[handles(hold = "90s", then = dead_letter)]
    async fn paid(&self, _m: Paid, _s: &mut Order, _c: &mut ProcessContext) -> Result<(), ProcessError> {
        Ok(())
    }

    #[handles(hold = "0s", then = drop)]
    async fn shipped(&self, _m: Shipped, _s: &mut Order, _c: &mut ProcessContext) -> Result<(), ProcessError> {
        Ok(())
    }

    #[handles(then = "drop")]
    async fn noted(&self, _m: Noted, _s: &mut Order, _c: &mut ProcessContext) -> Result<(), ProcessError> {
        Ok(())
    }
}

fn main() {
    use saga_runtime::process::{AfterHold, Unmatched};
    let def = <Orders as saga_runtime::process::ProcessManager>::definition();
    let of = |t: &str| def.handler(t).unwrap().unmatched;
    assert_eq!(
        of("Paid"),
        Unmatched { hold: Some(std::time::Duration::from_secs(90)), then: Some(AfterHold::DeadLetter) }
    );
    assert_eq!(of("Shipped"), Unmatched { hold: Some(std::time::Duration::ZERO), then: Some(AfterHold::Drop) });
    assert_eq!(of("Noted"), Unmatched { hold: None, then: Some(AfterHold::Drop) });
    assert_eq!(of("Opened"), Unmatched::default());
}
