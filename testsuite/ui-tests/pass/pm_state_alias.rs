//! A handler's state parameter may name the declared state through an
//! alias or a path: the compiler decides that it is the same type.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct OrderSubmitted {
    #[correlation_id]
    pub order_id: u64,
}

#[derive(Message, Serialize, Deserialize)]
pub struct OrderShipped {
    #[correlation_id]
    pub order_id: u64,
}

pub mod model {
    #[derive(Default, serde::Serialize, serde::Deserialize)]
    pub struct Fulfillment {
        pub submitted: bool,
        pub shipped: bool,
    }
}

type State = model::Fulfillment;

pub struct Orders;

#[process_manager(name = "orders", state = model::Fulfillment)]
impl Orders {
    #[starts]
    async fn submitted(
        &self,
        msg: OrderSubmitted,
        state: &mut State,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (msg, ctx);
        state.submitted = true;
        Ok(())
    }

    #[handles]
    async fn shipped(
        &self,
        msg: OrderShipped,
        state: &mut crate::model::Fulfillment,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = msg;
        state.shipped = true;
        ctx.mark_complete();
        Ok(())
    }
}

fn main() {
    let _ = Engine::builder().process_manager(Orders);
}
