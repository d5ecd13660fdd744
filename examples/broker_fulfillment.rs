//! The fulfillment process manager fed by a broker: the shop (another
//! process, with only its broker client: `examples/broker_shop.rs`)
//! publishes `OrderSubmitted`, `InventoryReserved` and `PaymentCaptured`
//! as CloudEvents, in whatever order; once an order is reserved and paid
//! this sends `Ship` to the `shipping` queue (or subject), which the shop
//! reads.
//!
//! ```text
//! # with the machine's RabbitMQ (or `nats://127.0.0.1:4222` for NATS JetStream):
//! cargo run --features rabbitmq,nats --example broker_fulfillment -- amqp://guest:guest@127.0.0.1:5672/%2f
//! # in another terminal:
//! cargo run --features rabbitmq,nats --example broker_shop -- amqp://guest:guest@127.0.0.1:5672/%2f
//! ```
//!
//! A second argument names a store (`redis://..`, `postgres://..`):
//! without one the engine keeps its state in memory. Stop it with Ctrl-C.

use saga_runtime::prelude::*;
use saga_runtime::transport::nats::Nats;
use saga_runtime::transport::rabbitmq::RabbitMq;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
struct OrderSubmitted {
    #[correlation_id]
    order_id: String,
    order_number: String,
}

/// From the warehouse, which knows only the order number.
#[derive(Message, Serialize, Deserialize)]
struct InventoryReserved {
    order_number: String,
}

#[derive(Message, Serialize, Deserialize)]
struct PaymentCaptured {
    #[correlation_id]
    order_id: String,
}

/// What goes to the `shipping` queue.
#[derive(Message, Serialize, Deserialize)]
struct Ship {
    #[correlation_id]
    order_id: String,
    order_number: String,
}

#[derive(Default, Serialize, Deserialize)]
struct Order {
    order_number: String,
    reserved: bool,
    paid: bool,
}

struct Fulfillment;

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

    #[handles] // early (before its order): held until the order is submitted
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
}

fn ship_when_ready(state: &Order, ctx: &mut ProcessContext) {
    if !state.order_number.is_empty() && state.reserved && state.paid {
        let order_id = ctx.instance_id().to_owned();
        println!("order {order_id} reserved and paid: shipping");
        ctx.send(
            "shipping",
            Ship {
                order_id,
                order_number: state.order_number.clone(),
            },
        );
        ctx.mark_complete();
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let broker = args
        .next()
        .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let mut builder = Engine::builder().process_manager(Fulfillment).workers(0);
    if let Some(store) = args.next() {
        builder = builder.backend_arc(saga_runtime::backend::connect(&store).await?);
    }
    let builder = match broker.starts_with("nats") {
        true => builder.transport(Nats::new(&broker).relay("shipping")),
        false => builder.transport(RabbitMq::new(&broker).relay("shipping")),
    };
    let engine = builder.build().await?;
    println!("fulfillment is listening on {broker} (Ctrl-C to stop)");
    engine
        .run_workers_until(2, saga_runtime::shutdown_signal())
        .await?;
    Ok(())
}
