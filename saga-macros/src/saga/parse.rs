//! Attributes and signatures -> typed structs.
//!
//! Everything that can be judged by looking at one attribute or one method
//! is judged here: key names and value ranges, the shape of a step's
//! signature, which helper attributes may be combined on one method. Rules
//! that relate several methods live in `check.rs`.
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
    Attribute, Expr, FnArg, GenericArgument, Ident, ImplItem, ImplItemFn, Lit, Meta, PathArguments,
    ReceiverKind, ReturnType, Type,
};

use super::vocab::{Backoff, BreakerScope, OnExhausted, WhenOpen};
use crate::attr_args::{
    choice, key_values, last_segment, last_segment_is, name_value, path_str, runtime_path,
};
use crate::ctxt::Ctxt;
use crate::helpers::{attr_name, is_method_helper};
use crate::limit::{
    self,
    model::{Limit, Site},
    parse::Misplaced,
};
use crate::types::type_to_string;

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

    let mut methods = Vec::new();
    let mut any_step_attr = false;
    for impl_item in &mut item.items {
        match impl_item {
            ImplItem::Fn(method) => {
                let helpers = take_helpers(&mut method.attrs);
                any_step_attr |= helpers
                    .iter()
                    .any(|a| attr_name(a).as_deref() == Some("saga_step"));
                if let Some(parsed) = parse_method(cx, method, helpers) {
                    methods.push(parsed);
                }
            }
            ImplItem::Const(c) => not_on_a_method(cx, take_helpers(&mut c.attrs)),
            ImplItem::Type(t) => not_on_a_method(cx, take_helpers(&mut t.attrs)),
            ImplItem::Macro(m) => not_on_a_method(cx, take_helpers(&mut m.attrs)),
            _ => {}
        }
    }

    Parsed::Impl(Box::new(ParsedSaga {
        item,
        args,
        cancellable,
        methods,
        any_step_attr,
        misplaced: false,
    }))
}

/// Removes our helper attributes, returning them in source order.
fn take_helpers(attrs: &mut Vec<Attribute>) -> Vec<Attribute> {
    let (helpers, kept) = std::mem::take(attrs)
        .into_iter()
        .partition(is_method_helper);
    *attrs = kept;
    helpers
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

/// The arguments of `#[name(..)]`, or an error saying what it should look
/// like if the attribute has none.
fn list_args(cx: &Ctxt, attr: &Attribute, needs: &str, example: &str) -> Option<Vec<NestedMeta>> {
    let name = attr_name(attr).unwrap_or_default();
    let missing = || cx.error_spanned_by(attr, format!("`#[{name}]` needs {needs}: `{example}`"));
    match &attr.meta {
        Meta::List(list) => match NestedMeta::parse_meta_list(list.tokens.clone()) {
            Ok(items) if items.is_empty() => {
                missing();
                None
            }
            Ok(items) => Some(items),
            Err(err) => {
                cx.syn_error(err);
                None
            }
        },
        _ => {
            missing();
            None
        }
    }
}

/// `#[saga_step(n)]` or `#[saga_step(n, timeout_ms = ..)]`: the number
/// first, then `key = value` settings.
fn parse_step_args(cx: &Ctxt, attr: &Attribute) -> StepArgs {
    let example = "#[saga_step(1)]";
    let Some(items) = list_args(cx, attr, "the step's number", example) else {
        return StepArgs::default();
    };
    let is_setting = |item: &NestedMeta| {
        matches!(
            item,
            NestedMeta::Meta(Meta::NameValue(_)) | NestedMeta::NameValueInvalidExpr(_)
        )
    };
    // Settings written before the number: the number is either missing or
    // misplaced, and the integer literal after them (if any) is taken as it.
    let late_number = if is_setting(&items[0]) {
        let late = items
            .iter()
            .position(|item| matches!(item, NestedMeta::Lit(Lit::Int(_))));
        if late.is_none() {
            cx.error_spanned_by(
                &items[0],
                "`#[saga_step]` needs the step's number before its settings: \
                 `#[saga_step(1, timeout_ms = 30_000)]`",
            );
        }
        late
    } else {
        Some(0)
    };
    let mut number = None;
    let mut settings = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        if Some(i) == late_number {
            if i > 0 {
                cx.error_spanned_by(
                    &item,
                    "the step's number goes first, before the settings: \
                     `#[saga_step(1, timeout_ms = 30_000)]`",
                );
            }
            number = Some(item);
        } else if matches!(item, NestedMeta::Lit(_)) {
            cx.error_spanned_by(
                &item,
                "`#[saga_step]` takes the step's number, then optional `key = value` \
                 settings: `#[saga_step(1)]` or `#[saga_step(1, timeout_ms = 30_000)]`",
            );
        } else {
            settings.push(item);
        }
    }
    let order = number.and_then(|item| parse_step_number(cx, &item));
    let keys = key_values(cx, "saga_step", &["timeout_ms"], &[], settings);
    let timeout_ms = keys
        .get("timeout_ms")
        .and_then(name_value)
        .and_then(|expr| timeout_ms(cx, expr, raw_value(attr, "timeout_ms")));
    StepArgs { order, timeout_ms }
}

