//! The helper attributes' own entry points.
//!
//! `#[saga]` removes its helper attributes from the methods before the
//! compiler resolves them, so these entry points run only when a helper is
//! used where no `#[saga]` will read it. They then say where it belongs, and
//! re-emit the item without any of our helpers so that one misplaced method
//! gives one error rather than one per attribute.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::Attribute;

/// Names of the attributes `#[saga]` reads from its methods.
pub const METHOD_HELPERS: [&str; 5] = [
    "saga_step",
    "retry_policy",
    "compensation_retry_policy",
    "compensate",
    "circuit_breaker",
];

/// The last segment of an attribute's path: what `#[saga]` matches on, so that
/// `#[saga_runtime::saga_step(1)]` works like `#[saga_step(1)]`.
pub fn attr_name(attr: &Attribute) -> Option<String> {
    attr.path().segments.last().map(|s| s.ident.to_string())
}

/// One of `METHOD_HELPERS`, or `#[limit]` (only as `limit` or
/// `saga_runtime::limit`: another crate's `#[x::limit]` is left alone).
pub fn is_method_helper(attr: &Attribute) -> bool {
    attr_name(attr).is_some_and(|n| METHOD_HELPERS.contains(&n.as_str()))
        || crate::limit::parse::is_limit(attr)
}

fn is_saga_attr(attr: &Attribute) -> bool {
    attr_name(attr).as_deref() == Some("saga")
}

/// A helper attribute used outside a `#[saga]` impl.
pub fn standalone(name: &str, _args: TokenStream, item: TokenStream) -> TokenStream {
    let message = format!(
        "`#[{name}]` must be on a method of an `impl` block annotated with `#[saga]`; \
         add `#[saga]` to the impl block (or remove `#[{name}]`)"
    );
    // The call site of an attribute macro is the attribute itself.
    let error = syn::Error::new(Span::call_site(), message).into_compile_error();
    let item = match syn::parse2::<syn::Item>(item.clone()) {
        Ok(mut parsed) => {
            strip_item_helpers(&mut parsed);
            quote!(#parsed)
        }
        // A method inside an impl is not an `Item`; try that shape.
        Err(_) => match syn::parse2::<syn::ImplItemFn>(item.clone()) {
            Ok(mut method) => {
                method.attrs.retain(|a| !is_method_helper(a));
                quote!(#method)
            }
            Err(_) => item,
        },
    };
    quote!(#error #item)
}

fn strip_item_helpers(item: &mut syn::Item) {
    let attrs = match item {
        syn::Item::Fn(f) => &mut f.attrs,
        syn::Item::Impl(i) => &mut i.attrs,
        syn::Item::Struct(s) => &mut s.attrs,
        syn::Item::Enum(e) => &mut e.attrs,
        _ => return,
    };
    attrs.retain(|a| !is_method_helper(a));
}

/// `#[cancellable]`. Placed below `#[saga]` it never runs (`#[saga]` consumes
/// it); placed above, it runs first and moves itself just below `#[saga]` so
/// that `#[saga]` sees it. Either order therefore means the same.
pub fn cancellable(args: TokenStream, item: TokenStream) -> TokenStream {
    let Ok(mut parsed) = syn::parse2::<syn::Item>(item.clone()) else {
        return misplaced_cancellable(item);
    };
    let attrs = match &mut parsed {
        syn::Item::Impl(i) => &mut i.attrs,
        syn::Item::Struct(s) => &mut s.attrs,
        syn::Item::Enum(e) => &mut e.attrs,
        syn::Item::Fn(f) => &mut f.attrs,
        syn::Item::Trait(t) => &mut t.attrs,
        _ => return misplaced_cancellable(item),
    };
    // Even on something that is not an impl: `#[saga]` reports that, once.
    let Some(pos) = attrs.iter().position(is_saga_attr) else {
        return misplaced_cancellable(item);
    };
    let marker: Attribute = if args.is_empty() {
        syn::parse_quote!(#[cancellable])
    } else {
        // Keep the arguments so that `#[saga]` reports them on their tokens.
        syn::parse_quote!(#[cancellable(#args)])
    };
    attrs.insert(pos + 1, marker);
    quote!(#parsed)
}

fn misplaced_cancellable(item: TokenStream) -> TokenStream {
    let error = syn::Error::new(
        Span::call_site(),
        "`#[cancellable]` goes next to `#[saga]` on the saga's impl block: \
         `#[saga] #[cancellable] impl MySaga { .. }`",
    )
    .into_compile_error();
    quote!(#error #item)
}
