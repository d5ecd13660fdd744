//! `#[process_manager]` attributes and handler signatures -> typed structs.
//!
//! Everything that can be judged from one attribute or one method is judged
//! here: the `#[process_manager(..)]` keys, which helper attributes may be
//! combined on a method, the shape of a handler's and of `#[on_error]`'s
//! signature, the syntax of `#[correlate(..)]`. Rules relating several
//! methods live in `check.rs`.
//!
//! As in `saga/parse.rs`, every function reports into the [`Ctxt`] and
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
use crate::limit::{
    self,
    model::{Limit, Site},
    parse::Misplaced,
};
use crate::types::{same_type, type_to_string};

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
    let mut methods = Vec::new();
    let mut any_handler_attr = false;
    let mut any_starts_attr = false;
    for impl_item in &mut item.items {
        match impl_item {
            ImplItem::Fn(method) => {
                let helpers = take_helpers(&mut method.attrs);
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
                if let Some(parsed) = parse_method(cx, method, helpers, state.as_ref()) {
                    methods.push(parsed);
                }
            }
            ImplItem::Const(c) => not_on_a_method(cx, take_helpers(&mut c.attrs)),
            ImplItem::Type(t) => not_on_a_method(cx, take_helpers(&mut t.attrs)),
            ImplItem::Macro(m) => not_on_a_method(cx, take_helpers(&mut m.attrs)),
            _ => {}
        }
    }

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
    let (helpers, kept) = std::mem::take(attrs).into_iter().partition(is_helper);
    *attrs = kept;
    helpers
}

fn not_on_a_method(cx: &Ctxt, helpers: Vec<Attribute>) {
    for attr in helpers {
        let name = helper_name(&attr).unwrap_or_default();
        cx.error_spanned_by(&attr, format!("`#[{name}]` goes on a method"));
    }
}

// ---------------------------------------------------------------------------
// `#[process_manager(..)]`

const ARG_KEYS: [&str; 5] = ["name", "state", "on_complete", "concurrency", "crate"];

fn parse_args(cx: &Ctxt, args: TokenStream) -> ProcessArgs {
    let items = match parse_arg_items.parse2(args) {
        Ok(items) => items,
        Err(err) => {
            cx.syn_error(err);
            return ProcessArgs::default();
        }
    };
    let errors_before = cx.error_count();
    let keys = key_values(cx, "process_manager", &ARG_KEYS, &[], items);
    let malformed = cx.error_count() > errors_before;

    let mut args = ProcessArgs::default();
    if let Some(meta) = keys.get("name") {
        match name_value(meta) {
            Some(Expr::Lit(syn::ExprLit {
                lit: Lit::Str(s), ..
            })) => {
                let name = s.value();
                if crate::name::check(cx, "process manager", &name, s.span(), "fulfillment") {
                    args.name = Some(SpannedValue::new(name, s.span()));
                }
            }
            Some(other) => {
                cx.error_spanned_by(other, "expected a string literal: `name = \"fulfillment\"`")
            }
            None => cx.error_spanned_by(meta, "`name` needs a value: `name = \"fulfillment\"`"),
        }
    }
    match keys.get("state") {
        Some(meta) => args.state = state_type(cx, meta),
        // A misspelled `state` key is reported already, with a suggestion.
        None if !malformed => cx.error_at(
            Span::call_site(),
            "`#[process_manager]` needs the state type: `#[process_manager(state = MyState)]`, \
             where `MyState` is what one instance remembers between messages \
             (`#[derive(Default, Serialize, Deserialize)]`)",
        ),
        None => {}
    }
    args.on_complete = keys.get("on_complete").and_then(|m| {
        choice(
            cx,
            m,
            "on_complete action",
            &[("keep", OnComplete::Keep), ("delete", OnComplete::Delete)],
        )
    });
    args.concurrency = keys.get("concurrency").and_then(|m| {
        choice(
            cx,
            m,
            "concurrency mode",
            &[
                ("optimistic", Concurrency::Optimistic),
                ("pessimistic", Concurrency::Pessimistic),
            ],
        )
    });
    args.runtime = keys.get("crate").and_then(|m| runtime_path(cx, m));
    args
}

