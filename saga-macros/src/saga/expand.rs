//! IR -> tokens. Reads only the [`SagaDef`].
//!
//! Generated code names everything by absolute path
//! (`::saga_runtime::__private::..`, `::core::..`, `::std::..`): it lands in
//! the user's module, where `Result`, `Box` or `Send` may be the user's own.
//! Locals and parameters are `__`-prefixed for the same reason.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::Type;

use super::model::{
    Backoff, BreakerDef, BreakerScope, OnExhausted, PolicyDef, SagaDef, StepDef, WhenOpen,
};
use crate::types::type_to_string;

/// The full expansion of a valid saga.
pub fn expand(saga: &SagaDef) -> TokenStream {
    let (saga, aliases) = &through_aliases(saga);
    let item = &saga.item;
    let type_checks = type_checks(saga);
    let saga_impl = saga_impl(saga);
    let cancellable = cancellable_impl(saga);
    let output_enum = output_enum(saga);
    let reconciliation = reconciliation_trait(saga);
    quote! {
        #aliases
        #item
        #saga_impl
        #type_checks
        #cancellable
        #output_enum
        #reconciliation
    }
}

/// The saga with every step type named once, by a hidden alias written
/// with the user's tokens, and the aliases. The step methods' signatures,
/// the `Saga` impl, the output enum and the checks all use the alias, so a
/// type that does not resolve is one error, where it is written; named in
/// several places, rustc would report it in each (with different hints,
/// so not merged). The definition and the fingerprint keep the types as
/// written (`StepDef::written`). Types naming `Self` stay as they are.
fn through_aliases(saga: &SagaDef) -> (SagaDef, TokenStream) {
    let mut saga = saga.clone();
    let mut aliases = TokenStream::new();
    let owner = saga.type_ident.clone();
    let mut alias = |ty: &mut Type, method: &syn::Ident, role: &str| {
        if names_self(ty) {
            return;
        }
        let ident = quote::format_ident!("__{}_{}_{}", owner, method, role, span = ty.span());
        aliases.extend(quote! {
            #[doc(hidden)]
            #[allow(non_camel_case_types)]
            type #ident = #ty;
        });
        *ty = syn::parse_quote!(#ident);
    };
    let mut signatures: Vec<(syn::Ident, Option<Type>, Option<Type>)> = Vec::new();
    for step in &mut saga.steps {
        if let Some(input) = &mut step.input {
            alias(input, &step.ident, "input");
        }
        if let Some(output) = &mut step.output {
            alias(output, &step.ident, "output");
        }
        signatures.push((step.ident.clone(), step.input.clone(), step.output.clone()));
    }
    for comp in &mut saga.compensations {
        // `Outcome<Output, Input>`: each argument by its own alias (the
        // checks name them), then the whole by one.
        let args = comp.outcome.as_mut().and_then(|o| o.args.as_mut());
        if let (Some(param), Some((output, input))) = (&mut comp.param, args) {
            alias(output, &comp.ident, "completed");
            alias(input, &comp.ident, "unknown");
            outcome_args(param, |args| *args = vec![output.clone(), input.clone()]);
        }
        if let Some(param) = &mut comp.param {
            alias(param, &comp.ident, "input");
        }
        signatures.push((comp.ident.clone(), comp.param.clone(), None));
    }
    for item in &mut saga.item.items {
        let syn::ImplItem::Fn(method) = item else {
            continue;
        };
        let Some((_, input, output)) = signatures.iter().find(|(m, ..)| *m == method.sig.ident)
        else {
            continue;
        };
        if let Some(input) = input {
            let first = method.sig.inputs.iter_mut().find_map(|arg| match arg {
                syn::FnArg::Typed(pat) => Some(pat),
                syn::FnArg::Receiver(_) => None,
            });
            if let Some(param) = first {
                *param.ty = input.clone();
            }
        }
        if let (Some(output), syn::ReturnType::Type(_, ty)) = (output, &mut method.sig.output) {
            if let Some(slot) = result_ok_type(ty) {
                *slot = output.clone();
            }
        }
    }
    (saga, aliases)
}

/// Rewrites the type arguments of `Outcome<..>` (the last segment of
/// `ty`'s path), dropping lifetimes and constants written there.
fn outcome_args(ty: &mut Type, rewrite: impl FnOnce(&mut Vec<Type>)) {
    let Type::Path(path) = ty else { return };
    let Some(segment) = path.path.segments.last_mut() else {
        return;
    };
    let syn::PathArguments::AngleBracketed(args) = &mut segment.arguments else {
        return;
    };
    let mut types: Vec<Type> = args
        .args
        .iter()
        .filter_map(|arg| match arg {
            syn::GenericArgument::Type(ty) => Some(ty.clone()),
            _ => None,
        })
        .collect();
    rewrite(&mut types);
    args.args = types.into_iter().map(syn::GenericArgument::Type).collect();
}

/// `T` in `Result<T, E>`, to rewrite it.
fn result_ok_type(ty: &mut Type) -> Option<&mut Type> {
    let Type::Path(path) = ty else { return None };
    let segment = path.path.segments.last_mut()?;
    let syn::PathArguments::AngleBracketed(args) = &mut segment.arguments else {
        return None;
    };
    args.args.iter_mut().find_map(|arg| match arg {
        syn::GenericArgument::Type(ty) => Some(ty),
        _ => None,
    })
}

/// What is emitted next to the errors when the saga is invalid: the user's
/// impl (so their methods still exist) and stand-ins for every generated
/// item, so that code using the saga elsewhere does not pile up "trait not
/// implemented" or "cannot find trait" errors on top of the real one
/// (thiserror does the same for `Display`).
pub fn fallback(saga: &SagaDef) -> TokenStream {
    let rt = saga.rt();
    let mut item = saga.item.clone();
    // The steps are not called from anywhere while the saga is broken.
    item.attrs.push(syn::parse_quote!(#[allow(dead_code)]));
    let generic = !saga.item.generics.params.is_empty();
    let value: Type = syn::parse_quote!(#rt::Value);
    pad_outcome_params(saga, &mut item, &value);

    // Best guesses for the saga's input and output, even when the numbering
    // is wrong: `Value` would turn every typed use of the saga into a
    // mismatch error.
    let steps = saga.steps_in_order();
    let pick = |ty: Option<&Type>| match ty {
        Some(ty) if !generic => ty.clone(),
        _ => value.clone(),
    };
    let input = pick(steps.first().and_then(|s| s.input.as_ref()));
    let output = pick(steps.last().and_then(|s| s.output.as_ref()));

    let (impl_generics, where_clause) = impl_header(saga);
    let self_ty = &saga.item.self_ty;
    let name = &saga.name;
    // Whether or not `#[cancellable]` is there: a broken `#[saga(..)]`
    // (say `#[saga(cancellable)]`) must not add "not cancellable" at every
    // `engine.cancel::<S>(..)`.
    let cancellable = quote! {
        impl #impl_generics #rt::Cancellable for #self_ty #where_clause {}
    };
    let generated_types = if generic {
        TokenStream::new()
    } else {
        let outputs: Vec<Type> = saga
            .steps
            .iter()
            .map(|s| s.output.clone().unwrap_or_else(|| value.clone()))
            .collect();
        let variants = saga.steps.iter().map(StepDef::variant_ident);
        let enum_ident = saga.output_enum_ident();
        let trait_ = reconciliation_trait(saga);
        quote! {
            #[allow(dead_code, private_interfaces, clippy::large_enum_variant)]
            pub enum #enum_ident { #(#variants(#outputs),)* }
            #[allow(dead_code, private_interfaces)]
            impl #enum_ident {
                #[doc(hidden)]
                pub fn __decode(
                    _: u32,
                    _: #rt::Value,
                ) -> ::core::result::Result<Self, #rt::ReconcileError> {
                    ::core::unreachable!()
                }
            }
            #trait_
        }
    };
    quote! {
        #item
        impl #impl_generics #rt::Saga for #self_ty #where_clause {
            type Input = #input;
            type Output = #output;
            const NAME: &'static str = #name;
            fn definition() -> &'static #rt::SagaDefinition {
                ::core::unreachable!()
            }
            fn encode_input(
                _: &Self::Input,
            ) -> ::core::result::Result<#rt::Value, #rt::StepError> {
                ::core::unreachable!()
            }
            fn decode_input(
                _: #rt::Value,
            ) -> ::core::result::Result<Self::Input, #rt::StepError> {
                ::core::unreachable!()
            }
            fn decode_output(
                _: #rt::Value,
            ) -> ::core::result::Result<Self::Output, #rt::StepError> {
                ::core::unreachable!()
            }
            fn execute_step<'a>(
                &'a self,
                _: u32,
                _: #rt::Value,
                _: &'a #rt::StepContext,
            ) -> #rt::BoxFuture<'a, ::core::result::Result<#rt::Value, #rt::StepError>> {
                ::core::unreachable!()
            }
            fn compensate_step<'a>(
                &'a self,
                _: u32,
                _: #rt::Value,
                _: &'a #rt::StepContext,
            ) -> #rt::BoxFuture<'a, ::core::result::Result<(), #rt::StepError>> {
                ::core::unreachable!()
            }
        }
        #cancellable
        #generated_types
    }
}

