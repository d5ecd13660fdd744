//! `#[derive(Message)]`: the wire name of a message type and its
//! `#[correlation_id]` field.
//!
//! ```ignore
//! #[derive(Message, Serialize, Deserialize)]
//! #[message(name = "order-submitted")]      // optional; default: the type's name
//! struct OrderSubmitted { #[correlation_id] order_id: Uuid, order_number: String }
//! ```

use proc_macro2::TokenStream;
use quote::quote;
use syn::ext::IdentExt;
use syn::{Attribute, Data, DeriveInput, Expr, Fields, Lit, Member, Meta};

use crate::attr_args::{key_values, name_value, runtime_path};
use crate::ctxt::Ctxt;

pub fn derive(input: TokenStream) -> TokenStream {
    let input = match syn::parse2::<DeriveInput>(input) {
        Ok(input) => input,
        Err(err) => return err.into_compile_error(),
    };
    let cx = Ctxt::new();
    let (name, runtime) = message_args(&cx, &input);
    for attr in input.attrs.iter().filter(|a| is_correlation_id(a)) {
        cx.error_spanned_by(
            attr,
            "`#[correlation_id]` goes on the field that identifies the instance, not on the type: \
             `struct OrderSubmitted { #[correlation_id] order_id: Uuid, .. }`",
        );
    }
    let correlation = match &input.data {
        Data::Struct(data) => correlation_field(&cx, &data.fields),
        Data::Enum(data) => {
            for variant in &data.variants {
                let on_variant = variant.attrs.iter().filter(|a| is_correlation_id(a));
                let on_fields = variant
                    .fields
                    .iter()
                    .flat_map(|f| f.attrs.iter().filter(|a| is_correlation_id(a)));
                for attr in on_variant.chain(on_fields) {
                    cx.error_spanned_by(
                        attr,
                        "`#[correlation_id]` goes on a field of a struct message: the variants of \
                         an enum have no field in common to correlate by; make the message a \
                         struct (an enum works as a `#[timeout]`, which needs no correlation)",
                    );
                }
            }
            None
        }
        Data::Union(data) => {
            cx.error_spanned_by(
                data.union_token,
                "`Message` can't be derived for a union: messages are serialized with serde; use \
                 a struct or an enum",
            );
            None
        }
    };
    let borrowed = borrowed_fields(&cx, &input.data);
    // With errors, implement the trait anyway (without a correlation id) so
    // that the handlers using the message do not add errors of their own.
    let errors = match cx.check() {
        Ok(()) => TokenStream::new(),
        Err(errors) => errors.into_iter().map(|e| e.into_compile_error()).collect(),
    };
    let implementation = implementation(&input, &name, &runtime, correlation.as_ref(), borrowed);
    let crate_root = crate::attr_args::crate_root_check(&runtime);
    quote!(#errors #implementation #crate_root)
}

/// Fields that borrow (`&'static str`): a message is decoded from the queue
/// into a value that owns its data, so serde can't give it a borrowed field
/// (the type is then `Deserialize<'static>` only, not `DeserializeOwned`).
/// Reports each, on its type, with the owned type to use; returns the span
/// of the first, where rustc's own "not general enough" then lands too.
fn borrowed_fields(cx: &Ctxt, data: &Data) -> Option<proc_macro2::Span> {
    let fields: Vec<&syn::Field> = match data {
        Data::Struct(s) => s.fields.iter().collect(),
        Data::Enum(e) => e.variants.iter().flat_map(|v| v.fields.iter()).collect(),
        Data::Union(_) => Vec::new(),
    };
    let mut first = None;
    for field in fields {
        let Some(reference) = find_reference(&field.ty) else {
            continue;
        };
        let owned = owned_type(&reference.elem);
        cx.error_spanned_by(
            reference,
            format!(
                "a message can't borrow: it is decoded from the queue into a value that owns \
                 its data; use an owned type, `{owned}` instead of `{}`",
                crate::types::type_to_string(&syn::Type::Reference(reference.clone())),
            ),
        );
        first.get_or_insert(syn::spanned::Spanned::span(&field.ty));
    }
    first
}

/// The first reference in a type (`&str`, `Option<&str>`, `Vec<&[u8]>`).
fn find_reference(ty: &syn::Type) -> Option<&syn::TypeReference> {
    struct Find<'a>(Option<&'a syn::TypeReference>);
    impl<'a> syn::visit::Visit<'a> for Find<'a> {
        fn visit_type_reference(&mut self, r: &'a syn::TypeReference) {
            if self.0.is_none() {
                self.0 = Some(r);
            }
        }
    }
    let mut find = Find(None);
    syn::visit::Visit::visit_type(&mut find, ty);
    find.0
}

/// `String` for `str`, `Vec<T>` for `[T]`, else the type itself.
fn owned_type(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) if p.path.is_ident("str") => "String".to_owned(),
        syn::Type::Slice(s) => format!("Vec<{}>", crate::types::type_to_string(&s.elem)),
        other => crate::types::type_to_string(other),
    }
}

