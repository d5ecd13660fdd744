//! `#[limit]` in every form, on the steps of a saga (one generic) and the
//! handlers of a process manager (one generic): the definitions carry the
//! declared limits, defaults spelled out, and each key reads its field from
//! the input's JSON.
use std::marker::PhantomData;
use std::time::Duration;

use saga_runtime::limit::{LimitSpec, Rate};
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Serialize, Deserialize)]
pub struct ChargeRequest {
    pub merchant_id: u64,
    pub customer: Customer,
}

#[derive(Serialize, Deserialize)]
pub struct Customer {
    pub id: String,
}

#[derive(Serialize, Deserialize)]
pub struct Charged(pub String, pub u32);

#[derive(Serialize, Deserialize)]
pub struct Notified;

pub struct Checkout;

#[saga(name = "checkout")]
impl Checkout {
    #[saga_step(1)]
    #[limit(concurrency = 10)]
    #[limit(rate = 100, per = "1s", burst = 20, key = input.merchant_id, name = "psp")]
    async fn charge(&self, req: ChargeRequest) -> Result<Charged, StepError> {
        Ok(Charged(req.customer.id, 7))
    }

    #[compensate(charge)]
    async fn refund(&self, charged: Charged) -> Result<(), StepError> {
        let _ = charged;
        Ok(())
    }

    // The same budget as `charge` (`per` left at its default, one second),
    // keyed by a tuple field through the parameter's own name.
    #[saga_step(2)]
    #[saga_runtime::limit(rate = 100, burst = 20, name = "psp", key = charged.0)]
    #[limit(concurrency = 3, rate = 5, per = "500ms", key = input.1, name = "mailer:eu-1")]
    async fn notify(&self, charged: Charged, ctx: &StepContext) -> Result<Notified, StepError> {
        let _ = (charged, ctx);
        Ok(Notified)
    }
}

/// A generic saga: the definition is a `static` in a generic impl.
pub struct Resize<S>(PhantomData<S>);

#[saga]
impl<S: Send + Sync + 'static> Resize<S> {
    #[saga_step(1)]
    #[limit(concurrency = 1, key = input.customer.id)]
    async fn resize(&self, req: ChargeRequest) -> Result<u64, StepError> {
        Ok(req.merchant_id)
    }
}

#[derive(Message, Serialize, Deserialize)]
pub struct OrderSubmitted {
    #[correlation_id]
    pub order_id: u64,
    pub customer_id: String,
}

#[derive(Message, Serialize, Deserialize)]
pub struct Reserved {
    #[correlation_id]
    pub order_id: u64,
    pub warehouse: Warehouse,
}

#[derive(Serialize, Deserialize)]
pub struct Warehouse {
    pub code: u32,
}

#[derive(Message, Serialize, Deserialize)]
pub struct PaymentDue;

#[derive(Default, Serialize, Deserialize)]
pub struct OrderState {
    pub customer_id: String,
}

pub struct Fulfillment<C>(PhantomData<C>);

#[process_manager(name = "fulfillment", state = OrderState)]
impl<C: Send + Sync + 'static> Fulfillment<C> {
    #[starts]
    #[limit(concurrency = 2, key = msg.customer_id)]
    async fn submitted(
        &self,
        msg: OrderSubmitted,
        state: &mut OrderState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = ctx;
        state.customer_id = msg.customer_id;
        Ok(())
    }

    #[handles]
    #[limit(rate = 10, per = "1m", key = reserved.warehouse.code)]
    #[limit(rate = 100, burst = 20, name = "psp")]
    async fn reserved(
        &self,
        reserved: Reserved,
        state: &mut OrderState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (reserved, state, ctx);
        Ok(())
    }

    #[timeout]
    #[limit(concurrency = 1, rate = 1, per = "2h")]
    async fn payment_due(
        &self,
        due: PaymentDue,
        state: &mut OrderState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = (due, state, ctx);
        Ok(())
    }
}

fn rate(count: u32, per: Duration, burst: u32) -> Option<Rate> {
    Some(Rate { count, per, burst })
}

/// `spec`'s key read from `input`.
fn key(spec: &LimitSpec, input: serde_json::Value) -> Result<String, String> {
    (spec.key.expect("a keyed limit").of)(&input)
}

fn main() {
    let request = json!({ "merchant_id": 42, "customer": { "id": "c-7" } });
    let second = Duration::from_secs(1);

    let steps = Checkout::definition().steps;
    let [unkeyed, psp] = steps[0].limits else {
        panic!("two limits on `charge`: {:?}", steps[0].limits)
    };
    assert_eq!(unkeyed.name, "checkout.charge");
    assert_eq!(unkeyed.concurrency, Some(10));
    assert_eq!((unkeyed.rate, unkeyed.key.is_none()), (None, true));
    assert_eq!(psp.name, "psp");
    assert_eq!((psp.concurrency, psp.rate), (None, rate(100, second, 20)));
    assert_eq!(psp.key.unwrap().expr, "input.merchant_id");
    assert_eq!(key(&psp, request.clone()), Ok("42".to_owned()));
    let error = key(&psp, json!({ "merchant_id": "x" })).unwrap_err();
    assert!(error.starts_with("the input does not decode"), "{error}");

    let [shared, mailer] = steps[1].limits else {
        panic!("two limits on `notify`: {:?}", steps[1].limits)
    };
    assert_eq!(shared.config(), psp.config());
    assert_eq!(shared.key.unwrap().expr, "charged.0");
    assert_eq!(key(&shared, json!(["c-7", 3])), Ok("c-7".to_owned()));
    assert_eq!(mailer.name, "mailer:eu-1");
    assert_eq!(mailer.concurrency, Some(3));
    assert_eq!(mailer.rate, rate(5, Duration::from_millis(500), 1));
    assert_eq!(key(&mailer, json!(["c-7", 3])), Ok("3".to_owned()));

    let resize = Resize::<u8>::definition().steps[0].limits;
    assert_eq!(resize[0].name, "resize.resize");
    assert_eq!(key(&resize[0], request), Ok("c-7".to_owned()));

    let handlers = <Fulfillment<u8> as ProcessManager>::definition().handlers;
    let submitted = handlers[0].limits;
    assert_eq!(submitted.len(), 1);
    assert_eq!(submitted[0].name, "fulfillment.submitted");
    assert_eq!(submitted[0].concurrency, Some(2));
    assert_eq!(submitted[0].key.unwrap().expr, "msg.customer_id");
    let order = json!({ "order_id": 1, "customer_id": "c-9" });
    assert_eq!(key(&submitted[0], order), Ok("c-9".to_owned()));

    let [by_warehouse, psp_too] = handlers[1].limits else {
        panic!("two limits on `reserved`: {:?}", handlers[1].limits)
    };
    assert_eq!(by_warehouse.name, "fulfillment.reserved");
    assert_eq!(by_warehouse.rate, rate(10, Duration::from_secs(60), 1));
    let reserved = json!({ "order_id": 1, "warehouse": { "code": 12 } });
    assert_eq!(key(&by_warehouse, reserved), Ok("12".to_owned()));
    assert_eq!(psp_too.config(), psp.config());

    let due = handlers[2].limits;
    assert_eq!(due[0].name, "fulfillment.payment_due");
    assert_eq!(due[0].concurrency, Some(1));
    assert_eq!(due[0].rate, rate(1, Duration::from_secs(7200), 1));
    assert!(due[0].key.is_none());
}
