//! `#[limit(..)]`: flow control on a saga's step or a process manager's
//! handler, shared by `#[saga]` and `#[process_manager]`, in the same
//! stages as they are:
//!
//! 1. `parse.rs`: one attribute -> a [`Limit`](model::Limit) (the IR of
//!    `model.rs`), every setting judged on its own token;
//! 2. `check.rs`: the rules across the methods of one impl (a name is one
//!    budget);
//! 3. `expand.rs`: the IR -> the `limits: &[LimitSpec { .. }]` of the
//!    definition.
//!
//! `#[saga]` and `#[process_manager]` take the attributes off their methods
//! and call these stages; this module's own entry point runs only when a
//! `#[limit]` is used outside both, to say where it belongs.

pub mod check;
pub mod expand;
pub mod model;
pub mod parse;

use proc_macro2::{Span, TokenStream};
use quote::quote;

/// `#[limit]` whose own macro runs: no `#[saga]` nor `#[process_manager]`
/// took it off its method. Says where it belongs, and re-emits the item
/// without any helper of either (a method with `#[saga_step]` and
/// `#[limit]` gives one error, not one per attribute).
pub fn standalone(item: TokenStream) -> TokenStream {
    let message = "`#[limit]` must be on a `#[saga_step]` method of an `impl` block annotated \
                   with `#[saga]`, or on a `#[starts]`, `#[handles]` or `#[timeout]` handler of \
                   one annotated with `#[process_manager(state = ..)]`; add the impl's \
                   attribute (or remove `#[limit]`)";
    // The call site of an attribute macro is the attribute itself.
    let error = syn::Error::new(Span::call_site(), message).into_compile_error();
    let ours = |attr: &syn::Attribute| {
        parse::is_limit(attr)
            || crate::helpers::is_method_helper(attr)
            || crate::process::is_helper(attr)
    };
    let item = match syn::parse2::<syn::ImplItemFn>(item.clone()) {
        Ok(mut method) => {
            method.attrs.retain(|a| !ours(a));
            quote!(#method)
        }
        Err(_) => match syn::parse2::<syn::Item>(item.clone()) {
            Ok(syn::Item::Fn(mut f)) => {
                f.attrs.retain(|a| !ours(a));
                quote!(#f)
            }
            Ok(other) => quote!(#other),
            Err(_) => item,
        },
    };
    quote!(#error #item)
}

#[cfg(test)]
mod tests {
    use quote::quote;

    #[test]
    fn standalone_limit_strips_the_other_helpers() {
        let item = quote! {
            #[saga_step(1)]
            #[handles]
            #[limit(rate = 1)]
            async fn charge(&self) {}
        };
        let out = super::standalone(item).to_string();
        assert!(out.contains("compile_error"), "{out}");
        assert!(out.contains("must be on a `#[saga_step]` method"), "{out}");
        for helper in ["saga_step", "handles", "limit ("] {
            assert!(
                !out.contains(&format!("# [{helper}")),
                "{helper} left in {out}"
            );
        }
    }
}