/// The tokens after the first `key =` in `#[name(..)]`, up to the next
/// comma, as written: syn reads `-5` as one literal spanning only the `-`,
/// and an error about the value should underline all of it.
fn raw_value(attr: &Attribute, key: &str) -> Option<TokenStream> {
    use proc_macro2::TokenTree;
    let Meta::List(list) = &attr.meta else {
        return None;
    };
    let tokens: Vec<TokenTree> = list.tokens.clone().into_iter().collect();
    let mut args = tokens.split(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ','));
    args.find_map(|arg| match arg {
        [TokenTree::Ident(k), TokenTree::Punct(eq), value @ ..]
            if k == key && eq.as_char() == '=' && !value.is_empty() =>
        {
            Some(value.iter().cloned().collect())
        }
        _ => None,
    })
}

/// What `#[saga_step(..)]` says, as far as it is valid.
#[derive(Default)]
struct StepArgs {
    order: Option<SpannedValue<u32>>,
    timeout_ms: Option<u64>,
}

fn parse_step_number(cx: &Ctxt, item: &NestedMeta) -> Option<SpannedValue<u32>> {
    let number = match item {
        NestedMeta::Lit(lit @ Lit::Int(_)) => UInt::from_value(lit),
        other => {
            cx.error_spanned_by(
                other,
                "expected the step's number as an integer literal, e.g. `#[saga_step(1)]`",
            );
            return None;
        }
    };
    let number = match number {
        Ok(n) => n,
        Err(err) => {
            cx.darling_error(err);
            return None;
        }
    };
    let span = item.span();
    match u32::try_from(number.0) {
        Ok(0) => {
            cx.error_at(
                span,
                "step numbers start at 1: number the steps 1, 2, 3, ...",
            );
            None
        }
        Ok(n) => Some(SpannedValue::new(n, span)),
        Err(_) => {
            cx.error_at(
                span,
                format!(
                    "step number `{}` is out of range: number the steps 1, 2, 3, ... (at most {})",
                    number.0,
                    u32::MAX
                ),
            );
            None
        }
    }
}

