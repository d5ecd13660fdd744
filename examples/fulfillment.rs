//! Order fulfillment as a process manager: order submitted -> reserve
//! inventory -> capture payment -> complete; if payment has not arrived 24 h
//! after the reservation, a timeout cancels the order.
//!
//! ```text
//! cargo run --example fulfillment
//! ```
//!
//! The 24 h timeout is scaled to 300 ms for the demo (a dependency of the
//! process manager); the inventory and payment services are played by this
//! program, reading the commands the process manager sends.

use std::time::Duration;

use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Message, Serialize, Deserialize)]
pub struct OrderSubmitted {
    #[correlation_id]
    pub order_id: String,
    pub order_number: String,
}

/// From the inventory service, which only knows the order number.
#[derive(Debug, Message, Serialize, Deserialize)]
pub struct InventoryReserved {
    pub order_number: String,
}

#[derive(Debug, Message, Serialize, Deserialize)]
pub struct PaymentCaptured {
    #[correlation_id]
    pub order_id: String,
}

#[derive(Debug, Message, Serialize, Deserialize)]
pub struct PaymentDue;

/// Commands the process manager sends.
#[derive(Debug, Message, Serialize, Deserialize)]
pub struct ReserveInventory {
    pub order_number: String,
}
#[derive(Debug, Message, Serialize, Deserialize)]
pub struct CapturePayment {
    pub order_id: String,
}
#[derive(Debug, Message, Serialize, Deserialize)]
pub struct CancelOrder {
    pub order_number: String,
    pub reason: String,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct FulfillmentState {
    pub order_number: String,
    pub submitted: bool,
    pub reserved: bool,
    pub paid: bool,
    pub cancelled: bool,
}

pub struct Fulfillment {
    /// 24 h in production.
    pub payment_timeout: Duration,
}

#[process_manager(name = "fulfillment", state = FulfillmentState)]
impl Fulfillment {
    #[starts]
    async fn submitted(
        &self,
        msg: OrderSubmitted,
        state: &mut FulfillmentState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if state.submitted {
            return Ok(()); // idempotent: seen it already
        }
        state.submitted = true;
        state.order_number = msg.order_number.clone();
        ctx.send(
            "inventory",
            ReserveInventory {
                order_number: msg.order_number,
            },
        );
        Ok(())
    }

    #[handles]
    #[correlate(state.order_number = msg.order_number)]
    async fn reserved(
        &self,
        _msg: InventoryReserved,
        state: &mut FulfillmentState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if state.reserved {
            return Ok(());
        }
        state.reserved = true;
        ctx.send(
            "payments",
            CapturePayment {
                order_id: ctx.instance_id().to_owned(),
            },
        );
        ctx.request_timeout(self.payment_timeout, PaymentDue);
        Ok(())
    }

    #[handles]
    async fn paid(
        &self,
        _msg: PaymentCaptured,
        state: &mut FulfillmentState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.paid = true;
        ctx.mark_complete();
        Ok(())
    }

    #[timeout]
    async fn payment_due(
        &self,
        _t: PaymentDue,
        state: &mut FulfillmentState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if !state.paid {
            state.cancelled = true;
            ctx.send(
                "orders",
                CancelOrder {
                    order_number: state.order_number.clone(),
                    reason: "payment not captured within 24 h".into(),
                },
            );
            ctx.mark_complete();
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let payment_timeout = Duration::from_millis(300);
    let engine = Engine::builder()
        .process_manager(Fulfillment { payment_timeout })
        .timeout_poll_interval(Duration::from_millis(20))
        .build()
        .await?;
    let settle = || tokio::time::sleep(Duration::from_millis(80));

    // Order A goes all the way; order B is never paid.
    for (id, number) in [("order-a", "A-100"), ("order-b", "B-200")] {
        engine
            .publish(OrderSubmitted {
                order_id: id.into(),
                order_number: number.into(),
            })
            .await?;
    }
    settle().await;
    for number in ["A-100", "B-200"] {
        engine
            .publish(InventoryReserved {
                order_number: number.into(),
            })
            .await?;
    }
    settle().await;
    engine
        .publish(PaymentCaptured {
            order_id: "order-a".into(),
        })
        .await?;
    println!("waiting past the payment timeout ({payment_timeout:?} in this demo) ...");
    tokio::time::sleep(payment_timeout + Duration::from_millis(300)).await;

    for id in ["order-a", "order-b"] {
        let instance = engine
            .process_instance::<Fulfillment>(id)
            .await?
            .expect("instance exists");
        let state: FulfillmentState = serde_json::from_value(instance.state.clone())?;
        println!("{id}: {state:?} -> {:?}", instance.status);
        for entry in &instance.audit_log {
            println!("    {:<18} {:?}", entry.message_type, entry.action);
        }
    }
    for endpoint in ["inventory", "payments", "orders"] {
        for sent in engine.process_store()?.endpoint_messages(endpoint).await? {
            println!("sent to {endpoint:<9} {sent}");
        }
    }
    Ok(())
}