fn implementation(
    input: &DeriveInput,
    name: &str,
    runtime: &syn::Path,
    correlation: Option<&(Member, syn::Type)>,
    borrowed: Option<proc_macro2::Span>,
) -> TokenStream {
    let rt = quote!(#runtime::__private);
    // With a borrowed field, the impl's `DeserializeOwned` supertrait fails:
    // said on that field, next to the error that says what to use instead.
    let mut ident = input.ident.clone();
    if let Some(span) = borrowed {
        ident.set_span(span);
    }
    let ident = &ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    // A generic message is a message when its parameters allow: say so in
    // the where clause, so the user does not have to repeat serde's bounds.
    let mut where_clause = where_clause.cloned();
    if input.generics.type_params().next().is_some() {
        let predicates = &mut where_clause
            .get_or_insert_with(|| syn::parse_quote!(where))
            .predicates;
        predicates.push(syn::parse_quote! {
            #ident #ty_generics: #rt::Serialize
                + #rt::DeserializeOwned
                + ::core::marker::Send
                + ::core::marker::Sync
                + 'static
        });
        if let Some((_, ty)) = correlation {
            predicates.push(syn::parse_quote!(#ty: #rt::Serialize));
        }
    }
    let body = match correlation.map(|(member, _)| member) {
        Some(member) => quote! {
            ::core::option::Option::Some(#rt::correlation_value(&self.#member))
        },
        None => quote!(::core::option::Option::None),
    };
    let correlated = correlation.map(|_| {
        quote! {
            impl #impl_generics #rt::HasCorrelationId for #ident #ty_generics #where_clause {}
        }
    });
    quote! {
        impl #impl_generics #rt::Message for #ident #ty_generics #where_clause {
            const TYPE: &'static str = #name;
            fn correlation_id(&self) -> ::core::option::Option<::std::string::String> {
                #body
            }
        }
        #correlated
    }
}

fn is_correlation_id(attr: &Attribute) -> bool {
    attr.path().is_ident("correlation_id")
}

/// `#[message(name = "..", crate = ..)]`: the wire name (default: the
/// type's name) and where the runtime is.
fn message_args(cx: &Ctxt, input: &DeriveInput) -> (String, syn::Path) {
    let default = input.ident.unraw().to_string();
    let mut name = None;
    let mut runtime = None;
    let mut seen = false;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("message")) {
        if seen {
            cx.error_spanned_by(attr, "`#[message(..)]` is given twice; keep one");
            continue;
        }
        seen = true;
        let Meta::List(list) = &attr.meta else {
            cx.error_spanned_by(
                attr,
                "write `#[message(name = \"order-submitted\")]` to set the message's wire name \
                 (or leave the attribute out: the default is the type's name)",
            );
            continue;
        };
        let items = match darling::ast::NestedMeta::parse_meta_list(list.tokens.clone()) {
            Ok(items) => items,
            Err(err) => {
                cx.syn_error(err);
                continue;
            }
        };
        let keys = key_values(cx, "message", &["name", "crate"], &[], items);
        if let Some(meta) = keys.get("crate") {
            runtime = runtime_path(cx, meta);
        }
        let Some(meta) = keys.get("name") else {
            continue;
        };
        match name_value(meta) {
            Some(Expr::Lit(syn::ExprLit {
                lit: Lit::Str(s), ..
            })) if s.value().trim().is_empty() => cx.error_spanned_by(
                s,
                "a message's name must not be empty: it is how queued messages and timeouts \
                 name their type; write e.g. `name = \"order-submitted\"` or leave it out",
            ),
            Some(Expr::Lit(syn::ExprLit {
                lit: Lit::Str(s), ..
            })) => name = Some(s.value()),
            Some(other) => cx.error_spanned_by(
                other,
                "expected a string literal: `name = \"order-submitted\"`",
            ),
            None => cx.error_spanned_by(meta, "write `name = \"order-submitted\"`"),
        }
    }
    (
        name.unwrap_or(default),
        runtime.unwrap_or_else(crate::attr_args::default_runtime),
    )
}

/// The one field marked `#[correlation_id]`, if any.
fn correlation_field(cx: &Ctxt, fields: &Fields) -> Option<(Member, syn::Type)> {
    let mut found: Option<(Member, syn::Type, String)> = None;
    for (index, field) in fields.iter().enumerate() {
        for attr in field.attrs.iter().filter(|a| is_correlation_id(a)) {
            if !matches!(attr.meta, Meta::Path(_)) {
                cx.error_spanned_by(
                    attr,
                    "`#[correlation_id]` takes no arguments: write `#[correlation_id]` on the field",
                );
                continue;
            }
            let member = match &field.ident {
                Some(ident) => Member::Named(ident.clone()),
                None => Member::Unnamed(syn::Index {
                    index: u32::try_from(index).unwrap_or(u32::MAX),
                    span: syn::spanned::Spanned::span(&field.ty),
                }),
            };
            let label = match &field.ident {
                Some(ident) => ident.unraw().to_string(),
                None => index.to_string(),
            };
            match &found {
                Some((_, _, first)) => cx.error_spanned_by(
                    attr,
                    format!(
                        "`#[correlation_id]` is already on `{first}`: a message has one \
                         correlation id; correlate other fields with \
                         `#[correlate(state.<field> = msg.<field>)]` on the handler"
                    ),
                ),
                None => found = Some((member, field.ty.clone(), label)),
            }
        }
    }
    found.map(|(member, ty, _)| (member, ty))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(input: TokenStream) -> String {
        derive(input).to_string()
    }

    #[test]
    fn default_name_and_correlation() {
        let out = expand(quote! {
            struct OrderSubmitted { #[correlation_id] order_id: u64, order_number: String }
        });
        assert!(out.contains("\"OrderSubmitted\""), "{out}");
        assert!(
            out.contains("correlation_value (& self . order_id)"),
            "{out}"
        );
    }

    #[test]
    fn renamed_tuple_struct() {
        let out = expand(quote! {
            #[message(name = "payment-due")]
            struct PaymentDue(#[correlation_id] String);
        });
        assert!(out.contains("\"payment-due\""), "{out}");
        assert!(out.contains("& self . 0"), "{out}");
    }

    #[test]
    fn two_correlation_ids_are_an_error() {
        let out = expand(quote! {
            struct M { #[correlation_id] a: u64, #[correlation_id] b: u64 }
        });
        assert!(out.contains("already on `a`"), "{out}");
    }
}