/// The value of `timeout_ms = ..`: a positive integer literal, in
/// milliseconds.
///
/// `raw` is the value as written, for the one error whose span syn does
/// not keep whole.
fn timeout_ms(cx: &Ctxt, expr: &Expr, raw: Option<TokenStream>) -> Option<u64> {
    const DEFAULT: &str = "or remove `timeout_ms` to use the engine's default \
                           (`EngineBuilder::step_timeout`, 5 minutes)";
    let int = match expr {
        Expr::Group(group) => return timeout_ms(cx, &group.expr, None),
        // syn reads `-5` as one literal; `-(5)` or `-N` is an expression.
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(int), ..
        }) if !int.base10_digits().starts_with('-') => int,
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(_), ..
        })
        | Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            ..
        }) => {
            cx.error_spanned_by(
                raw.unwrap_or_else(|| expr.to_token_stream()),
                format!(
                    "`timeout_ms` can't be negative: give how long one attempt may run as a \
                     positive number of milliseconds, e.g. `timeout_ms = 30_000`, {DEFAULT}"
                ),
            );
            return None;
        }
        Expr::Lit(syn::ExprLit { lit, .. }) => {
            let what = match lit {
                Lit::Str(_) | Lit::ByteStr(_) | Lit::CStr(_) => "a string",
                Lit::Float(_) => "a floating-point number",
                Lit::Bool(_) => "a boolean",
                Lit::Char(_) | Lit::Byte(_) => "a character",
                _ => "this literal",
            };
            cx.error_spanned_by(
                expr,
                format!(
                    "`timeout_ms` is a whole number of milliseconds, not {what}: write e.g. \
                     `timeout_ms = 30_000` for 30 seconds"
                ),
            );
            return None;
        }
        other => {
            cx.error_spanned_by(
                other,
                "`timeout_ms` needs the number of milliseconds written as an integer literal, \
                 e.g. `timeout_ms = 30_000`: the macro reads it at compile time and can't \
                 evaluate constants or expressions",
            );
            return None;
        }
    };
    const INTEGER_TYPES: &[&str] = &[
        "", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize",
    ];
    if !INTEGER_TYPES.contains(&int.suffix()) {
        cx.error_spanned_by(
            int,
            format!(
                "`timeout_ms` is in milliseconds and takes no unit: write \
                 `timeout_ms = 30_000` for 30 seconds, not `{int}`"
            ),
        );
        return None;
    }
    match int.base10_parse::<u64>() {
        Ok(0) => {
            cx.error_spanned_by(
                int,
                format!(
                    "`timeout_ms = 0` would cancel every attempt before it could succeed: give \
                     how long one attempt may run as a positive number of milliseconds, e.g. \
                     `timeout_ms = 30_000`, {DEFAULT}"
                ),
            );
            None
        }
        Ok(ms) => Some(ms),
        Err(_) => {
            cx.error_spanned_by(
                int,
                format!(
                    "`timeout_ms = {}` is out of range: give how long one attempt may run in \
                     milliseconds, at most {}",
                    int.base10_digits(),
                    u64::MAX
                ),
            );
            None
        }
    }
}

fn parse_compensate_target(cx: &Ctxt, attr: &Attribute) -> Option<Ident> {
    let example = "#[compensate(step_method)]";
    let items = list_args(cx, attr, "the step it undoes", example)?;
    let message = "`#[compensate]` names the one step it undoes: `#[compensate(step_method)]`";
    if items.len() > 1 {
        cx.error_spanned_by(&items[1], message);
        return None;
    }
    match &items[0] {
        NestedMeta::Meta(Meta::Path(path)) if path.get_ident().is_some() => {
            path.get_ident().cloned()
        }
        other => {
            cx.error_spanned_by(other, message);
            None
        }
    }
}

// ---------------------------------------------------------------------------
// Key-value attributes

/// One required key reported missing, with an example value to paste.
fn report_missing(cx: &Ctxt, attr: &Attribute, missing: &[(&str, &str)]) {
    if missing.is_empty() {
        return;
    }
    let name = attr_name(attr).unwrap_or_default();
    let keys: Vec<_> = missing.iter().map(|(k, _)| format!("`{k}`")).collect();
    let examples: Vec<_> = missing.iter().map(|(_, e)| *e).collect();
    cx.error_spanned_by(
        attr,
        format!(
            "`#[{name}]` is missing {}: add `{}`",
            keys.join(" and "),
            examples.join(", ")
        ),
    );
}

/// A non-negative integer literal, before its range is checked against the
/// key's type (so that an overflow gets a message naming the key's range
/// instead of a bare parse error).
struct UInt(u128);

impl FromMeta for UInt {
    fn from_value(lit: &Lit) -> darling::Result<Self> {
        match lit {
            Lit::Int(int) => int
                .base10_parse::<u128>()
                .map(UInt)
                .map_err(|_| darling::Error::custom("this number is too large").with_span(int)),
            other => Err(darling::Error::custom("expected an integer, e.g. `3`").with_span(other)),
        }
    }

    fn from_expr(expr: &Expr) -> darling::Result<Self> {
        match expr {
            Expr::Lit(lit) => Self::from_value(&lit.lit),
            Expr::Group(group) => Self::from_expr(&group.expr),
            Expr::Unary(syn::ExprUnary {
                op: syn::UnOp::Neg(_),
                ..
            }) => Err(darling::Error::custom("expected a non-negative integer").with_span(expr)),
            other => Err(
                darling::Error::custom("expected an integer literal, e.g. `3`").with_span(other),
            ),
        }
    }
}

/// `-5`, whether it reached us as a negation or (from another macro) as one
/// literal token: either way `u128` parsing would call it "too large".
fn is_negative(expr: &Expr) -> bool {
    match expr {
        Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            ..
        }) => true,
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(int), ..
        }) => int.base10_digits().starts_with('-'),
        Expr::Group(group) => is_negative(&group.expr),
        _ => false,
    }
}

