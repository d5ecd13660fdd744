//! [`Limit`]s -> the `limits: &[LimitSpec { .. }]` of a step's or a
//! handler's definition.
//!
//! The definitions live in a `static` (a saga's) or an inline `const` (a
//! process manager's), so a key's reader is a non-capturing closure,
//! coerced to `LimitKey::of`'s `fn` pointer. Its field accesses carry the
//! user's tokens: a field the input lacks is rustc's own "no field `x` on
//! type `Req`", on that field, a field without `Display` is the
//! `LimitKeyValue` diagnostic and an `Option` field the `KeyIsNotAnOption`
//! one, on the key. The input is decoded the way the
//! rest of the expansion decodes it (the caller's `decode`), so a type that
//! does not decode stays the one error its own check gives.

use proc_macro2::{Literal, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned};
use syn::{Ident, Type};

use super::model::{KeyDef, Limit};

/// `&[#rt::LimitSpec { .. }, ..]` for the limits of `method`, whose input
/// (or message) is `input`. `decode(value)` is an expression turning the
/// `Value` expression `value` into a `Result<input, E: Display>`.
pub fn specs(
    rt: &TokenStream,
    owner: &str,
    method: &Ident,
    limits: &[Limit],
    input: &Type,
    decode: &dyn Fn(TokenStream) -> TokenStream,
) -> TokenStream {
    let specs = limits.iter().map(|limit| {
        let name = limit.name_in(owner, method);
        let concurrency = option(limit.concurrency.as_ref().map(|n| {
            let n = Literal::u32_unsuffixed(**n);
            quote!(#n)
        }));
        let rate = option(limit.rate.as_ref().map(|rate| {
            let count = Literal::u32_unsuffixed(*rate.count);
            let per_ms = Literal::u64_unsuffixed(rate.per_ms());
            let burst = Literal::u32_unsuffixed(rate.burst());
            quote! {
                #rt::Rate {
                    count: #count,
                    per: ::core::time::Duration::from_millis(#per_ms),
                    burst: #burst,
                }
            }
        }));
        let key = option(limit.key.as_ref().map(|key| {
            let expr = key.text();
            let of = key_reader(rt, key, input, decode);
            quote!(#rt::LimitKey { expr: #expr, of: #of })
        }));
        quote! {
            #rt::LimitSpec {
                name: #name,
                concurrency: #concurrency,
                rate: #rate,
                key: #key,
            }
        }
    });
    quote!(&[#(#specs),*])
}

fn option(value: Option<TokenStream>) -> TokenStream {
    match value {
        Some(value) => quote!(::core::option::Option::Some(#value)),
        None => quote!(::core::option::Option::None),
    }
}

/// `|__value| limit_key_from(decode(__value), |__input: &In| <key of __input>)`.
fn key_reader(
    rt: &TokenStream,
    key: &KeyDef,
    input: &Type,
    decode: &dyn Fn(TokenStream) -> TokenStream,
) -> TokenStream {
    let decoded = decode(quote!(::core::clone::Clone::clone(__value)));
    let read = read_key(rt, key, input);
    quote! {
        |__value: &#rt::Value| #rt::limit_key_from(#decoded, #read)
    }
}

/// `|__input: &In| LimitKeyValue::limit_key(LimitKey::probe(&(*__input).a.b).value())`,
/// every generated token of the call on the key's first word and each
/// field on its own: rustc reports an unknown field on that field, and a
/// key that is not `Display` over the key as written (with the runtime
/// trait's message), not on `#[saga]` nor across lines. The probe turns a
/// key through an `Option` into the one error that says a key can't go
/// through one (`KeyIsNotAnOption`), where "not `Display`" would have
/// rustc suggest an `.unwrap()` the key syntax refuses: the field's type
/// is known to the compiler only, the input being declared elsewhere.
fn read_key(rt: &TokenStream, key: &KeyDef, input: &Type) -> TokenStream {
    let span = key.base_span();
    let rt = respan(rt.clone(), span);
    let mut access = quote_spanned!(span=> (*__input));
    for field in &key.fields {
        access = quote_spanned!(span=> #access.#field);
    }
    // `.value()` on the last field, so that the key's errors cover the
    // key as written, from its first word to that field.
    let last = key.fields.last().map_or(span, field_span);
    let value = quote_spanned!(last=> .value());
    quote_spanned! {span=>
        |__input: &#input| #rt::LimitKeyValue::limit_key(#rt::LimitKey::probe(&#access)#value)
    }
}

fn field_span(member: &syn::Member) -> Span {
    match member {
        syn::Member::Named(ident) => ident.span(),
        syn::Member::Unnamed(index) => index.span,
    }
}

/// `tokens`, each at `span` (groups included).
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                tree = TokenTree::Group(inner);
            } else {
                tree.set_span(span);
            }
            tree
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctxt::Ctxt;
    use crate::limit::model::Site;
    use syn::parse_quote;

    #[test]
    fn specs_spell_out_defaults_and_read_keys_through_the_decoder() {
        let cx = Ctxt::new();
        let attrs: Vec<syn::Attribute> = vec![
            parse_quote!(#[limit(concurrency = 10)]),
            parse_quote!(#[limit(rate = 100, key = req.merchant.id, name = "psp")]),
        ];
        let param: Ident = parse_quote!(req);
        let limits = crate::limit::parse::parse_all(&cx, &attrs, Site::Step, Some(&param));
        cx.check().unwrap();
        let rt = quote!(::saga_runtime::__private);
        let method: Ident = parse_quote!(charge);
        let input: Type = parse_quote!(Req);
        let tokens = specs(
            &rt,
            "checkout",
            &method,
            &limits,
            &input,
            &|value| quote!(decode_it(#value)),
        );
        let text = tokens.to_string();
        assert!(text.contains("name : \"checkout.charge\""), "{text}");
        assert!(
            text.contains("concurrency : :: core :: option :: Option :: Some (10)"),
            "{text}"
        );
        assert!(text.contains("name : \"psp\""), "{text}");
        assert!(text.contains("count : 100"), "{text}");
        assert!(text.contains("from_millis (1000)"), "{text}");
        assert!(text.contains("burst : 1 ,"), "{text}");
        assert!(text.contains("expr : \"req.merchant.id\""), "{text}");
        assert!(
            text.contains("decode_it (:: core :: clone :: Clone :: clone (__value))"),
            "{text}"
        );
        assert!(text.contains("| __input : & Req |"), "{text}");
        assert!(
            text.contains("limit_key (:: saga_runtime :: __private :: LimitKey :: probe (& (* __input) . merchant . id) . value ())"),
            "{text}"
        );
        // Valid Rust: an expression.
        syn::parse2::<syn::Expr>(tokens).unwrap();
    }
}
