//! Attribute macros of `saga-runtime`. Users depend on `saga-runtime`, which
//! re-exports these; the generated code reaches the runtime only through
//! `::saga_runtime::__private`, so this crate has no runtime dependency.
//!
//! `#[saga]` (with `#[cancellable]`, which moves itself next to it),
//! `#[process_manager]` and `#[derive(Message)]` do real work. The other
//! attributes are read and removed by `#[saga]` or `#[process_manager]`
//! before the compiler ever resolves them; their own entry points exist so
//! that the names resolve at all, and they run only when misplaced, to say so.

mod attr_args;
mod ctxt;
mod helpers;
mod item;
mod limit;
mod message;
mod name;
mod process;
mod saga;
mod suggest;
mod types;

use proc_macro::TokenStream;

/// Turns an inherent `impl` block of step methods into a saga.
///
/// ```ignore
/// #[saga(name = "create-zip")]   // name is optional: kebab-case of the type by default
/// #[cancellable]
/// impl CreateZip {
///     #[saga_step(1)]
///     #[retry_policy(max_retries = 5, backoff = exponential, base_delay_ms = 200)]
///     async fn upload(&self, req: Request, ctx: &StepContext) -> Result<Uploaded, StepError> { .. }
///
///     #[compensate(upload)]
///     async fn delete_upload(&self, uploaded: Uploaded) -> Result<(), StepError> { .. }
/// }
/// ```
///
/// Generates `impl Saga for CreateZip`, `impl Cancellable` (with
/// `#[cancellable]`), the `CreateZipStepOutput` enum and the
/// `CreateZipReconciliation` base trait. Misconfigurations are compile errors
/// on the offending token.
#[proc_macro_attribute]
pub fn saga(args: TokenStream, item: TokenStream) -> TokenStream {
    saga::expand(args.into(), item.into()).into()
}

/// Marks a step of a `#[saga]` impl: `#[saga_step(1)]`, `#[saga_step(2)]`, ...
///
/// `#[saga_step(1, timeout_ms = 30_000)]` limits each attempt of the step to
/// 30 s; a timed-out attempt is cancelled and counts as a transient failure.
/// Without it the engine's default applies (`EngineBuilder::step_timeout`).
#[proc_macro_attribute]
pub fn saga_step(args: TokenStream, item: TokenStream) -> TokenStream {
    helpers::standalone("saga_step", args.into(), item.into()).into()
}

/// Retries of a step: `#[retry_policy(max_retries = 5, backoff = exponential,
/// base_delay_ms = 200, max_delay_ms = 5000, jitter, on_exhausted = compensate)]`.
#[proc_macro_attribute]
pub fn retry_policy(args: TokenStream, item: TokenStream) -> TokenStream {
    helpers::standalone("retry_policy", args.into(), item.into()).into()
}

/// Retries of a step's compensation (on the step): same keys as
/// `#[retry_policy]` except `on_exhausted`.
#[proc_macro_attribute]
pub fn compensation_retry_policy(args: TokenStream, item: TokenStream) -> TokenStream {
    helpers::standalone("compensation_retry_policy", args.into(), item.into()).into()
}

/// Marks the method that undoes a step: `#[compensate(upload_to_s3)]`.
///
/// ```ignore
/// // Called for a completed step, with its output:
/// #[compensate(upload)]
/// async fn delete_upload(&self, uploaded: Uploaded, ctx: &StepContext) -> Result<(), StepError> { .. }
///
/// // Also called for a step whose attempt began and whose outcome was lost
/// // (its worker died between the side effect and the write that records
/// // it), with the step's input: the compiler's exhaustiveness check says
/// // what it must handle.
/// #[compensate(charge)]
/// async fn refund(&self, out: Outcome<Charged, Order>, ctx: &StepContext) -> Result<(), StepError> {
///     match out {
///         Outcome::Completed(charged) => self.psp.refund(&charged.id).await,
///         Outcome::Unknown(_order) => self.psp.refund_by_key(&ctx.step_idempotency_key()).await,
///     }
/// }
/// ```
///
/// Compensations run in reverse step order after a step fails for good
/// (`on_exhausted = compensate`) or the task is cancelled: every step that
/// completed, and, for a compensation taking `Outcome<Output, Input>` (the
/// step's output, then its input; `#[saga]` checks both), every step whose
/// outcome was lost. A step known to have failed is not compensated.
///
/// Compensations run **at least once**: one whose worker dies before its
/// outcome is written runs again, and `Outcome::Unknown` may stand for an
/// attempt that did nothing. Make them idempotent: undo by
/// `ctx.step_idempotency_key()` (the key the step handed to its services)
/// whatever was done under it, if anything, and give the compensation's own
/// requests `ctx.idempotency_key()`.
#[proc_macro_attribute]
pub fn compensate(args: TokenStream, item: TokenStream) -> TokenStream {
    helpers::standalone("compensate", args.into(), item.into()).into()
}