/// Reads `key = <integer>` and checks `min..=max`.
fn int_key(
    cx: &Ctxt,
    meta: &Meta,
    min: u128,
    max: u128,
    why_min: &str,
) -> Option<SpannedValue<u128>> {
    let key = path_str(meta.path());
    let expr = name_value(meta)?;
    if is_negative(expr) {
        cx.error_spanned_by(
            expr,
            format!("`{key}` cannot be negative: write a whole number, {min} or more"),
        );
        return None;
    }
    let value = match SpannedValue::<UInt>::from_expr(expr) {
        Ok(v) => v,
        Err(err) => {
            cx.darling_error(err);
            return None;
        }
    };
    let n = value.0;
    if n < min {
        cx.error_at(
            value.span(),
            format!("`{key}` must be at least {min}{why_min}"),
        );
        return None;
    }
    if n > max {
        cx.error_at(
            value.span(),
            format!("`{key} = {n}` is out of range: it must be at most {max}"),
        );
        return None;
    }
    Some(SpannedValue::new(n, value.span()))
}

/// `jitter` or `jitter = true|false`.
fn flag(cx: &Ctxt, meta: &Meta) -> Option<bool> {
    match meta {
        Meta::Path(_) => Some(true),
        Meta::NameValue(nv) => match &nv.value {
            Expr::Lit(syn::ExprLit {
                lit: Lit::Bool(b), ..
            }) => Some(b.value),
            other => {
                cx.error_spanned_by(
                    other,
                    "`jitter` is a flag: write `jitter`, `jitter = true` or `jitter = false`",
                );
                None
            }
        },
        Meta::List(_) => None,
    }
}

/// The backoff of a policy that does not name one: Temporal's and
/// Restate's choice (Polly's is constant), and what most transient faults
/// (an overloaded service, a failover) want.
const DEFAULT_BACKOFF: Backoff = Backoff::Exponential;

/// The first delay of a policy that does not give one: Temporal's initial
/// interval (Polly waits 2 s, Restate 50 ms); long enough for a restarting
/// dependency, short enough not to be noticed.
const DEFAULT_BASE_DELAY_MS: u64 = 1000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum PolicyFor {
    Step,
    Compensation,
}

