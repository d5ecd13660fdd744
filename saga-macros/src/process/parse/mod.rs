//! `#[process_manager]` attributes and handler signatures -> typed structs.
//!
//! Everything that can be judged from one attribute or one method is judged
//! here: the `#[process_manager(..)]` keys, which helper attributes may be
//! combined on a method, the shape of a handler's and of `#[on_error]`'s
//! signature, the syntax of `#[correlate(..)]`. Rules relating several
//! methods live in `check.rs`.
//!
//! This file walks the item and its methods (`crate::item::walk_methods`,
//! shared with `#[saga]`); `args.rs` reads `#[process_manager(..)]`,
//! `signature.rs` a handler's signature, `correlate.rs` `#[correlate]`.
//!
//! As in `saga/parse/`, every function reports into the [`Ctxt`] and
//! returns what it could still make sense of, with `None` for the rest, so
//! that later stages stay quiet about what follows from a reported mistake.

use darling::ast::NestedMeta;
use darling::util::SpannedValue;
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::parse::discouraged::Speculative;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{
    Attribute, Expr, FnArg, GenericArgument, Ident, ImplItem, ImplItemFn, Lit, Member, Meta, Pat,
    PathArguments, ReceiverKind, ReturnType, Type,
};

use super::vocab::{Concurrency, OnComplete};
use crate::attr_args::{
    choice, key_values, last_segment, last_segment_is, name_value, runtime_path,
};
use crate::ctxt::Ctxt;
use crate::item::walk_methods;
use crate::limit::{
    self,
    model::{Limit, Site},
    parse::Misplaced,
};
use crate::types::{same_type, type_to_string};

mod args;
mod correlate;
mod signature;
use args::*;
use correlate::*;
use signature::*;

/// The helper attributes `#[process_manager]` reads from its methods.
pub const HELPERS: [&str; 6] = [
    "starts",
    "handles",
    "correlate",
    "timeout",
    "on_error",
    "limit",
];

/// The helper an attribute is, if it is one of ours: `#[starts]`, or written
/// through the crate (`#[saga_runtime::starts]`). A `timeout` attribute of
/// some other crate (`#[other::timeout(..)]`) is not ours.
pub fn helper_name(attr: &Attribute) -> Option<&'static str> {
    let segments = &attr.path().segments;
    let last = segments.last()?;
    let ours = segments.len() == 1 || segments.first().is_some_and(|s| s.ident == "saga_runtime");
    if !ours {
        return None;
    }
    HELPERS.iter().copied().find(|h| last.ident == h)
}

pub fn is_helper(attr: &Attribute) -> bool {
    helper_name(attr).is_some()
}

/// What `#[process_manager]` was put on.
pub enum Parsed {
    Impl(Box<ParsedProcess>),
    /// Anything else (already reported); re-emitted as is.
    Other(TokenStream),
}

pub struct ParsedProcess {
    /// The impl block with every helper attribute removed.
    pub item: syn::ItemImpl,
    pub args: ProcessArgs,
    pub methods: Vec<ParsedMethod>,
    /// Whether any method carries `#[starts]`, `#[handles]` or `#[timeout]`
    /// (valid or not): decides whether "has no handlers" is news.
    pub any_handler_attr: bool,
    /// Whether any method carries `#[starts]` (valid or not).
    pub any_starts_attr: bool,
}

/// `#[process_manager(name = "..", state = S, on_complete = .., concurrency = ..)]`.
#[derive(Default)]
pub struct ProcessArgs {
    pub name: Option<SpannedValue<String>>,
    pub state: Option<Type>,
    pub on_complete: Option<OnComplete>,
    pub concurrency: Option<Concurrency>,
    pub runtime: Option<syn::Path>,
}

pub struct ParsedMethod {
    pub ident: Ident,
    /// The `#[starts]`/`#[handles]`/`#[timeout]`/`#[on_error]` attribute,
    /// for errors about the method's role.
    pub attr: Attribute,
    pub role: Role,
}

pub enum Role {
    Handler(Box<HandlerAttrs>),
    OnError,
}

