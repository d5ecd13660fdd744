//! Attributes and signatures -> typed structs.
//!
//! Everything that can be judged by looking at one attribute or one method
//! is judged here: key names and value ranges, the shape of a step's
//! signature, which helper attributes may be combined on one method. Rules
//! that relate several methods live in `check.rs`. This file walks the
//! item and its methods (the walk `#[process_manager]` shares is
//! `crate::item::walk_methods`); `attrs.rs` reads one helper attribute's
//! arguments, `signature.rs` one method's signature.
//!
//! Every function reports into the [`Ctxt`] and returns what it could still
//! make sense of, with `None` for the parts it could not: later stages skip
//! rules that depend on a missing part instead of piling a second error onto
//! the first.

use darling::ast::NestedMeta;
use darling::util::SpannedValue;
use darling::FromMeta;
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{
    Attribute, Expr, FnArg, GenericArgument, Ident, ImplItemFn, Lit, Meta, PathArguments,
    ReceiverKind, ReturnType, Type,
};

use super::vocab::{Backoff, BreakerScope, OnExhausted, WhenOpen};
use crate::attr_args::{
    choice, key_values, last_segment, last_segment_is, name_value, path_str, runtime_path,
};
use crate::ctxt::Ctxt;
use crate::helpers::{attr_name, is_method_helper};
use crate::item::walk_methods;
use crate::limit::{
    self,
    model::{Limit, Site},
    parse::Misplaced,
};
use crate::types::type_to_string;

mod attrs;
mod signature;
use attrs::*;
use signature::*;

/// What `#[saga]` was put on.
pub enum Parsed {
    /// An inherent impl block, taken apart.
    Impl(Box<ParsedSaga>),
    /// Anything else (already reported); re-emitted as is so that the rest of
    /// the crate still sees the item.
    Other(TokenStream),
}

pub struct ParsedSaga {
    /// The impl block with every helper attribute removed.
    pub item: syn::ItemImpl,
    pub args: SagaArgs,
    pub cancellable: bool,
    pub methods: Vec<ParsedMethod>,
    /// Whether any method carries `#[saga_step]`, valid or not: decides
    /// whether "has no steps" would be news to the user.
    pub any_step_attr: bool,
    /// On a trait impl (reported): only the stand-ins are generated.
    pub misplaced: bool,
}

/// `#[saga(name = "..", version = N, crate = path)]`.
#[derive(Default)]
pub struct SagaArgs {
    pub name: Option<SpannedValue<String>>,
    pub version: Option<u32>,
    pub runtime: Option<syn::Path>,
}

pub struct ParsedMethod {
    pub ident: Ident,
    pub role: Role,
}

pub enum Role {
    Step(Box<StepAttrs>),
    Compensation(Box<CompensationAttrs>),
}

pub struct StepAttrs {
    /// `n` of `#[saga_step(n)]`; `None` if it was invalid.
    pub order: Option<SpannedValue<u32>>,
    /// `timeout_ms` of `#[saga_step(n, timeout_ms = ..)]`; `None` if absent
    /// or invalid.
    pub timeout_ms: Option<u64>,
    pub sig: Signature,
    pub retry: Option<PolicyArgs>,
    pub compensation_retry: Option<PolicyArgs>,
    pub breaker: Option<BreakerArgs>,
    /// `#[limit(..)]`, the valid ones.
    pub limits: Vec<Limit>,
}

pub struct CompensationAttrs {
    /// The step named in `#[compensate(step)]`; `None` if malformed.
    pub target: Option<Ident>,
    pub sig: Signature,
}

/// What a step's or compensation's signature says, as far as it is valid.
pub struct Signature {
    /// The first parameter's type: a step's input, or (for a compensation)
    /// the step's output.
    pub input: Option<Type>,
    /// A step's `T` in `Result<T, StepError>` (always `None` for a
    /// compensation, whose `T` must be `()`).
    pub output: Option<Type>,
    /// Whether it takes `ctx: &StepContext`.
    pub takes_ctx: bool,
}