fn parse_policy(cx: &Ctxt, attr: &Attribute, policy_for: PolicyFor) -> Option<PolicyArgs> {
    let name = attr_name(attr).unwrap_or_default();
    let example = format!("#[{name}(max_retries = 3, backoff = exponential, base_delay_ms = 200)]");
    let items = list_args(cx, attr, "its settings", &example)?;
    let known: &[&str] = match policy_for {
        PolicyFor::Step => &[
            "max_retries",
            "backoff",
            "base_delay_ms",
            "max_delay_ms",
            "jitter",
            "on_exhausted",
        ],
        PolicyFor::Compensation => &[
            "max_retries",
            "backoff",
            "base_delay_ms",
            "max_delay_ms",
            "jitter",
        ],
    };
    // `on_exhausted` gets its own explanation rather than "unknown key".
    let items = items
        .into_iter()
        .filter(|item| {
            let is_on_exhausted =
                matches!(item, NestedMeta::Meta(m) if m.path().is_ident("on_exhausted"));
            if is_on_exhausted && policy_for == PolicyFor::Compensation {
                cx.error_spanned_by(
                    item,
                    "`on_exhausted` does not apply to a compensation: one that still fails \
                     after its retries always ends the task `CompensationFailed` for an \
                     operator to resolve; remove it",
                );
                return false;
            }
            true
        })
        .collect();
    let errors_before = cx.error_count();
    let keys = key_values(cx, &name, known, &["jitter"], items);
    let malformed = cx.error_count() > errors_before;

    let mut missing = Vec::new();
    let max_retries = match keys.get("max_retries") {
        Some(m) => int_key(cx, m, 0, u32::MAX.into(), ""),
        None => {
            missing.push(("max_retries", "max_retries = 3"));
            None
        }
    };
    let backoff = match keys.get("backoff") {
        Some(m) => choice(
            cx,
            m,
            "backoff",
            &[
                ("exponential", Backoff::Exponential),
                ("linear", Backoff::Linear),
                ("constant", Backoff::Constant),
            ],
        ),
        None => Some(DEFAULT_BACKOFF),
    };
    let base_delay_ms = match keys.get("base_delay_ms") {
        Some(m) => int_key(cx, m, 0, u64::MAX.into(), ""),
        None => Some(SpannedValue::new(
            DEFAULT_BASE_DELAY_MS.into(),
            Span::call_site(),
        )),
    };
    // A missing key is only worth reporting if the key was not just
    // misspelled (which is already reported, with a suggestion).
    if !malformed {
        report_missing(cx, attr, &missing);
    }
    let max_delay_ms = keys
        .get("max_delay_ms")
        .map(|m| int_key(cx, m, 0, u64::MAX.into(), ""));
    if let (Some(Some(max)), Some(base)) = (&max_delay_ms, &base_delay_ms) {
        if **max < **base {
            let base = match keys.get("base_delay_ms") {
                Some(_) => format!("`base_delay_ms = {}`", **base),
                None => format!("the default `base_delay_ms` ({DEFAULT_BASE_DELAY_MS} ms)"),
            };
            cx.error_at(
                max.span(),
                format!(
                    "`max_delay_ms = {}` is below {base}: every delay would be capped below \
                     the base; raise `max_delay_ms` or lower `base_delay_ms`",
                    **max
                ),
            );
        }
    }
    let jitter = keys.get("jitter").map(|m| flag(cx, m));
    let on_exhausted = keys.get("on_exhausted").map(|m| {
        choice(
            cx,
            m,
            "on_exhausted action",
            &[
                ("compensate", OnExhausted::Compensate),
                ("fail", OnExhausted::Fail),
                ("dead_letter", OnExhausted::DeadLetter),
            ],
        )
    });

    Some(PolicyArgs {
        attr: attr.to_token_stream(),
        max_retries: u32::try_from(*max_retries?).ok()?,
        backoff: backoff?,
        base_delay_ms: u64::try_from(*base_delay_ms?).ok()?,
        max_delay_ms: match max_delay_ms {
            Some(v) => Some(u64::try_from(*v?).ok()?),
            None => None,
        },
        jitter: match jitter {
            Some(v) => Some(v?),
            None => None,
        },
        on_exhausted: match on_exhausted {
            Some(v) => Some(v?),
            None => None,
        },
    })
}

fn parse_breaker(cx: &Ctxt, attr: &Attribute) -> Option<BreakerArgs> {
    let example = "#[circuit_breaker(failure_threshold = 5, duration_secs = 30)]";
    let items = list_args(cx, attr, "its settings", example)?;
    let errors_before = cx.error_count();
    let keys = key_values(
        cx,
        "circuit_breaker",
        &["failure_threshold", "duration_secs", "scope", "when_open"],
        &[],
        items,
    );
    let scope = keys.get("scope").map(|m| {
        choice(
            cx,
            m,
            "breaker scope",
            &[
                ("process", BreakerScope::Process),
                ("shared", BreakerScope::Shared),
            ],
        )
    });
    let when_open = keys.get("when_open").map(|m| {
        choice(
            cx,
            m,
            "`when_open` action",
            &[("fail", WhenOpen::Fail), ("wait", WhenOpen::Wait)],
        )
    });
    let malformed = cx.error_count() > errors_before;
    let mut missing = Vec::new();
    let failure_threshold = match keys.get("failure_threshold") {
        Some(m) => int_key(
            cx,
            m,
            1,
            u32::MAX.into(),
            ": it is the number of consecutive failures that opens the circuit",
        ),
        None => {
            missing.push(("failure_threshold", "failure_threshold = 5"));
            None
        }
    };
    let duration_secs = match keys.get("duration_secs") {
        Some(m) => int_key(
            cx,
            m,
            1,
            u64::MAX.into(),
            ": it is how long the circuit stays open before a probe call",
        ),
        None => {
            missing.push(("duration_secs", "duration_secs = 30"));
            None
        }
    };
    if !malformed {
        report_missing(cx, attr, &missing);
    }
    Some(BreakerArgs {
        failure_threshold: u32::try_from(*failure_threshold?).ok()?,
        duration_secs: u64::try_from(*duration_secs?).ok()?,
        scope: match scope {
            Some(v) => Some(v?),
            None => None,
        },
        when_open: match when_open {
            Some(v) => Some(v?),
            None => None,
        },
    })
}

// ---------------------------------------------------------------------------
// Signatures

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Step,
    Compensation,
}

