//! What `#[saga]` and `#[process_manager]` share about the item they are
//! written on: naming a misplaced item, and finding the impl's generic
//! parameters inside a type.

use proc_macro2::{Ident, TokenStream};
use quote::ToTokens;
use syn::visit::Visit;
use syn::{Generics, Type};

/// How to name a non-impl item in an error ("a struct"), and the token to
/// point at (its name).
pub fn describe(item: &syn::Item) -> (&'static str, TokenStream) {
    match item {
        syn::Item::Struct(s) => ("a struct", s.ident.to_token_stream()),
        syn::Item::Enum(e) => ("an enum", e.ident.to_token_stream()),
        syn::Item::Fn(f) => ("a function", f.sig.ident.to_token_stream()),
        syn::Item::Trait(t) => ("a trait", t.ident.to_token_stream()),
        syn::Item::Mod(m) => ("a module", m.ident.to_token_stream()),
        other => ("this item", other.to_token_stream()),
    }
}

/// The impl's type and const parameters.
pub fn params(generics: &Generics) -> Vec<Ident> {
    generics
        .type_params()
        .map(|p| p.ident.clone())
        .chain(generics.const_params().map(|p| p.ident.clone()))
        .collect()
}

/// The first of `params` that `ty` uses (as a type, or as a const in
/// `[u8; N]`), if any.
pub fn param_used_in(ty: &Type, params: &[Ident]) -> Option<Ident> {
    let mut finder = FindParam {
        params,
        found: None,
    };
    finder.visit_type(ty);
    finder.found
}

struct FindParam<'a> {
    params: &'a [Ident],
    found: Option<Ident>,
}

impl<'ast> Visit<'ast> for FindParam<'_> {
    fn visit_type_path(&mut self, ty: &'ast syn::TypePath) {
        if self.found.is_some() {
            return;
        }
        if ty.qself.is_none() && ty.path.leading_colon.is_none() {
            if let Some(first) = ty.path.segments.first() {
                if self.params.contains(&first.ident) {
                    self.found = Some(first.ident.clone());
                    return;
                }
            }
        }
        syn::visit::visit_type_path(self, ty);
    }

    fn visit_expr_path(&mut self, expr: &'ast syn::ExprPath) {
        // `[u8; N]`
        if self.found.is_none() {
            if let Some(ident) = expr.path.get_ident() {
                if self.params.contains(ident) {
                    self.found = Some(ident.clone());
                    return;
                }
            }
        }
        syn::visit::visit_expr_path(self, expr);
    }
}

/// Removes the helper attributes `is_helper` picks, returning them in
/// source order.
pub fn take_helpers(
    attrs: &mut Vec<syn::Attribute>,
    is_helper: fn(&syn::Attribute) -> bool,
) -> Vec<syn::Attribute> {
    let (helpers, kept) = std::mem::take(attrs).into_iter().partition(is_helper);
    *attrs = kept;
    helpers
}

/// The walk `#[saga]` and `#[process_manager]` make over their impl: each
/// method with its helper attributes taken off, for `method` to parse
/// (what it returns is kept); the helpers on a const, type or macro item
/// taken off too and handed to `elsewhere` to report. Taking them off
/// everywhere is what keeps the compiler from adding "cannot find
/// attribute" to our own error.
pub fn walk_methods<T>(
    item: &mut syn::ItemImpl,
    is_helper: fn(&syn::Attribute) -> bool,
    mut method: impl FnMut(&mut syn::ImplItemFn, Vec<syn::Attribute>) -> Option<T>,
    mut elsewhere: impl FnMut(Vec<syn::Attribute>),
) -> Vec<T> {
    let mut parsed = Vec::new();
    for impl_item in &mut item.items {
        match impl_item {
            syn::ImplItem::Fn(m) => {
                let helpers = take_helpers(&mut m.attrs, is_helper);
                parsed.extend(method(m, helpers));
            }
            syn::ImplItem::Const(c) => elsewhere(take_helpers(&mut c.attrs, is_helper)),
            syn::ImplItem::Type(t) => elsewhere(take_helpers(&mut t.attrs, is_helper)),
            syn::ImplItem::Macro(m) => elsewhere(take_helpers(&mut m.attrs, is_helper)),
            _ => {}
        }
    }
    parsed
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    #[test]
    fn finds_type_and_const_parameters_but_not_qualified_paths() {
        let params: Vec<Ident> = vec![parse_quote!(T), parse_quote!(N)];
        let found = |ty: Type| param_used_in(&ty, &params).map(|i| i.to_string());
        assert_eq!(found(parse_quote!(Vec<T>)), Some("T".into()));
        assert_eq!(found(parse_quote!([u8; N])), Some("N".into()));
        assert_eq!(found(parse_quote!(::crate_a::T)), None);
        assert_eq!(found(parse_quote!(String)), None);
    }
}