/// A circuit breaker around a step:
/// `#[circuit_breaker(failure_threshold = 5, duration_secs = 30)]`.
#[proc_macro_attribute]
pub fn circuit_breaker(args: TokenStream, item: TokenStream) -> TokenStream {
    helpers::standalone("circuit_breaker", args.into(), item.into()).into()
}

/// Flow control on a step (or a process manager's handler), across the
/// whole deployment: `#[limit(concurrency = 10)]`,
/// `#[limit(rate = 100, per = "1s", burst = 20, key = input.merchant_id, name = "psp")]`.
///
/// `concurrency = N`: at most N attempts at once. `rate = N`: at most N
/// starts per `per` (default `"1s"`; `"500ms"`, `"2m"`, `"1h"`), of which
/// `burst` (default 1) may come at once. `key = input.field`: per value of
/// that field (`msg.field` on a handler). `name = ".."`: one budget shared
/// by every step and handler naming it (default `"{saga}.{method}"`).
/// Several `#[limit]` on one method must each grant. An attempt that cannot
/// start waits parked, holding no worker, and not against its retries or
/// timeout.
#[proc_macro_attribute]
pub fn limit(_args: TokenStream, item: TokenStream) -> TokenStream {
    limit::standalone(item.into()).into()
}

/// Allows `engine.cancel::<S>(id)`; goes next to `#[saga]` (above or below).
#[proc_macro_attribute]
pub fn cancellable(args: TokenStream, item: TokenStream) -> TokenStream {
    helpers::cancellable(args.into(), item.into()).into()
}

// ---- process managers ----

/// Turns an inherent `impl` block of message handlers into a process manager.
///
/// ```ignore
/// #[process_manager(name = "fulfillment", state = FulfillmentState)]
/// impl Fulfillment {
///     #[starts]
///     async fn submitted(&self, msg: OrderSubmitted, state: &mut FulfillmentState, ctx: &mut ProcessContext) -> Result<(), ProcessError> { .. }
///
///     #[handles]
///     #[correlate(state.order_number = msg.order_number)]
///     async fn reserved(&self, msg: InventoryReserved, state: &mut FulfillmentState, ctx: &mut ProcessContext) -> Result<(), ProcessError> { .. }
///
///     #[timeout]
///     async fn payment_due(&self, t: PaymentDue, state: &mut FulfillmentState, ctx: &mut ProcessContext) -> Result<(), ProcessError> { .. }
///
///     #[on_error]
///     fn on_error(&self, failure: &Failure) -> ErrorAction { .. }
/// }
/// ```
///
/// Keys: `state` (required), `name` (default: kebab-case of the type),
/// `on_complete = keep | delete`, `concurrency = optimistic | pessimistic`.
/// Generates `impl ProcessManager`; misconfigurations are compile errors on
/// the offending token.
#[proc_macro_attribute]
pub fn process_manager(args: TokenStream, item: TokenStream) -> TokenStream {
    process::expand(args.into(), item.into()).into()
}

/// A handler whose message may create the instance: `#[starts]`, or
/// `#[starts(strict)]` (an existing instance is an error).
#[proc_macro_attribute]
pub fn starts(args: TokenStream, item: TokenStream) -> TokenStream {
    process::standalone("starts", args.into(), item.into()).into()
}

/// A handler whose message continues an existing instance: `#[handles]`, or
/// `#[handles(strict)]` (a missing instance is an error, not a dropped message).
#[proc_macro_attribute]
pub fn handles(args: TokenStream, item: TokenStream) -> TokenStream {
    process::standalone("handles", args.into(), item.into()).into()
}

/// Finds the instance through a state field instead of the message's
/// `#[correlation_id]`: `#[correlate(state.order_number = msg.order_number)]`.
#[proc_macro_attribute]
pub fn correlate(args: TokenStream, item: TokenStream) -> TokenStream {
    process::standalone("correlate", args.into(), item.into()).into()
}

/// A timeout handler: receives what the instance scheduled with
/// `ctx.request_timeout(delay, msg)`.
#[proc_macro_attribute]
pub fn timeout(args: TokenStream, item: TokenStream) -> TokenStream {
    process::standalone("timeout", args.into(), item.into()).into()
}

/// The error policy of a process manager:
/// `fn on_error(&self, failure: &Failure) -> ErrorAction`.
#[proc_macro_attribute]
pub fn on_error(args: TokenStream, item: TokenStream) -> TokenStream {
    process::standalone("on_error", args.into(), item.into()).into()
}

/// Implements `Message`: `#[message(name = "..")]` sets the wire name (default:
/// the type's name), `#[correlation_id]` marks the field that identifies the
/// instance.
#[proc_macro_derive(Message, attributes(correlation_id, message))]
pub fn derive_message(item: TokenStream) -> TokenStream {
    message::derive(item.into()).into()
}
