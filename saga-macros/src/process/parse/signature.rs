//! One handler's signature -> its message, state and context parameters
//! and its return type, judged on the method alone; and the one shape an
//! `#[on_error]` method may have.

use super::*;

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

pub(super) fn shape(name: &Ident, state: Option<&Type>) -> String {
    let state = state.map_or_else(|| "MyState".to_owned(), type_to_string);
    format!(
        "`async fn {name}(&self, msg: MyMessage, state: &mut {state}, ctx: &mut ProcessContext) \
         -> Result<(), ProcessError>`"
    )
}

pub(super) fn parse_handler_signature(
    cx: &Ctxt,
    method: &ImplItemFn,
    state: Option<&Type>,
) -> HandlerSig {
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
pub(super) enum ParamRole {
    Message,
    State,
    Context,
}

pub(super) fn param_role(param: &syn::PatType, state: Option<&Type>) -> Option<ParamRole> {
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
pub(super) fn misordered<'a>(
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
pub(super) fn check_receiver(cx: &Ctxt, sig: &syn::Signature, what: &str, shape: &str) -> bool {
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

pub(super) fn strip_ref(ty: &Type) -> &Type {
    match ty {
        Type::Reference(r) => &r.elem,
        other => other,
    }
}

pub(super) fn pat_ident(pat: &Pat) -> Option<Ident> {
    match pat {
        Pat::Ident(p) if p.subpat.is_none() => Some(p.ident.clone()),
        _ => None,
    }
}

pub(super) fn message_param(cx: &Ctxt, param: &syn::PatType, state: Option<&Type>) -> Option<Type> {
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
pub(super) fn state_param_type(
    cx: &Ctxt,
    param: &syn::PatType,
    state: Option<&Type>,
) -> Option<Type> {
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

pub(super) fn ctx_param(cx: &Ctxt, param: &syn::PatType) {
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
pub(super) fn check_return(cx: &Ctxt, sig: &syn::Signature) {
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

pub(super) fn parse_on_error_signature(cx: &Ctxt, method: &ImplItemFn) {
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