/// `#[starts]`, `#[handles]` or `#[timeout]`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Starts {
        strict: bool,
    },
    Handles {
        strict: bool,
        many: bool,
        unmatched: Unmatched,
    },
    Timeout,
}

/// `#[handles(hold = "..", then = ..)]`: what becomes of a message that
/// finds no instance (`None`: the engine's setting).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Unmatched {
    /// How long it is held, in ms.
    pub hold_ms: Option<u64>,
    /// `then = dead_letter` (`true`) or `then = drop` (`false`).
    pub dead_letter: Option<bool>,
}

pub struct HandlerAttrs {
    pub kind: Kind,
    /// The message parameter's type; `None` if the signature is wrong there.
    pub message: Option<Type>,
    /// `S` in the state parameter `&mut S`, as written (an alias or a path
    /// is judged by the compiler); `None` if the signature is wrong there.
    pub state: Option<Type>,
    pub correlate: Option<CorrelateArgs>,
    /// `#[limit(..)]`, the valid ones.
    pub limits: Vec<Limit>,
}

/// `#[correlate(state.<state_field> = msg.<message_field>)]`.
pub struct CorrelateArgs {
    pub state_field: Member,
    pub message_field: Member,
}

// ---------------------------------------------------------------------------
// Entry point

pub fn parse(cx: &Ctxt, args: TokenStream, item: TokenStream) -> Parsed {
    let args = parse_args(cx, args);
    let item = match syn::parse2::<syn::Item>(item.clone()) {
        Ok(syn::Item::Impl(item)) => item,
        Ok(other) => {
            not_an_impl(cx, &other);
            return Parsed::Other(other.into_token_stream());
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
            "`#[process_manager]` goes on an inherent `impl` block holding the message \
             handlers, not on {what}: `#[process_manager(state = MyState)] impl MyProcess {{ \
             #[starts] async fn .. }}`"
        ),
    );
}

fn parse_impl(cx: &Ctxt, args: ProcessArgs, mut item: syn::ItemImpl) -> Parsed {
    if let Some((path, _)) = &item.trait_ {
        cx.error_spanned_by(
            path,
            "`#[process_manager]` goes on an inherent `impl MyProcess { .. }` block, not on a \
             trait implementation: it implements the `ProcessManager` trait itself",
        );
        for impl_item in &mut item.items {
            if let ImplItem::Fn(method) = impl_item {
                take_helpers(&mut method.attrs);
            }
        }
        return Parsed::Other(item.into_token_stream());
    }
    if item.unsafety.is_some() {
        cx.error_spanned_by(
            item.unsafety,
            "a `#[process_manager]` impl can't be `unsafe`",
        );
    }
    for attr in take_helpers(&mut item.attrs) {
        let name = helper_name(&attr).unwrap_or_default();
        if name == "limit" {
            // There is no limit for a whole process manager.
            let place = Misplaced::Impl(Site::Handler);
            limit::parse::misplaced(cx, std::slice::from_ref(&attr), place);
            continue;
        }
        cx.error_spanned_by(
            &attr,
            format!("`#[{name}]` goes on a method of this impl, not on the impl block itself"),
        );
    }

    let state = args.state.clone();
    let mut any_handler_attr = false;
    let mut any_starts_attr = false;
    let methods = walk_methods(
        &mut item,
        is_helper,
        |method, helpers| {
            for attr in &helpers {
                match helper_name(attr) {
                    Some("starts") => {
                        any_starts_attr = true;
                        any_handler_attr = true;
                    }
                    Some("handles" | "timeout") => any_handler_attr = true,
                    _ => {}
                }
            }
            parse_method(cx, method, helpers, state.as_ref())
        },
        |helpers| not_on_a_method(cx, helpers),
    );

    Parsed::Impl(Box::new(ParsedProcess {
        item,
        args,
        methods,
        any_handler_attr,
        any_starts_attr,
    }))
}

/// Removes our helper attributes, returning them in source order.
pub fn take_helpers(attrs: &mut Vec<Attribute>) -> Vec<Attribute> {
    crate::item::take_helpers(attrs, is_helper)
}

