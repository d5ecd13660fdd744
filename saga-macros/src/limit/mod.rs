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
    let ours = |attr: &syn::Attribute| {
        parse::is_limit(attr)
            || crate::helpers::is_method_helper(attr)
            || crate::process::is_helper(attr)
    };
    let (message, item) = match syn::parse2::<syn::ImplItemFn>(item.clone()) {
        Ok(mut method) => {
            let message = on_method(&method.attrs, &method.sig.ident);
            method.attrs.retain(|a| !ours(a));
            (message, quote!(#method))
        }
        Err(_) => match syn::parse2::<syn::Item>(item.clone()) {
            Ok(syn::Item::Fn(mut f)) => {
                let message = on_method(&f.attrs, &f.sig.ident);
                f.attrs.retain(|a| !ours(a));
                (message, quote!(#f))
            }
            // Above `#[saga]` or `#[process_manager]`, which then expand
            // as usual: this is the one error.
            Ok(syn::Item::Impl(block)) => (on_impl(&block), quote!(#block)),
            Ok(other) => (IN_AN_IMPL.to_owned(), quote!(#other)),
            Err(_) => (IN_AN_IMPL.to_owned(), item),
        },
    };
    // The call site of an attribute macro is the attribute itself.
    let error = syn::Error::new(Span::call_site(), message).into_compile_error();
    quote!(#error #item)
}

/// On a step or handler whose impl block lacks its attribute: that is the
/// fix.
const IN_AN_IMPL: &str = "`#[limit]` must be on a `#[saga_step]` method of an `impl` block \
                          annotated with `#[saga]`, or on a `#[starts]`, `#[handles]` or \
                          `#[timeout]` handler of one annotated with \
                          `#[process_manager(state = ..)]`; add the impl's attribute (or \
                          remove `#[limit]`)";

/// The methods of a saga's generated `{Saga}Reconciliation` trait that a
/// user implements (or may override).
const RECONCILIATION_METHODS: [&str; 5] = [
    "list_resources",
    "resource_key",
    "referenced_keys",
    "handle_orphans",
    "reconcile_once",
];

/// A method marked as a step or handler is in an impl that lacks its
/// attribute; any other one (a method of a trait impl, such as a
/// reconciliation's) is no place for a limit, and adding `#[saga]` to its
/// impl would not help.
fn on_method(attrs: &[syn::Attribute], ident: &syn::Ident) -> String {
    let marked = attrs
        .iter()
        .any(|a| crate::helpers::is_method_helper(a) && !parse::is_limit(a))
        || attrs
            .iter()
            .any(|a| crate::process::is_helper(a) && !parse::is_limit(a));
    if marked {
        return IN_AN_IMPL.to_owned();
    }
    let name = syn::ext::IdentExt::unraw(ident).to_string();
    let what = if RECONCILIATION_METHODS.contains(&name.as_str()) {
        format!(
            "`{name}` is a method of a saga's reconciliation, whose scans run outside the \
             steps (space them with `interval` instead): remove `#[limit]`"
        )
    } else {
        format!("`{name}` is neither a step nor a handler: mark it as one, or remove `#[limit]`")
    };
    format!(
        "`#[limit]` goes on a step (a `#[saga_step]` method of a `#[saga]` impl) or on a \
         process manager's `#[starts]`, `#[handles]` or `#[timeout]` handler, and there is \
         no saga-wide limit; {what}"
    )
}

/// On the impl block itself: limits are per step or handler.
fn on_impl(block: &syn::ItemImpl) -> String {
    let named = |name: &str| {
        block
            .attrs
            .iter()
            .any(|a| crate::helpers::attr_name(a).as_deref() == Some(name))
    };
    let site = if named("process_manager") {
        model::Site::Handler
    } else {
        model::Site::Step
    };
    parse::on_impl_message(site).to_owned()
}

#[cfg(test)]
mod tests {
    use quote::quote;

    #[test]
    fn standalone_limit_says_where_limits_go() {
        let above_saga = quote! {
            #[saga(name = "checkout")]
            impl Checkout {}
        };
        let out = super::standalone(above_saga).to_string();
        assert!(out.contains("there is no saga-wide limit"), "{out}");
        // `#[saga]` stays, to expand as usual.
        assert!(out.contains("# [saga (name"), "{out}");

        let above_process = quote! {
            #[process_manager(state = S)]
            impl Fulfillment {}
        };
        let out = super::standalone(above_process).to_string();
        assert!(
            out.contains("no limit for a whole process manager"),
            "{out}"
        );

        let reconciliation = quote! {
            async fn list_resources(&self) -> Result<Vec<String>, ReconcileError> { Ok(Vec::new()) }
        };
        let out = super::standalone(reconciliation).to_string();
        assert!(out.contains("a method of a saga's reconciliation"), "{out}");
        assert!(out.contains("there is no saga-wide limit"), "{out}");

        let plain = quote!(
            fn charge(&self) {}
        );
        let out = super::standalone(plain).to_string();
        assert!(
            out.contains("`charge` is neither a step nor a handler"),
            "{out}"
        );
    }

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
