//! [`Outcome`]: what a compensation that also undoes lost outcomes
//! receives, and the checks `#[saga]` generates for its type arguments.
//!
//! A crash between a step's side effect and the write that records it
//! loses the step's output, not the side effect: the charge happened, the
//! record says the attempt began and never reported back. A compensation
//! that takes the step's output cannot undo that attempt, so it is not
//! called for it; one that takes `Outcome<Output, Input>` is, with the
//! step's input, and undoes by the step's idempotency key
//! ([`StepContext::step_idempotency_key`](crate::StepContext::step_idempotency_key)).
//! Opting in by the parameter's type makes the compiler's exhaustiveness
//! check say what such a compensation must handle, and keeps the common
//! compensation as simple as it was.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a compensation declared `async fn undo(&self, out: Outcome<Out, In>, ..)`
/// is called with: the step's recorded output, or, when an attempt of the
/// step began and its outcome was lost, the input that attempt was called
/// with.
///
/// ```
/// # use saga_runtime::prelude::*;
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize)] pub struct Order { cents: u64 }
/// # #[derive(Serialize, Deserialize)] pub struct Charge { id: String }
/// # struct Psp;
/// # impl Psp {
/// #     async fn refund(&self, _charge: &str) -> Result<(), StepError> { Ok(()) }
/// #     async fn refund_by_key(&self, _key: &str) -> Result<(), StepError> { Ok(()) }
/// # }
/// # struct Pay { psp: Psp }
/// #[saga(name = "pay")]
/// impl Pay {
///     #[saga_step(1)]
///     async fn charge(&self, order: Order, ctx: &StepContext) -> Result<Charge, StepError> {
///         // The provider keys the charge by ctx.idempotency_key().
/// #       let _ = (order.cents, ctx.idempotency_key());
///         Ok(Charge { id: "ch_1".into() })
///     }
///
///     #[compensate(charge)]
///     async fn refund(&self, out: Outcome<Charge, Order>, ctx: &StepContext) -> Result<(), StepError> {
///         match out {
///             Outcome::Completed(charge) => self.psp.refund(&charge.id).await,
///             // The charge may or may not have happened: undo whatever
///             // was done under the step's key, if anything.
///             Outcome::Unknown(_order) => self.psp.refund_by_key(&ctx.step_idempotency_key()).await,
///         }
///     }
/// }
/// ```
///
/// The two type arguments are the step's output and its input, in that
/// order; `#[saga]` checks both, with an error on the one that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome<Output, Input> {
    /// The step completed: its output, as recorded.
    Completed(Output),
    /// An attempt of the step began and what it did is not known: its
    /// worker died (or lost its lease) before recording the result, or the
    /// attempt was dropped for ignoring its timeout, a cancellation or a
    /// shutdown. The side effect may have happened, once or more, or not at
    /// all. Carries the step's input, as every attempt was called with it.
    Unknown(Input),
}

/// `Outcome::Completed` carries the output of the step it undoes.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`Outcome::Completed` carries the output of step {STEP}, `{Output}`, not `{Self}`",
    label = "expected `{Output}`",
    note = "change the first type argument of `Outcome` to `{Output}`: a compensation takes `Outcome<Output, Input>` with the step's output, then its input"
)]
pub trait CompletedIsOutputOf<const STEP: u32, Output> {}

#[diagnostic::do_not_recommend]
impl<const STEP: u32, T> CompletedIsOutputOf<STEP, T> for T {}

/// `Outcome::Unknown` carries the input of the step it undoes.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`Outcome::Unknown` carries the input of step {STEP}, `{Input}`, not `{Self}`",
    label = "expected `{Input}`",
    note = "change the second type argument of `Outcome` to `{Input}`: when an attempt's outcome was lost, the compensation gets what the step was called with"
)]
pub trait UnknownIsInputOf<const STEP: u32, Input> {}

#[diagnostic::do_not_recommend]
impl<const STEP: u32, T> UnknownIsInputOf<STEP, T> for T {}

/// A compensation parameter named `Outcome<_, _>` is this crate's
/// [`Outcome`].
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not `saga_runtime::Outcome`: a compensation whose parameter is `Outcome<Output, Input>` is called with the engine's `Outcome`",
    label = "not `saga_runtime::Outcome`",
    note = "import `saga_runtime::Outcome` (the prelude has it); a type of your own named `Outcome` goes by another name here (`use my::Outcome as MyOutcome;`)"
)]
pub trait IsOutcome {}

impl<Output, Input> IsOutcome for Outcome<Output, Input> {}

/// What a compensation taking [`Outcome`] is called with, as the JSON its
/// generated code decodes: `{"Completed": output}`, serde's spelling of
/// `Outcome::Completed(output)` (the test below holds the two together).
pub(crate) fn completed_json(output: Value) -> Value {
    tagged("Completed", output)
}

/// `{"Unknown": input}`: `Outcome::Unknown(input)`.
pub(crate) fn unknown_json(input: Value) -> Value {
    tagged("Unknown", input)
}

fn tagged(variant: &str, value: Value) -> Value {
    let mut map = serde_json::Map::with_capacity(1);
    map.insert(variant.to_owned(), value);
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The engine builds the JSON by hand (no typed value at hand); serde
    /// must read it as the variant it names.
    #[test]
    fn the_engines_json_is_serdes_spelling_of_each_variant() {
        let completed: Outcome<u32, String> = Outcome::Completed(7);
        assert_eq!(
            serde_json::to_value(&completed).unwrap(),
            completed_json(json!(7))
        );
        let unknown: Outcome<u32, String> = Outcome::Unknown("order".into());
        assert_eq!(
            serde_json::to_value(&unknown).unwrap(),
            unknown_json(json!("order"))
        );
        let back: Outcome<u32, String> =
            serde_json::from_value(unknown_json(json!("order"))).unwrap();
        assert_eq!(back, unknown);
    }
}
