//! `many` is a flag.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct OrderOpened {
    #[correlation_id]
    pub order: String,
    pub product: String,
}

#[derive(Message, Serialize, Deserialize)]
pub struct PriceChanged {
    pub product: String,
}

#[derive(Default, Serialize, Deserialize)]
pub struct Order {
    pub product: String,
}

pub struct Orders;

#[process_manager(state = Order)]
impl Orders {
    #[starts]
    async fn opened(
        &self,
        msg: OrderOpened,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }

    #[handles(many = "yes")]
    #[correlate(state.product = msg.product)]
    async fn price_changed(
        &self,
        msg: PriceChanged,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
}

fn main() {}