fn not_on_a_method(cx: &Ctxt, helpers: Vec<Attribute>) {
    for attr in helpers {
        let name = helper_name(&attr).unwrap_or_default();
        cx.error_spanned_by(&attr, format!("`#[{name}]` goes on a method"));
    }
}

// ---------------------------------------------------------------------------
// Methods

/// One method's helper attributes, duplicates reported.
#[derive(Default)]
struct MethodHelpers {
    /// `#[starts]`, `#[handles]`, `#[timeout]`, `#[on_error]`: the first one.
    role: Option<Attribute>,
    correlate: Option<Attribute>,
    /// Every `#[limit]`: several compose.
    limits: Vec<Attribute>,
}

fn parse_method(
    cx: &Ctxt,
    method: &ImplItemFn,
    attrs: Vec<Attribute>,
    state: Option<&Type>,
) -> Option<ParsedMethod> {
    let ident = &method.sig.ident;
    let mut helpers = MethodHelpers::default();
    for attr in attrs {
        let name = helper_name(&attr).unwrap_or_default();
        if name == "limit" {
            helpers.limits.push(attr);
            continue;
        }
        if name == "correlate" {
            if helpers.correlate.is_some() {
                cx.error_spanned_by(
                    &attr,
                    format!(
                        "`#[correlate]` is given twice on `{ident}`: a message finds its \
                         instance through one mapping; keep one"
                    ),
                );
            } else {
                helpers.correlate = Some(attr);
            }
            continue;
        }
        match &helpers.role {
            Some(first) => {
                let first_name = helper_name(first).unwrap_or_default();
                cx.error_spanned_by(&attr, two_roles(ident, first_name, name));
            }
            None => helpers.role = Some(attr),
        }
    }

    let Some(role_attr) = helpers.role else {
        if let Some(correlate) = &helpers.correlate {
            cx.error_spanned_by(
                correlate,
                format!(
                    "`#[correlate]` goes on a `#[starts]` or `#[handles]` handler, and \
                     `{ident}` is neither: mark it `#[handles]` (or `#[starts]`), or remove \
                     `#[correlate]`"
                ),
            );
        }
        limit::parse::misplaced(cx, &helpers.limits, Misplaced::NotAHandler(ident));
        return None;
    };
    let role_name = helper_name(&role_attr).unwrap_or_default();

    if role_name == "on_error" {
        if let Some(correlate) = &helpers.correlate {
            cx.error_spanned_by(
                correlate,
                "`#[correlate]` goes on a `#[starts]` or `#[handles]` handler, not on the \
                 `#[on_error]` policy; remove it",
            );
        }
        limit::parse::misplaced(cx, &helpers.limits, Misplaced::OnError);
        no_arguments(
            cx,
            &role_attr,
            "`#[on_error]` takes no arguments: the method itself decides, by returning an \
             `ErrorAction`",
        );
        parse_on_error_signature(cx, method);
        return Some(ParsedMethod {
            ident: ident.clone(),
            attr: role_attr,
            role: Role::OnError,
        });
    }

    let kind = match role_name {
        "starts" => parse_flags(cx, &role_attr, false).map(|flags| Kind::Starts {
            strict: flags.strict,
        }),
        "handles" => parse_flags(cx, &role_attr, true).map(|flags| {
            if let (Some(many), None) = (&flags.many, &helpers.correlate) {
                cx.error_spanned_by(
                    many,
                    format!(
                        "`many` needs `#[correlate(state.<field> = msg.<field>)]` on `{ident}`: \
                         by its `#[correlation_id]` a message finds one instance (the id is \
                         unique), so there is never more than one to reach"
                    ),
                );
            }
            Kind::Handles {
                strict: flags.strict,
                many: flags.many.is_some(),
                unmatched: flags.unmatched,
            }
        }),
        _ => {
            no_arguments(
                cx,
                &role_attr,
                "`#[timeout]` takes no arguments: the delay is chosen when the timeout is \
                 requested, with `ctx.request_timeout(delay, msg)`",
            );
            Some(Kind::Timeout)
        }
    };
    let sig = parse_handler_signature(cx, method, state);

    let correlate = match &helpers.correlate {
        Some(attr) if role_name == "timeout" => {
            cx.error_spanned_by(
                attr,
                format!(
                    "a `#[timeout]` is delivered to the instance that requested it, so it is \
                     not correlated: remove `#[correlate]` from `{ident}`"
                ),
            );
            None
        }
        Some(attr) => parse_correlate(cx, attr, &sig),
        None => None,
    };
    let limits = limit::parse::parse_all(
        cx,
        &helpers.limits,
        Site::Handler,
        sig.message_name.as_ref(),
    );

    Some(ParsedMethod {
        ident: ident.clone(),
        attr: role_attr,
        role: Role::Handler(Box::new(HandlerAttrs {
            // A malformed `#[starts(..)]` is still a starting handler for the
            // other rules (no "has no #[starts] handler" on top).
            kind: kind.unwrap_or(match role_name {
                "starts" => Kind::Starts { strict: false },
                _ => Kind::Handles {
                    strict: false,
                    many: false,
                    unmatched: Unmatched::default(),
                },
            }),
            message: sig.message,
            state: sig.state,
            correlate,
            limits,
        })),
    })
}

