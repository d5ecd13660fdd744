//! IR -> tokens. Reads only the [`ProcessDef`].
//!
//! Generated code names everything by absolute path
//! (`::saga_runtime::__private::..`, `::core::..`, `::std::..`) and prefixes
//! its locals with `__`: it lands in the user's module, where `Result`,
//! `Box`, `Value` or `msg` may mean something else.
//!
//! One mistake, one error: what the compiler has to judge (the state's
//! traits, each message's `Message` impl, the correlated fields) is asked
//! with the same expression, on the same tokens, everywhere it is needed:
//! the state through `state_ops::<S>()`, a message through
//! `message_ops::<M>()`, a field through one borrow expression. rustc
//! reports identical diagnostics once, so a missing `Default` or
//! `#[derive(Message)]` is one error, with the runtime trait's message. The
//! trait impl itself has no such bounds: it holds, so registering or using
//! the process manager elsewhere adds no error.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Member, Type};

use super::model::{
    member_name, Concurrency, Correlation, HandlerDef, HandlerKind, OnComplete, ProcessDef,
};
use crate::types::type_to_string;

fn value_type(rt: &TokenStream) -> Type {
    syn::parse_quote!(#rt::Value)
}

/// The full expansion of a valid process manager.
pub fn expand(pm: &ProcessDef) -> TokenStream {
    let item = &pm.item;
    let assertions = assertions(pm);
    let trait_impl = trait_impl(pm);
    quote! {
        #item
        #assertions
        #trait_impl
    }
}

/// What is emitted next to the errors when the process manager is invalid:
/// the user's impl (so their methods exist) and a stand-in trait impl, so
/// that code registering the process manager elsewhere does not add "trait
/// not implemented" errors to the real one.
pub fn fallback(pm: &ProcessDef) -> TokenStream {
    let rt = pm.rt();
    let mut item = pm.item.clone();
    // The handlers are not called from anywhere while the macro is broken.
    item.attrs.push(syn::parse_quote!(#[allow(dead_code)]));
    let state = pm.state.clone().unwrap_or_else(|| value_type(&rt));
    let (impl_generics, where_clause) = impl_header(pm);
    let self_ty = &pm.item.self_ty;
    let name = &pm.name;
    quote! {
        #item
        impl #impl_generics #rt::ProcessManager for #self_ty #where_clause {
            type State = #state;
            const NAME: &'static str = #name;
            fn definition() -> &'static #rt::ProcessDefinition {
                ::core::unreachable!()
            }
            fn new_state() -> Self::State {
                ::core::unreachable!()
            }
            fn encode_state(
                _: &Self::State,
            ) -> ::core::result::Result<#rt::Value, #rt::ProcessError> {
                ::core::unreachable!()
            }
            fn decode_state(
                _: #rt::Value,
            ) -> ::core::result::Result<Self::State, #rt::ProcessError> {
                ::core::unreachable!()
            }
            fn handle<'__a>(
                &'__a self,
                _: &'__a str,
                _: #rt::Value,
                _: &'__a mut Self::State,
                _: &'__a mut #rt::ProcessContext,
            ) -> #rt::BoxFuture<'__a, ::core::result::Result<(), #rt::ProcessError>> {
                ::core::unreachable!()
            }
            fn state_keys(
                _: &Self::State,
            ) -> ::std::vec::Vec<(&'static str, ::std::string::String)> {
                ::core::unreachable!()
            }
            fn message_key(
                _: &str,
                _: &#rt::Value,
            ) -> ::core::result::Result<
                ::core::option::Option<::std::string::String>,
                #rt::ProcessError,
            > {
                ::core::unreachable!()
            }
            fn seed(
                _: &str,
                _: &#rt::Value,
                _: &mut Self::State,
            ) -> ::core::result::Result<(), #rt::ProcessError> {
                ::core::unreachable!()
            }
        }
    }
}

