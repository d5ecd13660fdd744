//! The process manager of DESIGN.md: a starting message correlated by its
//! `#[correlation_id]`, a continuing one correlated through a state field, a
//! timeout, and an error policy.
use std::time::Duration;

use saga_runtime::prelude::*;
use saga_runtime::process::{Concurrency, Correlation, HandlerKind, OnComplete};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Message, Serialize, Deserialize)]
struct OrderSubmitted {
    #[correlation_id]
    order_id: Uuid,
    order_number: String,
}

#[derive(Message, Serialize, Deserialize)]
struct InventoryReserved {
    order_number: String,
}

#[derive(Message, Serialize, Deserialize)]
#[message(name = "payment-due")]
struct PaymentDue;

#[derive(Message, Serialize, Deserialize)]
struct ShipOrder {
    order_number: String,
}

#[derive(Default, Clone, Serialize, Deserialize)]
struct FulfillmentState {
    order_number: String,
    submitted: bool,
    reserved: bool,
    paid: bool,
}

struct Fulfillment;

#[process_manager(name = "fulfillment", state = FulfillmentState)]
impl Fulfillment {
    #[starts]
    async fn submitted(
        &self,
        msg: OrderSubmitted,
        state: &mut FulfillmentState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.order_number = msg.order_number;
        state.submitted = true;
        ctx.request_timeout(Duration::from_secs(3600), PaymentDue);
        Ok(())
    }

    #[handles]
    #[correlate(state.order_number = msg.order_number)]
    async fn reserved(
        &self,
        msg: InventoryReserved,
        state: &mut FulfillmentState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.reserved = true;
        ctx.send(
            "shipping",
            ShipOrder {
                order_number: msg.order_number,
            },
        );
        Ok(())
    }

    #[timeout]
    async fn payment_due(
        &self,
        t: PaymentDue,
        state: &mut FulfillmentState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = t;
        if !state.paid {
            ctx.mark_complete();
        }
        Ok(())
    }

    #[on_error]
    fn on_error(&self, failure: &Failure) -> ErrorAction {
        if failure.failures < 5 {
            ErrorAction::RetryAfter(Duration::from_millis(10))
        } else {
            ErrorAction::Stop
        }
    }

    /// Not a handler: left alone.
    fn helper(&self) -> u32 {
        7
    }
}

fn main() {
    assert_eq!(<Fulfillment as ProcessManager>::NAME, "fulfillment");
    assert_eq!(Fulfillment.helper(), 7);

    let def = Fulfillment::definition();
    assert_eq!(def.name, "fulfillment");
    assert_eq!(def.state_type, "FulfillmentState");
    assert_eq!(def.on_complete, OnComplete::Keep);
    assert_eq!(def.concurrency, Concurrency::Optimistic);
    assert_eq!(def.handlers.len(), 3);
    let submitted = def.handler("OrderSubmitted").unwrap();
    assert_eq!(submitted.method, "submitted");
    assert_eq!(submitted.kind, HandlerKind::Starts { strict: false });
    assert_eq!(submitted.correlation, Correlation::Id);
    let reserved = def.handler("InventoryReserved").unwrap();
    assert_eq!(reserved.kind, HandlerKind::Handles { strict: false, many: false });
    assert_eq!(
        reserved.correlation,
        Correlation::Field {
            state_field: "order_number",
            message_field: "order_number"
        }
    );
    let due = def.handler("payment-due").unwrap();
    assert_eq!(due.method, "payment_due");
    assert_eq!(due.kind, HandlerKind::Timeout);
    assert_eq!(due.correlation, Correlation::Instance);

    let id = Uuid::new_v4();
    let submitted = serde_json::json!({ "order_id": id, "order_number": "A-1" });
    assert_eq!(
        Fulfillment::message_key("OrderSubmitted", &submitted).unwrap(),
        Some(id.to_string())
    );
    let reserved = serde_json::json!({ "order_number": "A-1" });
    assert_eq!(
        Fulfillment::message_key("InventoryReserved", &reserved).unwrap(),
        Some("A-1".to_owned())
    );
    assert_eq!(
        Fulfillment::message_key("payment-due", &serde_json::Value::Null).unwrap(),
        None
    );
    assert!(
        Fulfillment::message_key("InventoryReserved", &serde_json::json!(3))
            .unwrap_err()
            .is_invalid_payload()
    );

    let state = FulfillmentState {
        order_number: "A-1".to_owned(),
        ..FulfillmentState::default()
    };
    assert_eq!(
        Fulfillment::state_keys(&state),
        vec![("order_number", "A-1".to_owned())]
    );
    // Only a starting handler with `#[correlate]` seeds; this one has none.
    let mut fresh = FulfillmentState::default();
    Fulfillment::seed("OrderSubmitted", &submitted, &mut fresh).unwrap();
    assert_eq!(fresh.order_number, "");

    let failure = Failure {
        kind: FailureKind::Handler,
        error: "boom".to_owned(),
        message_type: "OrderSubmitted".to_owned(),
        message_id: "m-1".to_owned(),
        instance_id: None,
        failures: 1,
    };
    assert_eq!(
        ProcessManager::on_error(&Fulfillment, &failure),
        ErrorAction::RetryAfter(Duration::from_millis(10))
    );
}