fn two_roles(ident: &Ident, first: &str, second: &str) -> String {
    let pair = |a: &str, b: &str| (first == a && second == b) || (first == b && second == a);
    if pair("starts", "handles") {
        format!(
            "`{ident}` has both `#[{first}]` and `#[{second}]`: `#[starts]` already continues an \
             existing instance (and creates one when there is none); keep one"
        )
    } else if first == "on_error" || second == "on_error" {
        format!(
            "`{ident}` can't be both a message handler and the `#[on_error]` policy: they have \
             different signatures; keep one attribute"
        )
    } else {
        format!(
            "`{ident}` can't be both `#[{first}]` and `#[{second}]`: a method handles one kind \
             of message; keep one"
        )
    }
}

fn no_arguments(cx: &Ctxt, attr: &Attribute, message: &str) {
    if !matches!(attr.meta, Meta::Path(_)) {
        cx.error_spanned_by(attr, message);
    }
}

/// The flags of `#[starts(..)]` and `#[handles(..)]`.
#[derive(Default)]
struct Flags {
    strict: bool,
    /// The `many` token, where given.
    many: Option<syn::Path>,
    /// `hold` and `then` (`#[handles]` only).
    unmatched: Unmatched,
}

/// `#[handles]` / `#[handles(strict)]` / `#[handles(strict = true, many)]`;
/// `#[starts]` takes `strict` only.
fn parse_flags(cx: &Ctxt, attr: &Attribute, many_allowed: bool) -> Option<Flags> {
    let name = helper_name(attr).unwrap_or_default();
    let list = match &attr.meta {
        Meta::Path(_) => return Some(Flags::default()),
        Meta::List(list) => list,
        Meta::NameValue(_) => {
            cx.error_spanned_by(attr, format!("write `#[{name}]` or `#[{name}(strict)]`"));
            return None;
        }
    };
    let items = match NestedMeta::parse_meta_list(list.tokens.clone()) {
        Ok(items) => items,
        Err(err) => {
            cx.syn_error(err);
            return None;
        }
    };
    let errors_before = cx.error_count();
    let is_many =
        |item: &NestedMeta| matches!(item, NestedMeta::Meta(m) if m.path().is_ident("many"));
    let (many, items): (Vec<_>, Vec<_>) = items
        .into_iter()
        .partition(|item| !many_allowed && is_many(item));
    for item in many {
        cx.error_spanned_by(
            item,
            "`many` goes on `#[handles]`: a starting message creates or continues one \
             instance; remove it, or handle this message with `#[handles(many)]`",
        );
    }
    let is_hold = |item: &NestedMeta| matches!(item, NestedMeta::Meta(m) if m.path().is_ident("hold") || m.path().is_ident("then"));
    let (holds, items): (Vec<_>, Vec<_>) = items
        .into_iter()
        .partition(|item| !many_allowed && is_hold(item));
    for item in holds {
        cx.error_spanned_by(
            item,
            "a starting message never waits for its instance: it creates one; `hold` and \
             `then` go on `#[handles]`, for a message that continues an instance",
        );
    }
    let known: &[&str] = if many_allowed {
        &["strict", "many", "hold", "then"]
    } else {
        &["strict"]
    };
    let flags: &[&str] = &["strict", "many"];
    let keys = key_values(cx, name, known, flags, items);
    if cx.error_count() > errors_before {
        return None;
    }
    let flag = |key: &str| match keys.get(key) {
        None => Some(None),
        Some(meta @ Meta::Path(_)) => Some(Some(meta.path().clone())),
        Some(Meta::NameValue(nv)) => match &nv.value {
            Expr::Lit(syn::ExprLit {
                lit: Lit::Bool(b), ..
            }) => Some(b.value.then(|| nv.path.clone())),
            other => {
                cx.error_spanned_by(
                    other,
                    format!("`{key}` is a flag: write `{key}`, `{key} = true` or `{key} = false`"),
                );
                None
            }
        },
        Some(Meta::List(_)) => None,
    };
    let strict = flag("strict")?;
    let many = flag("many")?;
    let unmatched = unmatched(cx, &keys, strict.as_ref(), many.as_ref())?;
    Some(Flags {
        strict: strict.is_some(),
        many,
        unmatched,
    })
}