/// A compensation's `Outcome<..>` with other than two type arguments is
/// reported (`check.rs`); left so in the impl emitted beside the error,
/// the compiler would report it again. Given two (the first ones written,
/// then `Value`), it is the one error.
fn pad_outcome_params(saga: &SagaDef, item: &mut syn::ItemImpl, value: &Type) {
    let malformed = saga
        .compensations
        .iter()
        .filter(|c| c.outcome.as_ref().is_some_and(|o| o.args.is_none()));
    for comp in malformed {
        for impl_item in &mut item.items {
            let syn::ImplItem::Fn(method) = impl_item else {
                continue;
            };
            if method.sig.ident != comp.ident {
                continue;
            }
            let first = method.sig.inputs.iter_mut().find_map(|arg| match arg {
                syn::FnArg::Typed(pat) => Some(pat),
                syn::FnArg::Receiver(_) => None,
            });
            if let Some(param) = first {
                outcome_args(&mut param.ty, |args| args.resize(2, value.clone()));
            }
        }
    }
}

/// `impl<..>` generics and the where clause for the generated trait impls.
/// A generic saga type must be `Send + Sync + 'static` to be a `Saga`;
/// saying so in the where clause turns a missing bound into "`Saga` is not
/// implemented for `CreateZip<Rc<..>>`" at the use site rather than an error
/// inside generated code.
fn impl_header(saga: &SagaDef) -> (TokenStream, TokenStream) {
    let generics = &saga.item.generics;
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    let impl_generics = impl_generics.to_token_stream();
    if generics.params.is_empty() {
        return (impl_generics, where_clause.to_token_stream());
    }
    let self_ty = &saga.item.self_ty;
    let mut where_clause = generics
        .where_clause
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(where));
    where_clause.predicates.push(syn::parse_quote!(
        #self_ty: ::core::marker::Send + ::core::marker::Sync + 'static
    ));
    (impl_generics, where_clause.to_token_stream())
}

