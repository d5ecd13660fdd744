//! One method's signature -> its input, context and output types: the
//! shape a step or a compensation must have, judged on the method alone.

use super::*;

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

pub(super) fn parse_signature(cx: &Ctxt, method: &ImplItemFn, kind: Kind) -> Signature {
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

pub(super) fn by_value_input(cx: &Ctxt, param: &syn::PatType, kind: Kind) -> Option<Type> {
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
pub(super) fn is_step_context(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) if r.mutability.is_none() => last_segment_is(&r.elem, "StepContext"),
        Type::Group(g) => is_step_context(&g.elem),
        _ => false,
    }
}

/// `T` of a `Result<T, StepError>` return type; anything else is reported.
pub(super) fn parse_return(cx: &Ctxt, sig: &syn::Signature, kind: Kind) -> Option<Type> {
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