/// `#[retry_policy(..)]` / `#[compensation_retry_policy(..)]`.
pub struct PolicyArgs {
    /// The whole attribute, for errors about it as a whole.
    pub attr: TokenStream,
    pub max_retries: u32,
    pub backoff: Backoff,
    pub base_delay_ms: u64,
    pub max_delay_ms: Option<u64>,
    pub jitter: Option<bool>,
    pub on_exhausted: Option<OnExhausted>,
}

/// `#[circuit_breaker(..)]`.
pub struct BreakerArgs {
    pub failure_threshold: u32,
    pub duration_secs: u64,
    pub scope: Option<BreakerScope>,
    pub when_open: Option<WhenOpen>,
}

/// Entry point: the `#[saga(..)]` arguments and the item it is on.
pub fn parse(cx: &Ctxt, args: TokenStream, item: TokenStream) -> Parsed {
    let args = parse_saga_args(cx, args);
    let item = match syn::parse2::<syn::Item>(item.clone()) {
        Ok(syn::Item::Impl(item)) => item,
        Ok(other) => {
            not_an_impl(cx, &other);
            return Parsed::Other(strip_cancellable(other));
        }
        Err(err) => {
            cx.syn_error(err);
            return Parsed::Other(item);
        }
    };
    parse_impl(cx, args, item)
}

fn not_an_impl(cx: &Ctxt, item: &syn::Item) {
    let (what, tokens) = crate::item::describe(item);
    cx.error_spanned_by(
        tokens,
        format!(
            "`#[saga]` goes on an inherent `impl` block holding the steps, not on {what}: \
             `#[saga] impl MySaga {{ #[saga_step(1)] async fn .. }}`"
        ),
    );
}

/// `#[cancellable]` (moved below `#[saga]` by its own macro) must not run
/// again on an item `#[saga]` has already rejected.
fn strip_cancellable(mut item: syn::Item) -> TokenStream {
    let attrs = match &mut item {
        syn::Item::Struct(s) => Some(&mut s.attrs),
        syn::Item::Enum(e) => Some(&mut e.attrs),
        syn::Item::Fn(f) => Some(&mut f.attrs),
        syn::Item::Trait(t) => Some(&mut t.attrs),
        _ => None,
    };
    if let Some(attrs) = attrs {
        attrs.retain(|a| attr_name(a).as_deref() != Some("cancellable"));
    }
    item.into_token_stream()
}

fn parse_saga_args(cx: &Ctxt, args: TokenStream) -> SagaArgs {
    let items = match NestedMeta::parse_meta_list(args) {
        Ok(items) => items,
        Err(err) => {
            cx.syn_error(err);
            return SagaArgs::default();
        }
    };
    let keys = key_values(cx, "saga", &["name", "version", "crate"], &[], items);
    let mut args = SagaArgs::default();
    if let Some(meta) = keys.get("name") {
        match name_value(meta).map(string_value) {
            Some(Ok(name)) => {
                if crate::name::check(cx, "saga", &name, name.span(), "create-zip") {
                    args.name = Some(name);
                }
            }
            Some(Err(err)) => cx.darling_error(err),
            None => cx.error_spanned_by(meta, "`name` needs a value: `name = \"create-zip\"`"),
        }
    }
    if let Some(meta) = keys.get("version").filter(|m| whole_version(cx, m)) {
        args.version = int_key(
            cx,
            meta,
            1,
            u32::MAX.into(),
            ": versions count from 1 (a saga without `version` is version 1)",
        )
        .and_then(|v| u32::try_from(*v).ok());
    }
    if let Some(meta) = keys.get("crate") {
        args.runtime = runtime_path(cx, meta);
    }
    args
}

