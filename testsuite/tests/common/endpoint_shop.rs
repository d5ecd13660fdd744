//! The process manager the endpoint tests on a server share
//! (`tests/endpoint_redis.rs`, `tests/scenarios/endpoints.rs`): `shop`
//! starts on an `OrderPlaced` and sends a `SendInvoice` for it to the
//! endpoint `invoicing`, for a consumer to take. (`tests/endpoint.rs`, on
//! memory, has its own, with an amount.)

use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct OrderPlaced {
    #[correlation_id]
    pub order: String,
}

#[derive(Debug, Message, Serialize, Deserialize)]
pub struct SendInvoice {
    #[correlation_id]
    pub order: String,
}

#[derive(Default, Serialize, Deserialize)]
pub struct Placed;

pub struct Shop;

#[process_manager(name = "shop", state = Placed)]
impl Shop {
    #[starts]
    async fn placed(
        &self,
        msg: OrderPlaced,
        _state: &mut Placed,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.send("invoicing", SendInvoice { order: msg.order });
        Ok(())
    }
}

/// Order `o-<n>`.
pub fn order(n: usize) -> OrderPlaced {
    OrderPlaced {
        order: format!("o-{n}"),
    }
}
