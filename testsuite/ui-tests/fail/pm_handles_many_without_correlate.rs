//! `#[handles(many)]` on a handler found by the correlation id: the id is
//! unique, so there is never more than one instance to reach.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct OrderOpened {
    #[correlation_id]
    pub order: String,
}

#[derive(Message, Serialize, Deserialize)]
pub struct OrderPaid {
    #[correlation_id]
    pub order: String,
}

#[derive(Default, Serialize, Deserialize)]
pub struct Order {
    pub paid: bool,
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

    #[handles(many)]
    async fn paid(
        &self,
        msg: OrderPaid,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, state, ctx);
        Ok(())
    }
}

fn main() {}