/// `key = value, ..` where the value of `state` is a type (`Wrapper<u8>`,
/// `HashMap<K, V>`: not an expression, and its commas are not separators).
fn parse_arg_items(input: ParseStream) -> syn::Result<Vec<NestedMeta>> {
    let mut items = Vec::new();
    while !input.is_empty() {
        let is_state = input.peek(syn::Ident) && input.peek2(syn::Token![=]) && {
            let fork = input.fork();
            fork.parse::<Ident>().is_ok_and(|i| i == "state")
        };
        if is_state {
            let path: syn::Path = input.parse()?;
            let eq_token: syn::Token![=] = input.parse()?;
            let value = parse_type_value(input)?;
            items.push(NestedMeta::Meta(Meta::NameValue(syn::MetaNameValue {
                path,
                eq_token,
                value,
            })));
        } else {
            items.push(input.parse::<NestedMeta>()?);
        }
        if input.is_empty() {
            break;
        }
        input.parse::<syn::Token![,]>()?;
    }
    Ok(items)
}

/// A type, kept as verbatim tokens; or a string literal naming one.
fn parse_type_value(input: ParseStream) -> syn::Result<Expr> {
    let fork = input.fork();
    if let Ok(ty) = fork.parse::<Type>() {
        if fork.is_empty() || fork.peek(syn::Token![,]) {
            input.advance_to(&fork);
            return Ok(Expr::Verbatim(ty.into_token_stream()));
        }
    }
    input.parse::<Expr>()
}