/// `hold = ".."` and `then = ..` of `#[handles]`, which say what becomes
/// of a message that finds no instance: neither means anything for a
/// `strict` handler (it fails at once) or a `many` one (it is for every
/// instance holding the value, and waits for none).
fn unmatched(
    cx: &Ctxt,
    keys: &std::collections::BTreeMap<String, Meta>,
    strict: Option<&syn::Path>,
    many: Option<&syn::Path>,
) -> Option<Unmatched> {
    let mut unmatched = Unmatched::default();
    for key in ["hold", "then"] {
        let Some(meta) = keys.get(key) else { continue };
        if strict.is_some() {
            cx.error_spanned_by(
                meta.path(),
                format!(
                    "`{key}` says what becomes of a message that finds no instance, but a \
                     `strict` handler fails at once without one (for `#[on_error]`): remove \
                     `strict` to hold the message, or remove `{key}`"
                ),
            );
            return None;
        }
        if many.is_some() {
            cx.error_spanned_by(
                meta.path(),
                format!(
                    "a `#[handles(many)]` message is for every instance holding its value, \
                     so it waits for no one instance: remove `{key}`"
                ),
            );
            return None;
        }
    }
    if let Some(meta) = keys.get("hold") {
        unmatched.hold_ms = Some(hold_period(cx, meta)?);
    }
    if let Some(meta) = keys.get("then") {
        let values = [("dead_letter", true), ("drop", false)];
        unmatched.dead_letter = Some(choice(cx, meta, "`then` policy", &values)?);
    }
    Some(unmatched)
}