fn cancellable_impl(saga: &SagaDef) -> TokenStream {
    if !saga.cancellable {
        return TokenStream::new();
    }
    let rt = saga.rt();
    let (impl_generics, where_clause) = impl_header(saga);
    let self_ty = &saga.item.self_ty;
    quote! {
        impl #impl_generics #rt::Cancellable for #self_ty #where_clause {}
    }
}

fn saga_impl(saga: &SagaDef) -> TokenStream {
    let rt = saga.rt();
    let steps = saga.steps_in_order();
    let value: Type = syn::parse_quote!(#rt::Value);
    let input = steps
        .first()
        .and_then(|s| s.input.clone())
        .unwrap_or_else(|| value.clone());
    let output = steps
        .last()
        .and_then(|s| s.output.clone())
        .unwrap_or_else(|| value.clone());
    let (impl_generics, where_clause) = impl_header(saga);
    let self_ty = &saga.item.self_ty;
    let name = &saga.name;
    let type_name = saga.type_ident.to_string();
    let cancellable = saga.cancellable;
    let version = saga.version;
    let fingerprint = saga.fingerprint();

    let step_definitions = steps.iter().map(|s| step_definition(saga, s));
    let codec_traits = codec_traits(&rt);
    let encode_input = encode(&rt, &input, quote!(__input));
    let decode_input = decode(&rt, &input, quote!(__input));
    let decode_output = decode(&rt, &output, quote!(__output));
    let execute_arms = steps.iter().map(|s| execute_arm(saga, s));
    let compensate = compensate_body(saga, &steps);

    quote! {
        impl #impl_generics #rt::Saga for #self_ty #where_clause {
            type Input = #input;
            type Output = #output;
            const NAME: &'static str = #name;

            fn definition() -> &'static #rt::SagaDefinition {
                static DEFINITION: #rt::SagaDefinition = #rt::SagaDefinition {
                    name: #name,
                    version: #version,
                    fingerprint: #fingerprint,
                    type_name: #type_name,
                    cancellable: #cancellable,
                    steps: &[#(#step_definitions),*],
                };
                &DEFINITION
            }

            fn encode_input(
                __input: &Self::Input,
            ) -> ::core::result::Result<#rt::Value, #rt::StepError> {
                #codec_traits
                #encode_input
            }

            fn decode_input(
                __input: #rt::Value,
            ) -> ::core::result::Result<Self::Input, #rt::StepError> {
                #codec_traits
                #decode_input
            }

            fn decode_output(
                __output: #rt::Value,
            ) -> ::core::result::Result<Self::Output, #rt::StepError> {
                #codec_traits
                #decode_output
            }

            fn execute_step<'a>(
                &'a self,
                __order: u32,
                __input: #rt::Value,
                __ctx: &'a #rt::StepContext,
            ) -> #rt::BoxFuture<'a, ::core::result::Result<#rt::Value, #rt::StepError>> {
                #codec_traits
                match __order {
                    #(#execute_arms)*
                    _ => #rt::unknown_step(#name, __order),
                }
            }

            fn compensate_step<'a>(
                &'a self,
                __order: u32,
                __output: #rt::Value,
                __ctx: &'a #rt::StepContext,
            ) -> #rt::BoxFuture<'a, ::core::result::Result<(), #rt::StepError>> {
                #codec_traits
                #compensate
            }
        }
    }
}