/// `impl<..>` generics and the where clause of the trait impl: the
/// process-manager type must be `Send + Sync + 'static`, and saying so in
/// the where clause turns a type that is not into one error where it is
/// registered ("`Cell<u32>` cannot be shared between threads safely ...
/// required for `Fulfillment` to implement `ProcessManager`"). Without it,
/// the impl's supertraits fail here and every handler's future fails to be
/// `Send` besides. A non-generic type's bound is written under a `for<'_>`
/// binder: rustc rejects a where clause that is false without one
/// ("trivial bounds"), and checks this one where it is used.
fn impl_header(pm: &ProcessDef) -> (TokenStream, TokenStream) {
    let generics = &pm.item.generics;
    let (impl_generics, _, _) = generics.split_for_impl();
    let mut where_clause = generics
        .where_clause
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(where));
    let self_ty = &pm.item.self_ty;
    if generics.params.is_empty() {
        where_clause.predicates.push(syn::parse_quote!(
            for<'__shared> #self_ty: ::core::marker::Send + ::core::marker::Sync
        ));
    } else {
        where_clause.predicates.push(syn::parse_quote!(
            #self_ty: ::core::marker::Send + ::core::marker::Sync + 'static
        ));
    }
    (quote!(#impl_generics), quote!(#where_clause))
}

/// `state_ops::<S>()`: everything generated code does with the state, and
/// the one check of its traits (see the module doc).
fn state_ops(rt: &TokenStream, state: &Type) -> TokenStream {
    quote_spanned!(state.span()=> #rt::state_ops::<#state>())
}

/// `message_ops::<M>()`, the same for a message type.
fn message_ops(rt: &TokenStream, message: &Type) -> TokenStream {
    quote_spanned!(message.span()=> #rt::message_ops::<#message>())
}

/// The distinct message types, in handler order (`check` made them
/// distinct already; this keeps the where clause tidy).
fn messages(pm: &ProcessDef) -> Vec<&Type> {
    pm.handlers
        .iter()
        .filter_map(|h| h.message.as_ref())
        .collect()
}

fn message_of(rt: &TokenStream, handler: &HandlerDef) -> Type {
    handler.message.clone().unwrap_or_else(|| value_type(rt))
}

/// `&mut __state.<field>` / `&mut __msg.<field>`, every token on the user's
/// field: rustc's "no field" or "private field" and `same_field`'s type
/// error point there, and the same expression in several places gives one
/// (deduplicated) diagnostic.
fn field_span(member: &Member) -> Span {
    match member {
        Member::Named(ident) => ident.span(),
        Member::Unnamed(index) => index.span,
    }
}

fn state_field(member: &Member) -> TokenStream {
    quote_spanned!(field_span(member)=> &mut (*__state).#member)
}

fn message_field(member: &Member) -> TokenStream {
    quote_spanned!(field_span(member)=> &mut __msg.#member)
}

/// `[&mut state.a, &mut msg.b]` as one type, asked through
/// `same_field` (whose message says what a correlation needs) and spanned
/// on the message's field: the same tokens wherever the pair is needed, so
/// a mismatch is one error.
fn same_field(rt: &TokenStream, state: &Member, message: &Member) -> TokenStream {
    let span = field_span(message);
    let state = state_field(state);
    let message = message_field(message);
    quote_spanned!(span=> #rt::same_field(#state, #message))
}

/// Shared-reference forms of the two, for reading the key.
fn state_field_ref(member: &Member) -> TokenStream {
    quote_spanned!(field_span(member)=> &(*__state).#member)
}

fn message_field_ref(member: &Member) -> TokenStream {
    quote_spanned!(field_span(member)=> &__msg.#member)
}

/// The compile-time assertions, spanned on the user's tokens.
fn assertions(pm: &ProcessDef) -> TokenStream {
    let rt = pm.rt();
    let mut calls = TokenStream::new();
    if let Some(state) = &pm.state {
        let ops = state_ops(&rt, state);
        calls.extend(quote!(let _ = #ops;));
    }
    // A starting or continuing handler without `#[correlate]` finds its
    // instance by the message's correlation id, so its message must have
    // one. That is asked only of a type that is a message at all: a type
    // without `#[derive(Message)]` gets the one error that says so.
    let correlated: Vec<&Type> = pm
        .handlers
        .iter()
        .filter(|h| matches!(h.correlation, Correlation::Id))
        .filter_map(|h| h.message.as_ref())
        .collect();
    for message in messages(pm) {
        let ops = message_ops(&rt, message);
        calls.extend(quote!(let _ = #ops;));
        if correlated.iter().any(|c| **c == *message) {
            calls.extend(quote_spanned!(message.span()=>
                (&__IfMessage::<#message>(::core::marker::PhantomData)).__assert_correlated();
            ));
        }
    }
    let correlations = pm.handlers.iter().filter_map(|handler| {
        let Correlation::Field { state, message } = &handler.correlation else {
            return None;
        };
        let state_ty = pm.state.as_ref()?;
        let message_ty = handler.message.as_ref()?;
        let ident = format_ident!("__correlate_{}", handler.ident);
        let same = same_field(&rt, pm.first_mention(state), message);
        Some(quote! {
            #[allow(dead_code, non_snake_case)]
            fn #ident(__state: &mut #state_ty, mut __msg: #message_ty) {
                let _ = #same;
            }
        })
    });
    let routing = routing_assertions(&rt, pm);
    quote! {
        const _: () = {
            // The inherent method applies only to messages (method lookup
            // then asks for a correlation id); for any other type lookup
            // falls back to the trait's, which asks nothing.
            #[allow(dead_code)]
            struct __IfMessage<__T>(::core::marker::PhantomData<__T>);
            #[allow(dead_code)]
            impl<__T: #rt::Message> __IfMessage<__T> {
                fn __assert_correlated(&self)
                where
                    __T: #rt::HasCorrelationId,
                {
                }
            }
            #[allow(dead_code)]
            trait __NotAMessage {
                fn __assert_correlated(&self) {}
            }
            impl<__T> __NotAMessage for __IfMessage<__T> {}
            #[allow(dead_code)]
            fn __assert() {
                #calls
            }
            #(#correlations)*
            #routing
        };
    }
}

/// Messages are routed to a handler by their type's `Message::TYPE`, so
/// two handlers must not get one type, nor two types with one wire name.
/// `check` compares the types as written; this asks the compiler, which
/// sees through an alias or another path (`type Submitted =
/// OrderSubmitted`) and reads `#[message(name = "..")]`, with two const
/// assertions per pair of handlers, spanned on the second one's message
/// type, whose messages name both handlers and the fix:
///
/// - whether the two are one type: `__Pair::<A, B>::SAME` is the inherent
///   const of `__Pair<T, T>` when they are, else the trait's `false`;
/// - otherwise, whether their wire names are equal.
///
/// One mistake is one error: the assertions are in one const, whose
/// evaluation stops at the first; the second asks for the wire names only
/// of two types that differ; a type that is not a message is the one error
/// `message_ops` gives everywhere (same tokens, and a body with an error is
/// not evaluated). Impls over the types (rustc's "conflicting
/// implementations") would say less, and an unknown type in an impl header
/// gets a second "cannot find type", with a help to add a type parameter.
fn routing_assertions(rt: &TokenStream, pm: &ProcessDef) -> TokenStream {
    let handled: Vec<(&HandlerDef, &Type)> = pm
        .handlers
        .iter()
        .filter_map(|h| h.message.as_ref().map(|m| (h, m)))
        .collect();
    let mut pairs = TokenStream::new();
    for (i, (second, second_ty)) in handled.iter().enumerate() {
        for (first, first_ty) in &handled[..i] {
            let (first_name, second_name) = (type_to_string(first_ty), type_to_string(second_ty));
            let same_type = format_literal(format!(
                "`{second_name}` (the message of `{}`) is the same type as `{first_name}` (the \
                 message of `{}`), named another way (an alias, a re-export or another path): \
                 messages are routed by type, so a process manager has one handler per message \
                 type; merge `{}` into `{}`",
                second.ident, first.ident, second.ident, first.ident,
            ));
            let same_name = format_literal(format!(
                "`{second_name}` (the message of `{}`) has the same wire name as \
                 `{first_name}` (the message of `{}`): a process manager routes a message to \
                 its handler by `Message::TYPE`, so it could not tell the two apart; give one \
                 of them a different `#[message(name = \"..\")]`",
                second.ident, first.ident,
            ));
            let (first_ops, second_ops) = (message_ops(rt, first_ty), message_ops(rt, second_ty));
            pairs.extend(quote_spanned! {second_ty.span()=>
                ::core::assert!(!__Pair::<#first_ty, #second_ty>::SAME, #same_type);
                ::core::assert!(
                    __Pair::<#first_ty, #second_ty>::SAME
                        || !__same_wire_name(#first_ops.type_name, #second_ops.type_name),
                    #same_name
                );
            });
        }
    }
    if pairs.is_empty() {
        return pairs;
    }
    quote! {
        #[allow(dead_code)]
        struct __Pair<__A: ?::core::marker::Sized, __B: ?::core::marker::Sized>(
            ::core::marker::PhantomData<fn() -> (*const __A, *const __B)>,
        );
        // Used only where two types are one.
        #[allow(dead_code)]
        impl<__T: ?::core::marker::Sized> __Pair<__T, __T> {
            const SAME: bool = true;
        }
        trait __Distinct {
            const SAME: bool = false;
        }
        impl<__A: ?::core::marker::Sized, __B: ?::core::marker::Sized> __Distinct
            for __Pair<__A, __B>
        {
        }
        const fn __same_wire_name(__a: &str, __b: &str) -> bool {
            let (__a, __b) = (__a.as_bytes(), __b.as_bytes());
            if __a.len() != __b.len() {
                return false;
            }
            let mut __i = 0;
            while __i < __a.len() {
                if __a[__i] != __b[__i] {
                    return false;
                }
                __i += 1;
            }
            true
        }
        #pairs
    }
}

/// `message` as the literal format string of an `assert!` (a type may be
/// written with braces, `Batch<{ N }>`).
fn format_literal(message: String) -> TokenStream {
    let message = message.replace('{', "{{").replace('}', "}}");
    quote!(#message)
}

fn trait_impl(pm: &ProcessDef) -> TokenStream {
    let rt = pm.rt();
    let state = pm.state.clone().unwrap_or_else(|| value_type(&rt));
    let (impl_generics, where_clause) = impl_header(pm);
    let self_ty = &pm.item.self_ty;
    let name = &pm.name;
    let state_type = type_to_string(&state);
    let ops = state_ops(&rt, &state);
    let handlers = pm.handlers.iter().map(|h| handler_definition(pm, h));
    let on_complete = match pm.on_complete {
        OnComplete::Keep => quote!(Keep),
        OnComplete::Delete => quote!(Delete),
    };
    let concurrency = match pm.concurrency {
        Concurrency::Optimistic => quote!(Optimistic),
        Concurrency::Pessimistic => quote!(Pessimistic),
    };
    let handle_arms = pm.handlers.iter().map(|h| handle_arm(&rt, h));
    let state_keys = pm.state_keys().into_iter().map(|member| {
        let key = member_name(member);
        let field = state_field_ref(member);
        quote!((#key, #rt::correlation_value(#field)))
    });
    let message_key_arms = pm.handlers.iter().filter_map(|h| message_key_arm(&rt, h));
    let seed_arms = pm.handlers.iter().filter_map(|h| seed_arm(pm, h));
    let on_error = pm.on_errors.first().map(|on_error| {
        let method = &on_error.ident;
        quote! {
            fn on_error(&self, __failure: &#rt::Failure) -> #rt::ErrorAction {
                Self::#method(self, __failure)
            }
        }
    });

    quote! {
        impl #impl_generics #rt::ProcessManager for #self_ty #where_clause {
            type State = #state;
            const NAME: &'static str = #name;

            fn definition() -> &'static #rt::ProcessDefinition {
                // Evaluated at compile time (message types come from
                // `message_ops`, a `const fn`); unlike a `static` item an
                // inline `const` may sit in a generic impl.
                const {
                    &#rt::ProcessDefinition {
                        name: #name,
                        state_type: #state_type,
                        handlers: &[#(#handlers),*],
                        on_complete: #rt::OnComplete::#on_complete,
                        concurrency: #rt::Concurrency::#concurrency,
                    }
                }
            }

            fn new_state() -> Self::State {
                (#ops.fresh)()
            }

            fn encode_state(
                __state: &Self::State,
            ) -> ::core::result::Result<#rt::Value, #rt::ProcessError> {
                (#ops.encode)(__state)
            }

            fn decode_state(
                __state: #rt::Value,
            ) -> ::core::result::Result<Self::State, #rt::ProcessError> {
                (#ops.decode)(__state)
            }

            fn handle<'__a>(
                &'__a self,
                __message_type: &'__a str,
                __message: #rt::Value,
                __state: &'__a mut Self::State,
                __ctx: &'__a mut #rt::ProcessContext,
            ) -> #rt::BoxFuture<'__a, ::core::result::Result<(), #rt::ProcessError>> {
                #(#handle_arms)*
                #rt::unknown_message(#name, __message_type)
            }

            fn state_keys(
                __state: &Self::State,
            ) -> ::std::vec::Vec<(&'static str, ::std::string::String)> {
                ::std::vec![#(#state_keys),*]
            }

            fn message_key(
                __message_type: &str,
                __message: &#rt::Value,
            ) -> ::core::result::Result<
                ::core::option::Option<::std::string::String>,
                #rt::ProcessError,
            > {
                #(#message_key_arms)*
                ::core::result::Result::Ok(::core::option::Option::None)
            }

            fn seed(
                __message_type: &str,
                __message: &#rt::Value,
                __state: &mut Self::State,
            ) -> ::core::result::Result<(), #rt::ProcessError> {
                #(#seed_arms)*
                ::core::result::Result::Ok(())
            }

            #on_error
        }
    }
}

fn handler_definition(pm: &ProcessDef, handler: &HandlerDef) -> TokenStream {
    let rt = &pm.rt();
    let method = handler.ident.to_string();
    let message = message_of(rt, handler);
    let ops = message_ops(rt, &message);
    // A keyed limit decodes the message through the same `message_ops`
    // as the handler: a type that is not a message stays one error.
    let limits = crate::limit::expand::specs(
        rt,
        &pm.name,
        &handler.ident,
        &handler.limits,
        &message,
        &|value| quote!((#ops.decode)(#value)),
    );
    let kind = match handler.kind {
        HandlerKind::Starts { strict } => quote!(Starts { strict: #strict }),
        HandlerKind::Handles { strict, many } => quote!(Handles { strict: #strict, many: #many }),
        HandlerKind::Timeout => quote!(Timeout),
    };
    let correlation = match &handler.correlation {
        Correlation::Id => quote!(Id),
        Correlation::Field { state, message } => {
            let state = member_name(state);
            let message = member_name(message);
            quote!(Field { state_field: #state, message_field: #message })
        }
        Correlation::Instance => quote!(Instance),
    };
    let hold = match handler.unmatched.hold_ms {
        Some(ms) => {
            let ms = proc_macro2::Literal::u64_unsuffixed(ms);
            quote!(::core::option::Option::Some(::core::time::Duration::from_millis(#ms)))
        }
        None => quote!(::core::option::Option::None),
    };
    let then = match handler.unmatched.dead_letter {
        Some(true) => quote!(::core::option::Option::Some(#rt::AfterHold::DeadLetter)),
        Some(false) => quote!(::core::option::Option::Some(#rt::AfterHold::Drop)),
        None => quote!(::core::option::Option::None),
    };
    quote! {
        #rt::HandlerDefinition {
            method: #method,
            message_type: #ops.type_name,
            kind: #rt::HandlerKind::#kind,
            correlation: #rt::Correlation::#correlation,
            limits: #limits,
            unmatched: #rt::Unmatched { hold: #hold, then: #then },
        }
    }
}

fn handle_arm(rt: &TokenStream, handler: &HandlerDef) -> TokenStream {
    let method = &handler.ident;
    let message = message_of(rt, handler);
    // The declared state, handed over as the handler's own state type: the
    // compiler judges whether the two are the same (an alias passes), and a
    // mismatch is one error on the parameter's type.
    let state = match &handler.state {
        Some(ty) => quote_spanned!(ty.span()=> #rt::same_state::<_, #ty>(__state)),
        None => quote!(__state),
    };
    // Spanned on the method so that, say, a future that is not `Send` is
    // reported at the handler rather than at `#[process_manager]`.
    let ops = message_ops(rt, &message);
    let boxed = quote_spanned! {method.span()=>
        ::std::boxed::Box::pin(async move {
            let __msg: #message = (#ops.decode)(__message)?;
            Self::#method(self, __msg, #state, __ctx).await
        })
    };
    quote! {
        if __message_type == #ops.type_name {
            return #boxed;
        }
    }
}

fn message_key_arm(rt: &TokenStream, handler: &HandlerDef) -> Option<TokenStream> {
    let message = message_of(rt, handler);
    let ops = message_ops(rt, &message);
    let key = match &handler.correlation {
        Correlation::Instance => return None,
        Correlation::Id => quote!((#ops.correlation_id)(&__msg)),
        Correlation::Field { message: field, .. } => {
            let field = message_field_ref(field);
            quote!(::core::option::Option::Some(#rt::correlation_value(#field)))
        }
    };
    Some(quote! {
        if __message_type == #ops.type_name {
            let __msg: #message = (#ops.decode)(::core::clone::Clone::clone(__message))?;
            return ::core::result::Result::Ok(#key);
        }
    })
}

/// A starting message's mapped field, moved into the fresh state.
fn seed_arm(pm: &ProcessDef, handler: &HandlerDef) -> Option<TokenStream> {
    let (HandlerKind::Starts { .. }, Correlation::Field { state, message }) =
        (handler.kind, &handler.correlation)
    else {
        return None;
    };
    let rt = &pm.rt();
    let message_ty = message_of(rt, handler);
    let ops = message_ops(rt, &message_ty);
    let same = same_field(rt, pm.first_mention(state), message);
    Some(quote! {
        if __message_type == #ops.type_name {
            let mut __msg: #message_ty = (#ops.decode)(::core::clone::Clone::clone(__message))?;
            let [__dst, __src] = #same;
            ::core::mem::swap(__dst, __src);
        }
    })
}