fn state_type(cx: &Ctxt, meta: &Meta) -> Option<Type> {
    let example = "`state = MyState`";
    let Some(value) = name_value(meta) else {
        cx.error_spanned_by(meta, format!("`state` needs the state type: {example}"));
        return None;
    };
    let parsed = match value {
        Expr::Verbatim(tokens) => syn::parse2::<Type>(tokens.clone()),
        Expr::Lit(syn::ExprLit {
            lit: Lit::Str(s), ..
        }) => s.parse::<Type>(),
        other => Err(syn::Error::new_spanned(
            other,
            format!("expected the state type: {example}"),
        )),
    };
    match parsed {
        Ok(ty) => Some(ty),
        Err(err) => {
            cx.syn_error(err);
            None
        }
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

// ---------------------------------------------------------------------------
// Handler signatures

/// What a handler's signature says, as far as it is valid.
pub struct HandlerSig {
    pub message: Option<Type>,
    /// `S` in `state: &mut S`.
    pub state: Option<Type>,
    /// Names of the message and state parameters, which `#[correlate]` may
    /// use instead of `msg` and `state`.
    pub message_name: Option<Ident>,
    pub state_name: Option<Ident>,
}

fn shape(name: &Ident, state: Option<&Type>) -> String {
    let state = state.map_or_else(|| "MyState".to_owned(), type_to_string);
    format!(
        "`async fn {name}(&self, msg: MyMessage, state: &mut {state}, ctx: &mut ProcessContext) \
         -> Result<(), ProcessError>`"
    )
}

fn parse_handler_signature(cx: &Ctxt, method: &ImplItemFn, state: Option<&Type>) -> HandlerSig {
    let sig = &method.sig;
    let name = &sig.ident;
    let mut out = HandlerSig {
        message: None,
        state: None,
        message_name: None,
        state_name: None,
    };

    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        let generics = &sig.generics;
        let where_clause = &generics.where_clause;
        cx.error_spanned_by(
            quote::quote!(#generics #where_clause),
            format!(
                "a handler can't be generic: `{name}` is called with the message decoded from \
                 the queue; use concrete types"
            ),
        );
    }
    if sig.asyncness.is_none() {
        cx.error_spanned_by(
            sig.fn_token,
            format!("a handler must be an `async fn`: write `async fn {name}(..)`"),
        );
    }
    if let syn::Safety::Unsafe(token) = &sig.safety {
        cx.error_spanned_by(
            token,
            "a handler can't be `unsafe`: the generated code calls it like any safe method",
        );
    }

    let mut inputs: Vec<&FnArg> = sig.inputs.iter().collect();
    if check_receiver(cx, sig, "a handler", &shape(name, state)) {
        inputs.remove(0);
    }
    let params: Vec<&syn::PatType> = inputs
        .iter()
        .filter_map(|arg| match arg {
            FnArg::Typed(t) => Some(t),
            FnArg::Receiver(_) => None,
        })
        .collect();

    match params.as_slice() {
        [a, b, c] if misordered([*a, *b, *c], state).is_some() => {
            // All three are there, in another order: one error, naming it.
            let given = [*a, *b, *c];
            let [msg, state_param, ctx] = misordered(given, state).unwrap_or(given);
            let first_wrong = given
                .into_iter()
                .zip([msg, state_param, ctx])
                .find(|(given, expected)| !std::ptr::eq(*given, *expected))
                .map_or(*a, |(given, _)| given);
            let param = |p: &syn::PatType| {
                let pat = &p.pat;
                format!("{}: {}", quote::quote!(#pat), type_to_string(&p.ty))
            };
            cx.error_spanned_by(
                first_wrong,
                format!(
                    "the parameters of `{name}` are in the wrong order: a handler takes the \
                     message, then the state, then the context: `async fn {name}(&self, {}, {}, \
                     {})`",
                    param(msg),
                    param(state_param),
                    param(ctx),
                ),
            );
            out.message = Some((*msg.ty).clone());
            out.message_name = pat_ident(&msg.pat);
            out.state = Some((*strip_ref(&state_param.ty)).clone());
            out.state_name = pat_ident(&state_param.pat);
        }
        [msg, state_param, ctx, rest @ ..] => {
            if let Some(extra) = rest.first() {
                cx.error_spanned_by(
                    extra,
                    format!(
                        "`{name}` has too many parameters: a handler takes the message, the \
                         state and the context: {}",
                        shape(name, state)
                    ),
                );
            }
            out.message = message_param(cx, msg, state);
            out.message_name = pat_ident(&msg.pat);
            if let Some(ty) = state_param_type(cx, state_param, state) {
                out.state = Some(ty);
                out.state_name = pat_ident(&state_param.pat);
            }
            ctx_param(cx, ctx);
        }
        few => {
            let is_ctx = |p: &syn::PatType| last_segment_is(strip_ref(&p.ty), "ProcessContext");
            let missing = match few {
                [] => "has no parameters after `&self`".to_owned(),
                [_, second] if !is_ctx(second) => {
                    "is missing the context: add `ctx: &mut ProcessContext` as its last \
                     parameter"
                        .to_owned()
                }
                _ => format!(
                    "has {} parameter{} after `&self`, but a handler takes three: the message, \
                     the state and the context",
                    few.len(),
                    if few.len() == 1 { "" } else { "s" },
                ),
            };
            // Where the missing parameters go.
            cx.error_at(
                sig.paren_token.span.close(),
                format!("`{name}` {missing}: {}", shape(name, state)),
            );
        }
    }

    check_return(cx, sig);
    out
}

/// What a handler's parameter is, judged by its type alone.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ParamRole {
    Message,
    State,
    Context,
}

fn param_role(param: &syn::PatType, state: Option<&Type>) -> Option<ParamRole> {
    if last_segment_is(strip_ref(&param.ty), "ProcessContext") {
        return Some(ParamRole::Context);
    }
    match &*param.ty {
        Type::Reference(r) if r.mutability.is_some() => state
            .is_none_or(|s| same_type(s, &r.elem))
            .then_some(ParamRole::State),
        Type::Reference(_) | Type::ImplTrait(_) => None,
        _ => Some(ParamRole::Message),
    }
}

/// The message, state and context parameters, when the three are there,
/// each once, but not in that order (else `None`).
fn misordered<'a>(
    params: [&'a syn::PatType; 3],
    state: Option<&Type>,
) -> Option<[&'a syn::PatType; 3]> {
    let roles = params.map(|p| param_role(p, state));
    let expected = [ParamRole::Message, ParamRole::State, ParamRole::Context];
    if roles == expected.map(Some) {
        return None;
    }
    let find = |role| {
        let mut found = params
            .iter()
            .zip(roles)
            .filter(|(_, r)| *r == Some(role))
            .map(|(p, _)| *p);
        match (found.next(), found.next()) {
            (Some(p), None) => Some(p),
            _ => None,
        }
    };
    Some([
        find(ParamRole::Message)?,
        find(ParamRole::State)?,
        find(ParamRole::Context)?,
    ])
}

/// Reports a receiver that is not `&self`; returns whether the first input
/// is a receiver at all (to be skipped).
fn check_receiver(cx: &Ctxt, sig: &syn::Signature, what: &str, shape: &str) -> bool {
    match sig.inputs.first() {
        Some(FnArg::Receiver(receiver)) => {
            let problem = match &receiver.kind {
                ReceiverKind::Reference(_, _, None) if receiver.mutability.is_none() => None,
                ReceiverKind::Reference(_, _, Some(_)) => Some(
                    "takes `&self`, not `&mut self`: messages of many instances are handled \
                     concurrently by one shared process-manager value; keep what an instance \
                     remembers in its state",
                ),
                ReceiverKind::Value => Some(
                    "takes `&self`, not `self`: the engine keeps the process-manager value and \
                     calls its methods many times",
                ),
                _ => Some("takes plain `&self`"),
            };
            if let Some(problem) = problem {
                cx.error_spanned_by(receiver, format!("{what} {problem}"));
            }
            true
        }
        first => {
            let at = match first {
                Some(first) => first.to_token_stream(),
                None => sig.ident.to_token_stream(),
            };
            cx.error_spanned_by(
                at,
                format!("{what} needs `&self` as its first parameter: {shape}"),
            );
            false
        }
    }
}

fn strip_ref(ty: &Type) -> &Type {
    match ty {
        Type::Reference(r) => &r.elem,
        other => other,
    }
}

fn pat_ident(pat: &Pat) -> Option<Ident> {
    match pat {
        Pat::Ident(p) if p.subpat.is_none() => Some(p.ident.clone()),
        _ => None,
    }
}

fn message_param(cx: &Ctxt, param: &syn::PatType, state: Option<&Type>) -> Option<Type> {
    match &*param.ty {
        Type::Reference(r) => {
            let looks_like_state =
                r.mutability.is_some() && state.is_some_and(|s| same_type(s, &r.elem));
            let message = if looks_like_state {
                "the message comes first and the state second: `(&self, msg: MyMessage, state: \
                 &mut State, ctx: &mut ProcessContext)`"
                    .to_owned()
            } else {
                format!(
                    "a handler's message is passed by value (it is decoded from the queue and \
                     the handler owns it): take `{}`, not a reference",
                    type_to_string(&r.elem)
                )
            };
            cx.error_spanned_by(&param.ty, message);
            None
        }
        Type::ImplTrait(_) => {
            cx.error_spanned_by(
                &param.ty,
                "a handler's message needs a concrete type (it is decoded from the queue by its \
                 type), not `impl Trait`",
            );
            None
        }
        ty => Some(ty.clone()),
    }
}

/// `&mut S`: returns `S`. Whether `S` is the state declared in
/// `#[process_manager(state = ..)]` is the compiler's call (an alias or a
/// path names the same type): the generated call asks it, with a message.
fn state_param_type(cx: &Ctxt, param: &syn::PatType, state: Option<&Type>) -> Option<Type> {
    match &*param.ty {
        Type::Reference(r) if r.mutability.is_some() => Some((*r.elem).clone()),
        other => {
            let expected = state.map_or_else(|| "MyState".to_owned(), type_to_string);
            cx.error_spanned_by(
                other,
                format!(
                    "the state parameter is `&mut {expected}`: the handler changes the \
                     instance's state in place, and it is saved when the handler returns `Ok`"
                ),
            );
            None
        }
    }
}

fn ctx_param(cx: &Ctxt, param: &syn::PatType) {
    match &*param.ty {
        Type::Reference(r) if last_segment_is(&r.elem, "ProcessContext") => {
            if r.mutability.is_none() {
                cx.error_spanned_by(
                    &param.ty,
                    "the context is `&mut ProcessContext`: the handler records there what it \
                     sends, publishes and schedules",
                );
            }
        }
        other => cx.error_spanned_by(
            other,
            "the last parameter of a handler is the context, `ctx: &mut ProcessContext`",
        ),
    }
}

/// `Result<(), ProcessError>`.
fn check_return(cx: &Ctxt, sig: &syn::Signature) {
    let name = &sig.ident;
    let expected = "Result<(), ProcessError>";
    let ty = match &sig.output {
        ReturnType::Type(_, ty) => ty,
        ReturnType::Default => {
            cx.error_at(
                sig.paren_token.span.close(),
                format!(
                    "a handler must return `{expected}`: add `-> {expected}` after `{name}(..)`"
                ),
            );
            return;
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
    match (segment, args.as_slice()) {
        (Some(_), [ok, err]) => {
            if !matches!(ok, Type::Tuple(t) if t.elems.is_empty()) {
                cx.error_spanned_by(
                    ok,
                    format!(
                        "a handler returns `{expected}`, not a `{}`: what it decides goes into \
                         the state and the context",
                        type_to_string(ok)
                    ),
                );
            }
            if !last_segment_is(err, "ProcessError") {
                cx.error_spanned_by(
                    err,
                    format!(
                        "the error type of a handler must be `ProcessError`, not `{}`: `?` \
                         converts any `std::error::Error + Send + Sync + 'static` into one",
                        type_to_string(err)
                    ),
                );
            }
        }
        (Some(_), _) => cx.error_spanned_by(
            ty,
            format!("a handler must return `{expected}` with both type arguments written out"),
        ),
        (None, _) => cx.error_spanned_by(
            ty,
            format!(
                "a handler must return `{expected}`, not `{}`: `Err` hands the failure to \
                 `#[on_error]` and nothing is saved",
                type_to_string(ty)
            ),
        ),
    }
}

// ---------------------------------------------------------------------------
// `#[on_error]`

fn parse_on_error_signature(cx: &Ctxt, method: &ImplItemFn) {
    let sig = &method.sig;
    let name = &sig.ident;
    let shape = format!("`fn {name}(&self, failure: &Failure) -> ErrorAction`");
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        let generics = &sig.generics;
        let where_clause = &generics.where_clause;
        cx.error_spanned_by(
            quote::quote!(#generics #where_clause),
            format!("`#[on_error]` can't be generic: {shape}"),
        );
    }
    if let Some(token) = &sig.asyncness {
        cx.error_spanned_by(
            token,
            format!(
                "`#[on_error]` is a plain `fn`, not `async`: it decides at once what happens to \
                 the failed message (`ErrorAction::RetryAfter(delay)` waits without blocking): \
                 {shape}"
            ),
        );
    }
    if let syn::Safety::Unsafe(token) = &sig.safety {
        cx.error_spanned_by(token, "`#[on_error]` can't be `unsafe`");
    }
    let mut inputs: Vec<&FnArg> = sig.inputs.iter().collect();
    if check_receiver(cx, sig, "`#[on_error]`", &shape) {
        inputs.remove(0);
    }
    match inputs.as_slice() {
        [FnArg::Typed(param), rest @ ..] => {
            let ok = matches!(&*param.ty, Type::Reference(r)
                if r.mutability.is_none() && last_segment_is(&r.elem, "Failure"));
            if !ok {
                cx.error_spanned_by(
                    &param.ty,
                    format!("`#[on_error]` takes the failure by reference, `failure: &Failure`: {shape}"),
                );
            } else if let Some(extra) = rest.first() {
                cx.error_spanned_by(
                    extra,
                    format!("`#[on_error]` takes only the failure: {shape}"),
                );
            }
        }
        _ => cx.error_at(
            sig.paren_token.span.join(),
            format!("`#[on_error]` takes the failure after `&self`: {shape}"),
        ),
    }
    let returns_action = match &sig.output {
        ReturnType::Type(_, ty) => last_segment_is(ty, "ErrorAction"),
        ReturnType::Default => false,
    };
    if !returns_action {
        let at = match &sig.output {
            ReturnType::Type(_, ty) => ty.span(),
            ReturnType::Default => sig.paren_token.span.close(),
        };
        cx.error_at(
            at,
            format!("`#[on_error]` returns what to do with the failed message, an `ErrorAction`: {shape}"),
        );
    }
}

// ---------------------------------------------------------------------------
// `#[correlate(state.x = msg.y)]`

const CORRELATE_EXAMPLE: &str = "#[correlate(state.order_number = msg.order_number)]";

fn parse_correlate(cx: &Ctxt, attr: &Attribute, sig: &HandlerSig) -> Option<CorrelateArgs> {
    let tokens = match &attr.meta {
        Meta::List(list) if !list.tokens.is_empty() => &list.tokens,
        _ => {
            cx.error_spanned_by(
                attr,
                format!(
                    "`#[correlate]` needs the mapping from a state field to a message field: \
                     `{CORRELATE_EXAMPLE}`"
                ),
            );
            return None;
        }
    };
    let malformed = |at: &dyn ToTokens| {
        cx.error_spanned_by(
            at.to_token_stream(),
            format!(
                "expected `state.<field> = msg.<field>` in `#[correlate]`, e.g. \
                 `{CORRELATE_EXAMPLE}`"
            ),
        );
    };
    let expr = match syn::parse2::<Expr>(tokens.clone()) {
        Ok(expr) => expr,
        Err(_) => {
            malformed(tokens);
            return None;
        }
    };
    let Expr::Assign(assign) = &expr else {
        malformed(&expr);
        return None;
    };
    let is_state = |i: &Ident| i == "state" || sig.state_name.as_ref() == Some(i);
    let is_msg = |i: &Ident| i == "msg" || sig.message_name.as_ref() == Some(i);
    let (Some((left_base, left_field)), Some((right_base, right_field))) = (
        field_access(cx, &assign.left),
        field_access(cx, &assign.right),
    ) else {
        return None;
    };
    if is_msg(&left_base) && is_state(&right_base) {
        cx.error_spanned_by(
            &expr,
            format!(
                "write the state's field on the left: `#[correlate({} = {})]`",
                quote::quote!(#right_base.#right_field),
                quote::quote!(#left_base.#left_field),
            ),
        );
        return None;
    }
    let state_names = names("state", sig.state_name.as_ref());
    let msg_names = names("msg", sig.message_name.as_ref());
    if !is_state(&left_base) {
        cx.error_spanned_by(
            &left_base,
            format!(
                "the left side of `#[correlate]` is a field of the state: {state_names} \
                 (e.g. `{CORRELATE_EXAMPLE}`)"
            ),
        );
        return None;
    }
    if !is_msg(&right_base) {
        cx.error_spanned_by(
            &right_base,
            format!(
                "the right side of `#[correlate]` is a field of the message: {msg_names} \
                 (e.g. `{CORRELATE_EXAMPLE}`)"
            ),
        );
        return None;
    }
    Some(CorrelateArgs {
        state_field: left_field,
        message_field: right_field,
    })
}

/// "`state.<field>`", or "`state.<field>` (or `s.<field>`)" when the
/// parameter has another name.
fn names(default: &str, param: Option<&Ident>) -> String {
    match param {
        Some(p) if p != default => format!("`{default}.<field>` (or `{p}.<field>`)"),
        _ => format!("`{default}.<field>`"),
    }
}

/// `base.field` with `base` a plain name.
fn field_access(cx: &Ctxt, expr: &Expr) -> Option<(Ident, Member)> {
    let report = |at: &dyn ToTokens, what: &str| {
        cx.error_spanned_by(
            at.to_token_stream(),
            format!("{what}: expected `state.<field> = msg.<field>`, e.g. `{CORRELATE_EXAMPLE}`"),
        );
    };
    let Expr::Field(field) = expr else {
        report(
            expr,
            "`#[correlate]` maps a field of the state to a field of the message",
        );
        return None;
    };
    let base = match &*field.base {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident(),
        _ => None,
    };
    if let Some(base) = base {
        return Some((base.clone(), field.member.clone()));
    }
    match &*field.base {
        Expr::Field(_) => {
            report(
                expr,
                "`#[correlate]` maps a direct field (it becomes an index key), not a nested one",
            );
            None
        }
        other => {
            report(other, "`#[correlate]` maps a field of `state` or `msg`");
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