/// `hold = "10m"`: how long a message waits for its instance, in ms
/// (`"0s"`: not at all).
fn hold_period(cx: &Ctxt, meta: &Meta) -> Option<u64> {
    const FORMS: &str = "a whole number and a unit (`ms`, `s`, `m` or `h`), without a space: \
                         `hold = \"30s\"`, `hold = \"10m\"`, `hold = \"24h\"` \
                         (`hold = \"0s\"`: not held)";
    let expr = name_value(meta)?;
    let text = match expr {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Str(s), ..
        }) => s,
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(int), ..
        }) => {
            cx.error_spanned_by(
                int,
                format!(
                    "`hold` is a duration written as a string with its unit: `hold = \"{}s\"` \
                     (seconds) or `hold = \"{}ms\"`",
                    int.base10_digits(),
                    int.base10_digits()
                ),
            );
            return None;
        }
        other => {
            cx.error_spanned_by(
                other,
                format!("`hold` is a duration written as a string: {FORMS}"),
            );
            return None;
        }
    };
    let value = text.value();
    // A day is the longest unit a hold needs; longer ones read as hours.
    let written = match value.strip_suffix('d') {
        Some(days) if !days.is_empty() && days.bytes().all(|b| b.is_ascii_digit()) => {
            cx.error_spanned_by(
                text,
                format!(
                    "write days as hours: `hold = \"{}h\"`",
                    days.parse::<u64>().unwrap_or(1).saturating_mul(24)
                ),
            );
            return None;
        }
        _ => limit::parse::parse_period(&value),
    };
    match written {
        // Bounded like everything held: a week at most.
        Ok(ms) if ms <= 7 * 24 * 3_600_000 => Some(ms),
        Ok(_) => {
            cx.error_spanned_by(
                text,
                format!("`hold = \"{value}\"` is longer than a message is held: at most a week, `hold = \"168h\"`"),
            );
            None
        }
        Err(_) => {
            cx.error_spanned_by(
                text,
                format!("`hold = \"{value}\"` is not a duration: write {FORMS}"),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    #[test]
    fn helper_names_are_ours_only() {
        let a: Attribute = parse_quote!(#[starts(strict)]);
        assert_eq!(helper_name(&a), Some("starts"));
        let a: Attribute = parse_quote!(#[saga_runtime::timeout]);
        assert_eq!(helper_name(&a), Some("timeout"));
        let a: Attribute = parse_quote!(#[ntest::timeout(100)]);
        assert_eq!(helper_name(&a), None);
        let a: Attribute = parse_quote!(#[doc = "x"]);
        assert_eq!(helper_name(&a), None);
    }

    #[test]
    fn state_may_be_any_type() {
        let items = parse_arg_items
            .parse2(quote::quote!(state = HashMap<String, u8>, name = "x"))
            .unwrap();
        assert_eq!(items.len(), 2);
        let cx = Ctxt::new();
        let args = parse_args(
            &cx,
            quote::quote!(state = Wrapper<u8, u16>, on_complete = delete),
        );
        cx.check().unwrap();
        assert_eq!(type_to_string(&args.state.unwrap()), "Wrapper<u8, u16>");
        assert_eq!(args.on_complete, Some(OnComplete::Delete));
    }

    #[test]
    fn parameters_in_another_order_are_one_error() {
        let method: ImplItemFn = parse_quote! {
            async fn submitted(&self, ctx: &mut ProcessContext, state: &mut S, msg: M)
                -> Result<(), ProcessError> { Ok(()) }
        };
        let state: Type = parse_quote!(S);
        let cx = Ctxt::new();
        let sig = parse_handler_signature(&cx, &method, Some(&state));
        let errors = cx.check().unwrap_err();
        assert_eq!(errors.len(), 1);
        let text = errors[0].to_string();
        assert!(text.contains("wrong order"), "{text}");
        assert!(
            text.contains("(&self, msg: M, state: &mut S, ctx: &mut ProcessContext)"),
            "{text}"
        );
        assert_eq!(type_to_string(&sig.message.unwrap()), "M");
    }

    #[test]
    fn correlate_accepts_parameter_names() {
        let sig = HandlerSig {
            message: None,
            state: None,
            message_name: Some(parse_quote!(reserved)),
            state_name: Some(parse_quote!(s)),
        };
        let cx = Ctxt::new();
        let attr: Attribute = parse_quote!(#[correlate(s.order = reserved.number)]);
        let c = parse_correlate(&cx, &attr, &sig).unwrap();
        cx.check().unwrap();
        assert!(matches!(&c.state_field, Member::Named(i) if i == "order"));
        assert!(matches!(&c.message_field, Member::Named(i) if i == "number"));

        let cx = Ctxt::new();
        let attr: Attribute = parse_quote!(#[correlate(msg.number = state.order)]);
        assert!(parse_correlate(&cx, &attr, &sig).is_none());
        let errors = cx.check().unwrap_err();
        assert!(errors[0].to_string().contains("state's field on the left"));
    }
}