fn step_definition(saga: &SagaDef, step: &StepDef) -> TokenStream {
    let rt = saga.rt();
    let name = step.ident.to_string();
    let order = step.number();
    let retry = retry_policy(&rt, step.retry.as_ref());
    let compensation = match saga.compensation_of(step) {
        Some(comp) => {
            let comp_name = comp.ident.to_string();
            let comp_retry = match &step.compensation_retry {
                Some(policy) => retry_policy(&rt, Some(policy)),
                None => retry.clone(),
            };
            let handles_unknown = comp.outcome.is_some();
            quote! {
                ::core::option::Option::Some(#rt::CompensationDefinition {
                    name: #comp_name,
                    retry: #comp_retry,
                    handles_unknown: #handles_unknown,
                })
            }
        }
        None => quote!(::core::option::Option::None),
    };
    let breaker = match &step.breaker {
        Some(BreakerDef {
            failure_threshold,
            duration_secs,
            scope,
            when_open,
        }) => {
            let scope = scope.map(|scope| match scope {
                BreakerScope::Process => quote!(.with_scope(#rt::BreakerScope::Process)),
                BreakerScope::Shared => quote!(.with_scope(#rt::BreakerScope::Shared)),
            });
            let when_open = when_open.map(|when| match when {
                WhenOpen::Fail => quote!(.with_when_open(#rt::WhenOpen::Fail)),
                WhenOpen::Wait => quote!(.with_when_open(#rt::WhenOpen::Wait)),
            });
            quote! {
                ::core::option::Option::Some(
                    #rt::CircuitBreakerConfig::new(#failure_threshold, #duration_secs)
                        #scope #when_open
                )
            }
        }
        None => quote!(::core::option::Option::None),
    };
    let timeout = match step.timeout_ms {
        Some(ms) => quote! {
            ::core::option::Option::Some(::core::time::Duration::from_millis(#ms))
        },
        None => quote!(::core::option::Option::None),
    };
    let (input_type, output_type) = &step.written;
    // A keyed limit decodes the input through the step's `Codec`: a type
    // that does not decode stays the one error its check gives.
    let input = step
        .input
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(#rt::Value));
    let traits = codec_traits(&rt);
    let decode = |v| {
        let decode = decode(&rt, &input, v);
        quote!({ #traits #decode })
    };
    let limits =
        crate::limit::expand::specs(&rt, &saga.name, &step.ident, &step.limits, &input, &decode);
    quote! {
        #rt::StepDefinition {
            name: #name,
            order: #order,
            retry: #retry,
            compensation: #compensation,
            circuit_breaker: #breaker,
            timeout: #timeout,
            input_type: #input_type,
            output_type: #output_type,
            limits: #limits,
        }
    }
}

fn retry_policy(rt: &TokenStream, policy: Option<&PolicyDef>) -> TokenStream {
    let Some(policy) = policy else {
        return quote!(#rt::RetryPolicy::NO_RETRY);
    };
    let max_retries = policy.max_retries;
    let base = policy.base_delay_ms;
    let backoff = match policy.backoff {
        Backoff::Exponential => quote!(Exponential),
        Backoff::Linear => quote!(Linear),
        Backoff::Constant => quote!(Constant),
    };
    let mut tokens = quote! {
        #rt::RetryPolicy::new(#max_retries, #rt::BackoffKind::#backoff, #base)
    };
    if let Some(max) = policy.max_delay_ms {
        tokens.extend(quote!(.with_max_delay_ms(#max)));
    }
    if let Some(jitter) = policy.jitter {
        tokens.extend(quote!(.with_jitter(#jitter)));
    }
    if let Some(action) = policy.on_exhausted {
        let action = match action {
            OnExhausted::Compensate => quote!(Compensate),
            OnExhausted::Fail => quote!(Fail),
            OnExhausted::DeadLetter => quote!(DeadLetter),
        };
        tokens.extend(quote!(.with_on_exhausted(#rt::OnExhausted::#action)));
    }
    tokens
}

/// The compiler's verdict on the chain of step types, as `where` clauses of
/// a hidden function: step 1's input and every step's output are
/// `Serialize + Deserialize`, step N takes step N-1's output, and a
/// compensation takes its step's output. Step types never mention generic
/// parameters (`check.rs`), so each clause is either true or reported by
/// rustc on its own, spanned on the type as the user wrote it, with the
/// message the runtime's `#[diagnostic::on_unimplemented]` gives it. The
/// clauses sit on their own item rather than on `impl Saga`, so a failing
/// one does not also make every use of the saga an error; a free function
/// (step types never name the impl's parameters) because there a type that
/// does not resolve is reported exactly as in the step's signature, and
/// rustc shows the two reports as one. A type naming `Self` cannot be
/// written there and is left to the steps' own code.
fn type_checks(saga: &SagaDef) -> TokenStream {
    let rt = saga.rt();
    let steps = saga.steps_in_order();
    let mut clauses = Vec::new();
    let mut clause = |ty: &Type, bound: TokenStream, other: Option<&Type>| {
        if !names_self(ty) && !other.is_some_and(names_self) {
            clauses.push(clause(ty, bound, other));
        }
    };
    // A type that is not stored gives one error, at its first mention.
    let mut stored = std::collections::HashSet::new();
    if let Some(input) = steps.first().and_then(|s| s.input.as_ref()) {
        stored.insert(type_to_string(input));
        clause(input, quote!(#rt::SagaInput), None);
    }
    for step in &steps {
        let n = step.number();
        if let Some(output) = &step.output {
            if stored.insert(type_to_string(output)) {
                clause(output, quote!(#rt::StepOutput<#n>), None);
            }
        }
        let Some(comp) = saga.compensation_of(step) else {
            continue;
        };
        let outcome = comp.outcome.as_ref().and_then(|o| o.args.as_ref());
        match (&comp.param, outcome) {
            // `Outcome<Output, Input>`: each argument checked on its own,
            // so a wrong one is one error, on it.
            (Some(param), Some((completed, unknown))) => {
                if let Some(output) = &step.output {
                    clause(
                        completed,
                        quote!(#rt::CompletedIsOutputOf<#n,),
                        Some(output),
                    );
                }
                if let Some(input) = &step.input {
                    clause(unknown, quote!(#rt::UnknownIsInputOf<#n,), Some(input));
                }
                clause(param, quote!(#rt::IsOutcome), None);
            }
            (Some(param), None) => {
                if let Some(output) = &step.output {
                    clause(param, quote!(#rt::UndoesOutputOf<#n,), Some(output));
                }
            }
            (None, _) => {}
        }
    }
    for pair in steps.windows(2) {
        let (prev, step) = (pair[0], pair[1]);
        if let (Some(output), Some(input)) = (&prev.output, &step.input) {
            let (n, p) = (step.number(), prev.number());
            clause(input, quote!(#rt::TakesOutputOf<#n, #p,), Some(output));
        }
    }
    quote! {
        const _: () = {
            #[allow(dead_code)]
            fn __saga_type_checks()
            where
                #(#clauses,)*
            {}
        };
    }
}

fn names_self(ty: &Type) -> bool {
    fn scan(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|tree| match tree {
            proc_macro2::TokenTree::Ident(ident) => ident == "Self",
            proc_macro2::TokenTree::Group(group) => scan(group.stream()),
            _ => false,
        })
    }
    scan(ty.to_token_stream())
}

/// `ty: Trait<.., other>`, with the generated tokens placed on `ty`:
/// rustc reports a failing `where` clause over the clause's whole extent,
/// and one token left at the macro's call site (`::saga_runtime`, a
/// number) would move the report onto `#[saga]`. The user's types keep
/// their own spans, so that a type that does not resolve is reported where
/// it is written. With `other`, `bound` is left open (`Trait<N,`) for
/// `other` and the closing `>`.
fn clause(ty: &Type, bound: TokenStream, other: Option<&Type>) -> TokenStream {
    fn respan(tokens: TokenStream, span: proc_macro2::Span) -> TokenStream {
        tokens
            .into_iter()
            .map(|mut tree| {
                if let proc_macro2::TokenTree::Group(group) = &tree {
                    let mut inner =
                        proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                    inner.set_span(span);
                    tree = proc_macro2::TokenTree::Group(inner);
                } else {
                    tree.set_span(span);
                }
                tree
            })
            .collect()
    }
    let span = ty.span();
    let mut tokens = ty.to_token_stream();
    tokens.extend(respan(quote!(:), span));
    tokens.extend(respan(bound, span));
    if let Some(other) = other {
        tokens.extend(other.to_token_stream());
        tokens.extend(respan(quote!(>), span));
    }
    tokens
}

/// `value: &ty` as JSON (`codec(ty, encode, value)`), or JSON `value` as
/// `ty` (`codec(ty, decode, value)`). Through
/// [`Codec`](::saga_runtime::__private::Codec) so that a type without the
/// serde derives is reported once, by [`type_checks`], and not again here.
///
/// The two traits are brought in scope once per generated function, by
/// [`codec_traits`], not per call: what a step adds stays small.
fn codec(rt: &TokenStream, ty: &Type, method: TokenStream, value: TokenStream) -> TokenStream {
    quote!((&#rt::Codec::<#ty>::NEW).#method(#value))
}

/// The `use` that [`codec`] calls need, at the top of a function body.
fn codec_traits(rt: &TokenStream) -> TokenStream {
    quote! {
        #[allow(unused_imports)]
        use #rt::{NotPersistable as _, Persist as _};
    }
}

fn encode(rt: &TokenStream, ty: &Type, value: TokenStream) -> TokenStream {
    codec(rt, ty, quote!(encode), value)
}

fn decode(rt: &TokenStream, ty: &Type, value: TokenStream) -> TokenStream {
    codec(rt, ty, quote!(decode), value)
}

fn execute_arm(saga: &SagaDef, step: &StepDef) -> TokenStream {
    let rt = saga.rt();
    let order = step.number();
    let method = &step.ident;
    let input = step
        .input
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(#rt::Value));
    let ctx = step.takes_ctx.then(|| quote!(, __ctx));
    // Spanned on the method so that, say, a non-`Send` future is reported
    // at the step rather than at `#[saga]`.
    let output = step
        .output
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(#rt::Value));
    let decode = decode(&rt, &input, quote!(__input));
    let encode = encode(&rt, &output, quote!(&__output));
    let boxed = quote_spanned! {method.span()=>
        ::std::boxed::Box::pin(async move {
            let __input: #input = #decode?;
            let __output: #output = Self::#method(self, __input #ctx).await?;
            #encode
        })
    };
    quote!(#order => #boxed,)
}

fn compensate_body(saga: &SagaDef, steps: &[&StepDef]) -> TokenStream {
    let rt = saga.rt();
    let name = &saga.name;
    let arms: Vec<TokenStream> = steps
        .iter()
        .filter_map(|step| {
            let comp = saga.compensation_of(step)?;
            let order = step.number();
            let method = &comp.ident;
            let param = comp
                .param
                .clone()
                .unwrap_or_else(|| syn::parse_quote!(#rt::Value));
            let ctx = comp.takes_ctx.then(|| quote!(, __ctx));
            let decode = decode(&rt, &param, quote!(__output));
            let boxed = quote_spanned! {method.span()=>
                ::std::boxed::Box::pin(async move {
                    let __output: #param = #decode?;
                    Self::#method(self, __output #ctx).await
                })
            };
            Some(quote!(#order => #boxed,))
        })
        .collect();
    if arms.is_empty() {
        // No step has a compensation; the engine does not call this then.
        return quote! {
            let _ = (__output, __ctx);
            #rt::unknown_step(#name, __order)
        };
    }
    quote! {
        match __order {
            #(#arms)*
            _ => #rt::unknown_step(#name, __order),
        }
    }
}

fn output_enum(saga: &SagaDef) -> TokenStream {
    let rt = saga.rt();
    let codec_traits = codec_traits(&rt);
    let ident = saga.output_enum_ident();
    let name = &saga.name;
    let steps = saga.steps_in_order();
    let variants = steps.iter().map(|step| {
        let variant = step.variant_ident();
        let output = step
            .output
            .clone()
            .unwrap_or_else(|| syn::parse_quote!(#rt::Value));
        let doc = format!("The output of step {} (`{}`).", step.number(), step.ident);
        quote! {
            #[doc = #doc]
            #variant(#output),
        }
    });
    let arms = steps.iter().map(|step| {
        let variant = step.variant_ident();
        let order = step.number();
        let output = step
            .output
            .clone()
            .unwrap_or_else(|| syn::parse_quote!(#rt::Value));
        let decode = decode(&rt, &output, quote!(__value));
        quote! {
            #order => ::core::result::Result::map_err(
                ::core::result::Result::map(#decode, Self::#variant),
                |__e| #rt::reconcile::decode_error(#name, __order, __e),
            ),
        }
    });
    let doc = format!(
        "The output of one step of the `{name}` saga, decoded from a task's recorded \
         state: what [`{}::referenced_keys`] inspects to find the external resources \
         a live task still uses.\n\nGenerated by `#[saga]`, one variant per step.",
        saga.reconciliation_ident()
    );
    quote! {
        #[doc = #doc]
        // Private step types are fine: the enum is as usable as they are.
        #[allow(dead_code, private_interfaces, clippy::large_enum_variant)]
        pub enum #ident {
            #(#variants)*
        }

        #[allow(dead_code, private_interfaces)]
        impl #ident {
            /// Decodes the recorded output of step `order`.
            #[doc(hidden)]
            pub fn __decode(
                __order: u32,
                __value: #rt::Value,
            ) -> ::core::result::Result<Self, #rt::ReconcileError> {
                #codec_traits
                match __order {
                    #(#arms)*
                    _ => ::core::result::Result::Err(#rt::reconcile::decode_error(
                        #name,
                        __order,
                        "the saga has no step with this number",
                    )),
                }
            }
        }
    }
}

fn reconciliation_trait(saga: &SagaDef) -> TokenStream {
    let rt = saga.rt();
    let version = saga.version;
    let ident = saga.reconciliation_ident();
    let output_enum = saga.output_enum_ident();
    let name = &saga.name;
    let result = |ok: TokenStream| quote!(::core::result::Result<#ok, #rt::ReconcileError>);

    // Return-position `impl Future + Send`: users implement these with a
    // plain `async fn` (no attribute, no extra dependency), and the futures
    // of the provided methods are `Send`, so `run` can be spawned.
    let future = |output: TokenStream| quote!(impl ::core::future::Future<Output = #output> + ::core::marker::Send);
    let list_ret = future(result(quote!(::std::vec::Vec<Self::Resource>)));
    let orphans_ret = future(result(quote!(())));
    let once_ret = future(result(quote!(#rt::ReconcileReport)));
    let run_ret = future(quote!(()));

    let doc = format!(
        "Reconciliation of the `{name}` saga: finds external resources that no live task \
         references any more (created by a step whose completion was never recorded, or \
         left behind by a failed compensation) and hands them to [`handle_orphans`](Self::handle_orphans).\n\n\
         Generated by `#[saga]` (Generation Gap): implement the four required items (the \
         two `async` ones with a plain `async fn`), then call [`run`](Self::run) in a \
         background task or [`reconcile_once`](Self::reconcile_once) from a scheduler.\n\n\
         A step that has created a resource but not yet recorded its output makes that \
         resource look orphaned for a moment: spare young resources in `handle_orphans`."
    );
    let list_doc = "Lists the external resources this saga's steps create (e.g. the objects under a bucket prefix).";
    let key_doc = "What identifies a resource: the same value [`referenced_keys`](Self::referenced_keys) extracts from step outputs.";
    let referenced_doc = format!(
        "The keys of the resources one recorded step output refers to (often none or one). \
         Match on [`{output_enum}`] to pick the steps that create resources."
    );
    let orphans_doc = "Deals with resources no live task references: delete them, or report them. Called only when there are some.";
    quote! {
        #[doc = #doc]
        #[allow(dead_code)]
        pub trait #ident: ::core::marker::Send + ::core::marker::Sync {
            /// An external resource, as listed by [`list_resources`](Self::list_resources).
            type Resource: ::core::marker::Send + ::core::marker::Sync;
            #[doc = #key_doc]
            type Key: ::core::cmp::Eq + ::core::hash::Hash + ::core::marker::Send + ::core::marker::Sync;

            /// Time between two scans in [`run`](Self::run); six hours unless overridden.
            fn interval(&self) -> ::core::time::Duration {
                #rt::reconcile::DEFAULT_INTERVAL
            }

            #[doc = #list_doc]
            fn list_resources(&self) -> #list_ret;

            /// The key of one resource.
            fn resource_key(&self, resource: &Self::Resource) -> Self::Key;

            #[doc = #referenced_doc]
            fn referenced_keys(&self, output: &#output_enum) -> ::std::vec::Vec<Self::Key>;

            #[doc = #orphans_doc]
            fn handle_orphans(&self, orphans: ::std::vec::Vec<Self::Resource>) -> #orphans_ret;

            /// One scan: lists resources, collects the keys referenced by the live
            /// tasks of this saga, and hands the rest to `handle_orphans`.
            fn reconcile_once(&self, engine: &#rt::Engine) -> #once_ret {
                async move {
                    let __resources = self.list_resources().await?;
                    let (__orphans, __report) = #rt::reconcile::find_orphans(
                        engine,
                        #name,
                        #version,
                        __resources,
                        |__resource| self.resource_key(__resource),
                        |__order, __value| {
                            ::core::result::Result::Ok(self.referenced_keys(
                                &#output_enum::__decode(__order, __value)?,
                            ))
                        },
                    )
                    .await?;
                    if !__orphans.is_empty() {
                        self.handle_orphans(__orphans).await?;
                    }
                    ::core::result::Result::Ok(__report)
                }
            }

            /// Scans every [`interval`](Self::interval) until `shutdown` is cancelled.
            /// A failed scan is logged and the next one runs as scheduled.
            fn run(&self, engine: #rt::Engine, shutdown: #rt::CancellationToken) -> #run_ret {
                async move {
                    let __engine = engine;
                    #rt::reconcile::run_every(
                        self.interval(),
                        shutdown,
                        #name,
                        || self.reconcile_once(&__engine),
                    )
                    .await
                }
            }
        }
    }
}
