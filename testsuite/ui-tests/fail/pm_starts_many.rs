//! `many` on `#[starts]`: a starting message creates or continues one
//! instance.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct OrderOpened {
    pub product: String,
}

#[derive(Default, Serialize, Deserialize)]
pub struct Order {
    pub product: String,
}

pub struct Orders;

#[process_manager(state = Order)]
impl Orders {
    #[starts(strict, many)]
    #[correlate(state.product = msg.product)]
    async fn opened(
        &self,
        msg: OrderOpened,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
}

fn main() {}
