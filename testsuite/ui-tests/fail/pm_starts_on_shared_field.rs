//! A `#[starts]` handler correlated by a field that `#[handles(many)]`
//! shares among instances: which instance it continues could not be told.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct OrderOpened {
    pub product: String,
}

#[derive(Message, Serialize, Deserialize)]
pub struct PriceChanged {
    pub product: String,
    pub price: u32,
}

#[derive(Default, Serialize, Deserialize)]
pub struct Order {
    pub product: String,
    pub price: u32,
}

pub struct Orders;

#[process_manager(state = Order)]
impl Orders {
    #[starts]
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

    #[handles(many)]
    #[correlate(state.product = msg.product)]
    async fn price_changed(
        &self,
        msg: PriceChanged,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.price = msg.price;
        let _ = ctx;
        Ok(())
    }
}

fn main() {}
