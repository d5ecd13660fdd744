//! `hold` as a bare number.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct OrderOpened {
    #[correlation_id]
    pub id: String,
    pub product: String,
}

#[derive(Message, Serialize, Deserialize)]
pub struct OrderPaid {
    #[correlation_id]
    pub id: String,
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

    #[handles(hold = 600)]
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