impl Kind {
    fn noun(self) -> &'static str {
        match self {
            Kind::Step => "step",
            Kind::Compensation => "compensation",
        }
    }

    fn shape(self, name: &Ident) -> String {
        match self {
            Kind::Step => format!(
                "`async fn {name}(&self, input: In) -> Result<Out, StepError>` \
                 (optionally with `ctx: &StepContext` after the input)"
            ),
            Kind::Compensation => format!(
                "`async fn {name}(&self, output: StepOut) -> Result<(), StepError>` \
                 (optionally with `ctx: &StepContext` after the output)"
            ),
        }
    }
}

fn parse_signature(cx: &Ctxt, method: &ImplItemFn, kind: Kind) -> Signature {
    let sig = &method.sig;
    let name = &sig.ident;
    let noun = kind.noun();

    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        let generics = &sig.generics;
        let where_clause = &generics.where_clause;
        cx.error_spanned_by(
            quote::quote!(#generics #where_clause),
            format!(
                "a {noun} can't be generic: the engine calls `{name}` with the types the \
                 task persisted; use concrete types"
            ),
        );
    }
    if sig.asyncness.is_none() {
        cx.error_spanned_by(
            sig.fn_token,
            format!("a {noun} must be an `async fn`: write `async fn {name}(..)`"),
        );
    }
    if let syn::Safety::Unsafe(token) = &sig.safety {
        cx.error_spanned_by(
            token,
            format!(
                "a {noun} can't be `unsafe`: the generated code calls it like any safe method; \
                 remove `unsafe` and use an `unsafe` block inside"
            ),
        );
    }

    // The receiver.
    let mut inputs: Vec<&FnArg> = sig.inputs.iter().collect();
    match inputs.first() {
        Some(FnArg::Receiver(receiver)) => {
            let problem = match &receiver.kind {
                ReceiverKind::Reference(_, _, None) if receiver.mutability.is_none() => None,
                ReceiverKind::Reference(_, _, Some(_)) => Some(
                    "takes `&self`, not `&mut self`: the steps of many tasks run concurrently \
                     on one shared saga value (use interior mutability for state)",
                ),
                ReceiverKind::Value => Some(
                    "takes `&self`, not `self`: the engine keeps the saga value and calls its \
                     methods many times",
                ),
                _ => Some("takes plain `&self`"),
            };
            if let Some(problem) = problem {
                cx.error_spanned_by(receiver, format!("a {noun} {problem}"));
            }
            inputs.remove(0);
        }
        _ => {
            let at = match inputs.first() {
                Some(first) => first.to_token_stream(),
                None => name.to_token_stream(),
            };
            cx.error_spanned_by(
                at,
                format!(
                    "a {noun} needs `&self` as its first parameter: {}",
                    kind.shape(name)
                ),
            );
        }
    }

    // Parameters: `(input)` or `(input, ctx: &StepContext)`.
    let params: Vec<&syn::PatType> = inputs
        .iter()
        .filter_map(|arg| match arg {
            FnArg::Typed(t) => Some(t),
            FnArg::Receiver(_) => None,
        })
        .collect();
    let what_input = match kind {
        Kind::Step => "its input",
        Kind::Compensation => "the step's output",
    };
    let mut input = None;
    let mut takes_ctx = false;
    match params.as_slice() {
        [] => cx.error_at(
            sig.paren_token.span.join(),
            format!(
                "`{name}` has no parameter for {what_input}: {}",
                kind.shape(name)
            ),
        ),
        [only] if is_step_context(&only.ty) => cx.error_spanned_by(
            only,
            format!(
                "`{name}` has no parameter for {what_input} (this one is the context, which \
                 comes second): {}",
                kind.shape(name)
            ),
        ),
        [first, rest @ ..] if rest.len() > 1 => {
            let extra = &rest[1];
            cx.error_spanned_by(
                extra,
                format!(
                    "`{name}` has too many parameters: a {noun} takes {what_input} and, \
                     optionally, `ctx: &StepContext`; pass several values as one struct or tuple"
                ),
            );
            input = by_value_input(cx, first, kind);
        }
        [first, rest @ ..] => {
            if let Some(second) = rest.first() {
                if is_step_context(&second.ty) {
                    takes_ctx = true;
                } else {
                    cx.error_spanned_by(
                        &second.ty,
                        format!(
                            "the second parameter of a {noun} must be the context, \
                             `ctx: &StepContext`; a {noun} takes a single {}, so pass several \
                             values as one struct or tuple",
                            match kind {
                                Kind::Step => "input",
                                Kind::Compensation => "output",
                            }
                        ),
                    );
                }
            }
            input = by_value_input(cx, first, kind);
        }
    }

    // The return type.
    let output = parse_return(cx, sig, kind);
    Signature {
        input,
        output,
        takes_ctx,
    }
}