/// `version = 1.5` or `version = "2"`: reported with the whole number to
/// write (`false`); anything else is left to `int_key`. A version counts
/// deploys of a changed saga (tasks keep the version they started with), so
/// a change after 1 is 2, not 1.5.
fn whole_version(cx: &Ctxt, meta: &Meta) -> bool {
    let Some(Expr::Lit(syn::ExprLit { lit, .. })) = name_value(meta) else {
        return true;
    };
    let written = match lit {
        Lit::Float(f) => f.base10_digits().to_owned(),
        Lit::Str(s) => s.value(),
        _ => return true,
    };
    let Ok(value) = written.trim().parse::<f64>() else {
        return true;
    };
    // The next whole version: what a change after `1.5` would be.
    let next = if value.is_finite() && value > 1.0 {
        format!("{}", value.ceil())
    } else {
        "1".to_owned()
    };
    let message = match lit {
        Lit::Str(_) => format!(
            "`version` is a whole number, not a string: write `version = {next}` (versions \
             count 1, 2, 3, ...; a saga without `version` is version 1)"
        ),
        _ => format!(
            "`version = {written}` is not a whole number: versions count 1, 2, 3, ... (a saga \
             without `version` is version 1); write e.g. `version = {next}`"
        ),
    };
    cx.error_spanned_by(lit, message);
    false
}

fn string_value(expr: &Expr) -> darling::Result<SpannedValue<String>> {
    match expr {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(SpannedValue::new(s.value(), s.span())),
        other => Err(
            darling::Error::custom("expected a string literal: `name = \"create-zip\"`")
                .with_span(other),
        ),
    }
}

fn parse_impl(cx: &Ctxt, args: SagaArgs, item: syn::ItemImpl) -> Parsed {
    let Some((path, _)) = &item.trait_ else {
        return parse_inherent(cx, args, item);
    };
    cx.error_spanned_by(
        path,
        "`#[saga]` goes on an inherent `impl MySaga { .. }` block, not on a trait \
         implementation: it implements the `Saga` trait itself",
    );
    // Nothing else about this impl is worth reporting, but its steps are
    // read (quietly) so that the stand-in `Saga` impl gets their input and
    // output types and uses of the saga elsewhere add no errors.
    let quiet = Ctxt::new();
    let mut parsed = parse_inherent(&quiet, args, item);
    let _ = quiet.check();
    if let Parsed::Impl(saga) = &mut parsed {
        saga.misplaced = true;
    }
    parsed
}

fn parse_inherent(cx: &Ctxt, args: SagaArgs, mut item: syn::ItemImpl) -> Parsed {
    if item.unsafety.is_some() {
        cx.error_spanned_by(item.unsafety, "a `#[saga]` impl can't be `unsafe`");
    }

    // The impl's own attributes: `#[cancellable]` is ours; a method helper
    // here is misplaced.
    let mut cancellable = false;
    let mut kept = Vec::with_capacity(item.attrs.len());
    for attr in std::mem::take(&mut item.attrs) {
        match attr_name(&attr).as_deref() {
            Some("cancellable") => {
                if !matches!(attr.meta, Meta::Path(_)) {
                    cx.error_spanned_by(
                        &attr,
                        "`#[cancellable]` takes no arguments: write `#[cancellable]`",
                    );
                } else if cancellable {
                    cx.error_spanned_by(&attr, "`#[cancellable]` is given twice; keep one");
                }
                cancellable = true;
            }
            // There is no saga-wide limit: say where limits go instead.
            _ if limit::parse::is_limit(&attr) => limit::parse::misplaced(
                cx,
                std::slice::from_ref(&attr),
                Misplaced::Impl(Site::Step),
            ),
            Some(name) if is_method_helper(&attr) => cx.error_spanned_by(
                &attr,
                format!("`#[{name}]` goes on a method of this impl, not on the impl block itself"),
            ),
            _ => kept.push(attr),
        }
    }
    item.attrs = kept;

    let mut any_step_attr = false;
    let methods = walk_methods(
        &mut item,
        is_method_helper,
        |method, helpers| {
            any_step_attr |= helpers
                .iter()
                .any(|a| attr_name(a).as_deref() == Some("saga_step"));
            parse_method(cx, method, helpers)
        },
        |helpers| not_on_a_method(cx, helpers),
    );

    Parsed::Impl(Box::new(ParsedSaga {
        item,
        args,
        cancellable,
        methods,
        any_step_attr,
        misplaced: false,
    }))
}

