//! Reading `key = value` attribute arguments, shared by `#[saga]`, its
//! helper attributes, `#[process_manager]` and `#[derive(Message)]`: one
//! set of messages for unknown keys (with "did you mean"), repeated keys
//! and malformed values.

use std::collections::BTreeMap;

use darling::ast::NestedMeta;
use syn::spanned::Spanned;
use syn::{Expr, Lit, Meta, Type};

use crate::ctxt::Ctxt;
use crate::suggest;

/// Splits `key = value` items into a map, reporting malformed items, unknown
/// keys (with a suggestion) and repeated keys. `flags` may also be written
/// as a bare word.
pub fn key_values(
    cx: &Ctxt,
    attr: &str,
    known: &[&str],
    flags: &[&str],
    items: Vec<NestedMeta>,
) -> BTreeMap<String, Meta> {
    let mut map = BTreeMap::new();
    for item in items {
        let meta = match item {
            NestedMeta::Meta(meta) => meta,
            NestedMeta::Lit(lit) => {
                cx.error_spanned_by(
                    &lit,
                    format!(
                        "expected `key = value` in `#[{attr}]`; keys: {}",
                        known.join(", ")
                    ),
                );
                continue;
            }
            NestedMeta::NameValueInvalidExpr(nv) => {
                cx.error_spanned_by(
                    &nv.value,
                    format!(
                        "this value can't be read; write `{} = value`",
                        path_str(&nv.path)
                    ),
                );
                continue;
            }
        };
        let key = path_str(meta.path());
        if !known.contains(&key.as_str()) {
            cx.error_spanned_by(
                meta.path(),
                suggest::unknown(&format!("unknown key `{key}` in `#[{attr}]`"), &key, known),
            );
            continue;
        }
        let shape_ok = match &meta {
            Meta::NameValue(_) => true,
            Meta::Path(_) => flags.contains(&key.as_str()),
            Meta::List(_) => false,
        };
        if !shape_ok {
            cx.error_spanned_by(&meta, format!("write `{key} = value` in `#[{attr}]`"));
            continue;
        }
        if map.contains_key(&key) {
            cx.error_spanned_by(
                meta.path(),
                format!("`{key}` is given twice in `#[{attr}]`; keep one"),
            );
            continue;
        }
        map.insert(key, meta);
    }
    map
}

pub fn path_str(path: &syn::Path) -> String {
    path.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

pub fn name_value(meta: &Meta) -> Option<&Expr> {
    match meta {
        Meta::NameValue(nv) => Some(&nv.value),
        _ => None,
    }
}

/// An enum-like value written as a bare identifier (`backoff = linear`) or
/// a string (`backoff = "linear"`).
pub fn choice<T: Copy>(cx: &Ctxt, meta: &Meta, what: &str, values: &[(&str, T)]) -> Option<T> {
    let key = path_str(meta.path());
    let expr = name_value(meta)?;
    let names: Vec<&str> = values.iter().map(|(n, _)| *n).collect();
    let (word, span) = match expr {
        Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => (
            p.path
                .get_ident()
                .map(ToString::to_string)
                .unwrap_or_default(),
            p.span(),
        ),
        Expr::Lit(syn::ExprLit {
            lit: Lit::Str(s), ..
        }) => (s.value(), s.span()),
        other => {
            cx.error_spanned_by(
                other,
                format!(
                    "expected one of {}, e.g. `{key} = {}`",
                    names.join(", "),
                    names[0]
                ),
            );
            return None;
        }
    };
    match values.iter().find(|(n, _)| *n == word) {
        Some((_, value)) => Some(*value),
        None => {
            cx.error_at(
                span,
                suggest::unknown(&format!("unknown {what} `{word}`"), &word, &names),
            );
            None
        }
    }
}

pub fn last_segment(ty: &Type) -> Option<&syn::PathSegment> {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last(),
        Type::Group(g) => last_segment(&g.elem),
        Type::Paren(p) => last_segment(&p.elem),
        _ => None,
    }
}

pub fn last_segment_is(ty: &Type, name: &str) -> bool {
    last_segment(ty).is_some_and(|s| s.ident == name)
}

/// `crate = path` (or `crate = "path"`, as serde writes it): where the
/// runtime is for users who re-export it under another name. Generated code
/// then reaches `<path>::__private` instead of `::saga_runtime::__private`.
pub fn runtime_path(cx: &Ctxt, meta: &Meta) -> Option<syn::Path> {
    let expr = name_value(meta)?;
    let parsed = match expr {
        Expr::Path(p) if p.qself.is_none() => Ok(p.path.clone()),
        Expr::Lit(syn::ExprLit {
            lit: Lit::Str(s), ..
        }) => s.parse::<syn::Path>(),
        other => Err(syn::Error::new(other.span(), "")),
    };
    match parsed {
        Ok(path) => Some(path),
        Err(_) => {
            cx.error_spanned_by(
                expr,
                "`crate` names where the runtime is, as a path: `crate = my_app::saga_runtime` \
                 (for a crate that re-exports `saga_runtime`)",
            );
            None
        }
    }
}

/// `::saga_runtime`, or the `crate = ..` override.
pub fn default_runtime() -> syn::Path {
    syn::parse_quote!(::saga_runtime)
}