fn by_value_input(cx: &Ctxt, param: &syn::PatType, kind: Kind) -> Option<Type> {
    let what = match kind {
        Kind::Step => "a step's input",
        Kind::Compensation => "the step output a compensation receives",
    };
    match &*param.ty {
        Type::Reference(r) => {
            let inner = &r.elem;
            cx.error_spanned_by(
                &param.ty,
                format!(
                    "{what} is passed by value (it is deserialized from the task's stored \
                     state): take `{}`, not a reference",
                    type_to_string(inner)
                ),
            );
            None
        }
        Type::ImplTrait(_) => {
            cx.error_spanned_by(
                &param.ty,
                format!("{what} needs a concrete type (it is deserialized from the task's stored state), not `impl Trait`"),
            );
            None
        }
        ty => Some(ty.clone()),
    }
}

/// `&StepContext`, by the last segment of its path.
fn is_step_context(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) if r.mutability.is_none() => last_segment_is(&r.elem, "StepContext"),
        Type::Group(g) => is_step_context(&g.elem),
        _ => false,
    }
}

/// `T` of a `Result<T, StepError>` return type; anything else is reported.
fn parse_return(cx: &Ctxt, sig: &syn::Signature, kind: Kind) -> Option<Type> {
    let name = &sig.ident;
    let noun = kind.noun();
    let expected = match kind {
        Kind::Step => "Result<Out, StepError>",
        Kind::Compensation => "Result<(), StepError>",
    };
    let ty = match &sig.output {
        ReturnType::Type(_, ty) => ty,
        ReturnType::Default => {
            cx.error_at(
                sig.paren_token.span.close(),
                format!(
                    "a {noun} must return `{expected}`: add `-> {expected}` after `{name}(..)`"
                ),
            );
            return None;
        }
    };
    let segment = last_segment(ty).filter(|s| s.ident == "Result");
    let args: Vec<&Type> = match segment.map(|s| &s.arguments) {
        Some(PathArguments::AngleBracketed(args)) => args
            .args
            .iter()
            .filter_map(|a| match a {
                GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let (ok, err) = match (segment, args.as_slice()) {
        (Some(_), [ok, err]) => (*ok, *err),
        (Some(_), _) => {
            cx.error_spanned_by(
                ty,
                format!(
                    "a {noun} must return `{expected}` with both type arguments written out: \
                     the macro reads the {} and the error type from it",
                    match kind {
                        Kind::Step => "output type",
                        Kind::Compensation => "unit output",
                    }
                ),
            );
            return None;
        }
        (None, _) => {
            cx.error_spanned_by(
                ty,
                format!(
                    "a {noun} must return `{expected}`, not `{}`: the engine tells failures \
                     (retried, then compensated) from outputs",
                    type_to_string(ty)
                ),
            );
            return None;
        }
    };
    if !last_segment_is(err, "StepError") {
        cx.error_spanned_by(
            err,
            format!(
                "the error type of a {noun} must be `StepError`, not `{}`: `?` converts any \
                 `std::error::Error + Send + Sync + 'static` into a transient `StepError`, \
                 and `StepError::permanent(e)` skips the retries",
                type_to_string(err)
            ),
        );
    }
    match kind {
        Kind::Step if matches!(ok, Type::Reference(_)) => {
            cx.error_spanned_by(
                ok,
                "a step's output is stored with the task and becomes the next step's input: \
                 return an owned type, not a reference",
            );
            None
        }
        Kind::Step => Some(ok.clone()),
        Kind::Compensation => {
            let is_unit = matches!(ok, Type::Tuple(t) if t.elems.is_empty());
            if !is_unit {
                cx.error_spanned_by(
                    ok,
                    format!(
                        "a compensation returns `Result<(), StepError>`, not `{}`: it undoes \
                         its step and has no output",
                        type_to_string(ok)
                    ),
                );
            }
            None
        }
    }
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