fn not_on_a_method(cx: &Ctxt, helpers: Vec<Attribute>) {
    for attr in helpers {
        let name = attr_name(&attr).unwrap_or_default();
        cx.error_spanned_by(&attr, format!("`#[{name}]` goes on an `async fn` method"));
    }
}

/// One method's helper attributes, sorted by kind, duplicates reported.
#[derive(Default)]
struct MethodHelpers {
    saga_step: Option<Attribute>,
    compensate: Option<Attribute>,
    retry_policy: Option<Attribute>,
    compensation_retry_policy: Option<Attribute>,
    circuit_breaker: Option<Attribute>,
    /// Every `#[limit]`: several compose.
    limits: Vec<Attribute>,
}

fn parse_method(cx: &Ctxt, method: &ImplItemFn, attrs: Vec<Attribute>) -> Option<ParsedMethod> {
    let ident = &method.sig.ident;
    let mut helpers = MethodHelpers::default();
    for attr in attrs {
        if limit::parse::is_limit(&attr) {
            helpers.limits.push(attr);
            continue;
        }
        let name = attr_name(&attr).unwrap_or_default();
        let slot = match name.as_str() {
            "saga_step" => &mut helpers.saga_step,
            "compensate" => &mut helpers.compensate,
            "retry_policy" => &mut helpers.retry_policy,
            "compensation_retry_policy" => &mut helpers.compensation_retry_policy,
            _ => &mut helpers.circuit_breaker,
        };
        if slot.is_some() {
            cx.error_spanned_by(
                &attr,
                format!("`#[{name}]` is given twice on `{ident}`; keep one"),
            );
        } else {
            *slot = Some(attr);
        }
    }

    if let Some(step_attr) = &helpers.saga_step {
        if let Some(comp) = &helpers.compensate {
            cx.error_spanned_by(
                comp,
                format!(
                    "`{ident}` can't be both a step and a compensation: `#[saga_step]` and \
                     `#[compensate]` are on the same method; move the compensation into a \
                     method of its own"
                ),
            );
        }
        let StepArgs { order, timeout_ms } = parse_step_args(cx, step_attr);
        let sig = parse_signature(cx, method, Kind::Step);
        let retry = helpers
            .retry_policy
            .as_ref()
            .and_then(|a| parse_policy(cx, a, PolicyFor::Step));
        let compensation_retry = helpers
            .compensation_retry_policy
            .as_ref()
            .and_then(|a| parse_policy(cx, a, PolicyFor::Compensation));
        let breaker = helpers
            .circuit_breaker
            .as_ref()
            .and_then(|a| parse_breaker(cx, a));
        let param = limit::parse::first_param(method);
        let limits = limit::parse::parse_all(cx, &helpers.limits, Site::Step, param.as_ref());
        return Some(ParsedMethod {
            ident: ident.clone(),
            role: Role::Step(Box::new(StepAttrs {
                order,
                timeout_ms,
                sig,
                retry,
                compensation_retry,
                breaker,
                limits,
            })),
        });
    }

    // Not a step: the step-only attributes are misplaced.
    let compensation = helpers.compensate.as_ref().map(|attr| {
        let target = parse_compensate_target(cx, attr);
        (attr, target)
    });
    for (attr, name) in [
        (&helpers.retry_policy, "retry_policy"),
        (
            &helpers.compensation_retry_policy,
            "compensation_retry_policy",
        ),
        (&helpers.circuit_breaker, "circuit_breaker"),
    ] {
        let Some(attr) = attr else { continue };
        let fix = match (&compensation, name) {
            (Some((_, Some(step))), "retry_policy" | "compensation_retry_policy") => format!(
                "; a compensation's retries are set with `#[compensation_retry_policy(..)]` \
                 on its step `{step}`"
            ),
            _ => "; mark the method `#[saga_step(n)]` or remove the attribute".to_owned(),
        };
        cx.error_spanned_by(
            attr,
            format!("`#[{name}]` applies only to a `#[saga_step]` method, and `{ident}` is not a step{fix}"),
        );
    }
    let place = match &compensation {
        Some(_) => Misplaced::Compensation,
        None => Misplaced::NotAStep(ident),
    };
    limit::parse::misplaced(cx, &helpers.limits, place);

    let (_, target) = compensation?;
    let sig = parse_signature(cx, method, Kind::Compensation);
    Some(ParsedMethod {
        ident: ident.clone(),
        role: Role::Compensation(Box::new(CompensationAttrs { target, sig })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    /// `parse_step_args` on `attr`: the result and every error message.
    fn step_args(attr: Attribute) -> (StepArgs, Vec<String>) {
        let cx = Ctxt::new();
        let args = parse_step_args(&cx, &attr);
        let errors = match cx.check() {
            Ok(()) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        };
        (args, errors)
    }

    /// The one error `attr` gives.
    fn one_error(attr: Attribute) -> String {
        let (_, errors) = step_args(attr);
        assert_eq!(errors.len(), 1, "{errors:#?}");
        errors.into_iter().next().unwrap_or_default()
    }

    #[test]
    fn step_number_with_and_without_timeout() {
        let (args, errors) = step_args(parse_quote!(#[saga_step(2)]));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(args.order.as_deref().copied(), Some(2));
        assert_eq!(args.timeout_ms, None);

        let (args, errors) = step_args(parse_quote!(#[saga_step(1, timeout_ms = 30_000)]));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(args.order.as_deref().copied(), Some(1));
        assert_eq!(args.timeout_ms, Some(30_000));

        let (args, errors) = step_args(parse_quote!(#[saga_step(3, timeout_ms = 1u64,)]));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(args.timeout_ms, Some(1));

        let (args, errors) =
            step_args(parse_quote!(#[saga_step(1, timeout_ms = 18446744073709551615)]));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(args.timeout_ms, Some(u64::MAX));
    }

    #[test]
    fn timeout_values_that_are_not_positive_integers() {
        let zero = one_error(parse_quote!(#[saga_step(1, timeout_ms = 0)]));
        assert!(zero.starts_with("`timeout_ms = 0` would cancel every attempt"));
        assert!(zero.contains("`EngineBuilder::step_timeout`, 5 minutes"));

        // One literal when last, a negation when followed by a comma.
        for attr in [
            parse_quote!(#[saga_step(1, timeout_ms = -5)]),
            parse_quote!(#[saga_step(1, timeout_ms = -5,)]),
            parse_quote!(#[saga_step(1, timeout_ms = -(5))]),
        ] {
            let negative = one_error(attr);
            assert!(negative.starts_with("`timeout_ms` can't be negative"));
        }

        for (attr, what) in [
            (
                parse_quote!(#[saga_step(1, timeout_ms = "30s")]),
                "a string",
            ),
            (
                parse_quote!(#[saga_step(1, timeout_ms = 1.5)]),
                "a floating-point number",
            ),
            (
                parse_quote!(#[saga_step(1, timeout_ms = true)]),
                "a boolean",
            ),
        ] {
            let message = one_error(attr);
            assert!(
                message.contains(&format!("a whole number of milliseconds, not {what}")),
                "{message}"
            );
        }

        let path = one_error(parse_quote!(#[saga_step(1, timeout_ms = TIMEOUT)]));
        assert!(path.contains("can't evaluate constants"), "{path}");
        let call = one_error(parse_quote!(#[saga_step(1, timeout_ms = secs(30))]));
        assert!(call.contains("can't evaluate constants"), "{call}");

        let unit = one_error(parse_quote!(#[saga_step(1, timeout_ms = 30s)]));
        assert!(unit.contains("takes no unit"), "{unit}");

        let big = one_error(parse_quote!(#[saga_step(1, timeout_ms = 18446744073709551616)]));
        assert!(
            big.starts_with("`timeout_ms = 18446744073709551616` is out of range"),
            "{big}"
        );
        let huge = one_error(
            parse_quote!(#[saga_step(1, timeout_ms = 1_000_000_000_000_000_000_000_000_000_000_000_000_000)]),
        );
        assert!(huge.contains("is out of range"), "{huge}");
    }

    #[test]
    fn raw_values_as_written() {
        let attr: Attribute = parse_quote!(#[saga_step(1, x = 2, timeout_ms = -5_000, y = 3)]);
        let raw = raw_value(&attr, "timeout_ms").map(|t| t.to_string());
        assert_eq!(raw.as_deref(), Some("- 5_000"));
        assert!(raw_value(&attr, "z").is_none());
    }

    #[test]
    fn keys_of_saga_step() {
        let (args, errors) =
            step_args(parse_quote!(#[saga_step(1, timeout_ms = 5, timeout_ms = 6)]));
        assert_eq!(
            errors,
            ["`timeout_ms` is given twice in `#[saga_step]`; keep one"]
        );
        assert_eq!(args.timeout_ms, Some(5));

        let unknown = one_error(parse_quote!(#[saga_step(1, timout_ms = 5)]));
        assert!(unknown.contains("did you mean `timeout_ms`?"), "{unknown}");

        let bare = one_error(parse_quote!(#[saga_step(1, timeout_ms)]));
        assert_eq!(bare, "write `timeout_ms = value` in `#[saga_step]`");
    }

    #[test]
    fn the_number_comes_first() {
        let (args, errors) = step_args(parse_quote!(#[saga_step(timeout_ms = 5)]));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("`#[saga_step]` needs the step's number before"));
        assert_eq!(args.timeout_ms, Some(5));

        let (args, errors) = step_args(parse_quote!(#[saga_step(timeout_ms = 5, 2)]));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("the step's number goes first"));
        assert_eq!(args.order.as_deref().copied(), Some(2));
        assert_eq!(args.timeout_ms, Some(5));

        let extra = one_error(parse_quote!(#[saga_step(1, 2)]));
        assert!(extra.starts_with("`#[saga_step]` takes the step's number, then optional"));

        let word = one_error(parse_quote!(#[saga_step(first)]));
        assert_eq!(
            word,
            "expected the step's number as an integer literal, e.g. `#[saga_step(1)]`"
        );
    }

    /// `parse_saga_args` on `args`: the version and every error message.
    fn saga_version(args: TokenStream) -> (Option<u32>, Vec<String>) {
        let cx = Ctxt::new();
        let parsed = parse_saga_args(&cx, args);
        let errors = match cx.check() {
            Ok(()) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        };
        (parsed.version, errors)
    }

    #[test]
    fn a_version_that_is_not_whole_shows_one_that_is() {
        assert_eq!(saga_version(quote::quote!(version = 3)), (Some(3), vec![]));
        let cases = [
            (
                quote::quote!(version = 1.5),
                "`version = 1.5` is not a whole number",
            ),
            (quote::quote!(version = 1.5), "write e.g. `version = 2`"),
            (quote::quote!(version = 2.0), "write e.g. `version = 2`"),
            (quote::quote!(version = 0.5), "write e.g. `version = 1`"),
            (
                quote::quote!(version = "2"),
                "not a string: write `version = 2`",
            ),
        ];
        for (args, expected) in cases {
            let text = args.to_string();
            let (version, errors) = saga_version(args);
            assert_eq!(version, None, "{text}");
            assert_eq!(errors.len(), 1, "{text}: {errors:?}");
            assert!(errors[0].contains(expected), "{text}: {errors:?}");
        }
    }
}
