//! `#[handles(many)]` (with `strict`), a plain `#[handles]` on the same
//! shared field, and the tally messages handled by `#[handles]`.
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

#[derive(Message, Serialize, Deserialize)]
pub struct ProductRecalled {
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
        let _ = ctx.open_tally("items", ["a", "b"]).reference();
        state.product = msg.product;
        Ok(())
    }

    #[handles(strict, many = true)]
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

    #[handles]
    #[correlate(state.product = msg.product)]
    async fn recalled(
        &self,
        msg: ProductRecalled,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }

    #[handles]
    async fn all_done(
        &self,
        msg: TallyCompleted,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }

    #[timeout]
    async fn progress(
        &self,
        msg: TallyStatus,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
}

fn main() {
    let _ = Engine::builder().process_manager(Orders);
}
