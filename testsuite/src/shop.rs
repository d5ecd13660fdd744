//! The fulfillment process manager the broker tests, the broker worker
//! and the broker example share: an order is submitted (by its id),
//! reserved (found by its number) and paid (by its id), then it sends a
//! `Ship` command and completes; `Counted` messages each add one to the
//! order's count, and their ids are kept, so a test can tell a message
//! applied twice from one applied once.

use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

/// Starts an order.
#[derive(Debug, Clone, Message, Serialize, Deserialize)]
pub struct OrderSubmitted {
    #[correlation_id]
    pub order_id: String,
    pub order_number: String,
}

/// Inventory was reserved; knows only the order number.
#[derive(Debug, Clone, Message, Serialize, Deserialize)]
pub struct InventoryReserved {
    pub order_number: String,
}

/// The payment was captured.
#[derive(Debug, Clone, Message, Serialize, Deserialize)]
pub struct PaymentCaptured {
    #[correlation_id]
    pub order_id: String,
}

/// One more of something for an order (the tests' exactly-once probe).
#[derive(Debug, Clone, Message, Serialize, Deserialize)]
pub struct Counted {
    #[correlation_id]
    pub order_id: String,
    pub n: u64,
}

/// What the process manager sends once an order is reserved and paid.
#[derive(Debug, Clone, PartialEq, Message, Serialize, Deserialize)]
pub struct Ship {
    #[correlation_id]
    pub order_id: String,
    pub order_number: String,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Order {
    pub order_number: String,
    pub reserved: bool,
    pub paid: bool,
    /// How many `Counted` messages were applied, and their `n`s in order.
    pub counted: Vec<u64>,
}

/// The endpoint shipping commands go to.
pub const SHIPPING: &str = "shipping";

pub struct Fulfillment;

#[process_manager(name = "fulfillment", state = Order)]
impl Fulfillment {
    #[starts]
    async fn submitted(
        &self,
        msg: OrderSubmitted,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.order_number = msg.order_number;
        ship_when_ready(state, ctx);
        Ok(())
    }

    #[handles]
    #[correlate(state.order_number = msg.order_number)]
    async fn reserved(
        &self,
        _msg: InventoryReserved,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.reserved = true;
        ship_when_ready(state, ctx);
        Ok(())
    }

    #[handles]
    async fn paid(
        &self,
        _msg: PaymentCaptured,
        state: &mut Order,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.paid = true;
        ship_when_ready(state, ctx);
        Ok(())
    }

    #[handles]
    async fn counted(
        &self,
        msg: Counted,
        state: &mut Order,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if msg.n == u64::MAX {
            // The tests' poison: a handler that takes its process down.
            std::process::abort();
        }
        state.counted.push(msg.n);
        Ok(())
    }
}

/// Ships a submitted order once it is reserved and paid, and completes it.
fn ship_when_ready(state: &Order, ctx: &mut ProcessContext) {
    if !state.order_number.is_empty() && state.reserved && state.paid {
        ctx.send(
            SHIPPING,
            Ship {
                order_id: ctx.instance_id().to_owned(),
                order_number: state.order_number.clone(),
            },
        );
        ctx.mark_complete();
    }
}
