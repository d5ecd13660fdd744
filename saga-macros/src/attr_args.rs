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
    let items = without_positional(cx, attr, known, items);
    for item in items {
        let meta = match item {
            NestedMeta::Meta(meta) => meta,
            // Taken out by `without_positional`.
            NestedMeta::Lit(_) => continue,
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
            let message = match elsewhere(attr, &key) {
                Some(message) => message,
                None => {
                    suggest::unknown(&format!("unknown key `{key}` in `#[{attr}]`"), &key, known)
                }
            };
            cx.error_spanned_by(meta.path(), message);
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

/// Positional values (`#[retry_policy(5, exponential)]`) are one mistake,
/// reported once over all of them: the bare words among them are values
/// too, not misspelled keys. Returns the other items.
fn without_positional(
    cx: &Ctxt,
    attr: &str,
    known: &[&str],
    items: Vec<NestedMeta>,
) -> Vec<NestedMeta> {
    if !items.iter().any(|i| matches!(i, NestedMeta::Lit(_))) {
        return items;
    }
    let is_positional = |item: &NestedMeta| match item {
        NestedMeta::Lit(_) => true,
        NestedMeta::Meta(Meta::Path(p)) => !known.contains(&path_str(p).as_str()),
        _ => false,
    };
    let (positional, rest): (Vec<_>, Vec<_>) = items.into_iter().partition(is_positional);
    let tokens: proc_macro2::TokenStream = positional
        .iter()
        .map(quote::ToTokens::to_token_stream)
        .collect();
    let values = if positional.len() == 1 {
        "a positional value"
    } else {
        "positional values"
    };
    cx.error_spanned_by(
        tokens,
        format!(
            "expected `key = value` in `#[{attr}]`, not {values}: name each setting, e.g. \
             `#[{attr}({} = ..)]`; keys: {}",
            known.first().copied().unwrap_or("key"),
            known.join(", ")
        ),
    );
    rest
}

/// The settings of the attributes that sit on one step, by attribute.
const STEP_ATTRS: [(&str, &[&str]); 4] = [
    ("saga_step", &["timeout_ms"]),
    (
        "retry_policy",
        &[
            "max_retries",
            "backoff",
            "base_delay_ms",
            "max_delay_ms",
            "jitter",
            "on_exhausted",
        ],
    ),
    (
        "circuit_breaker",
        &["failure_threshold", "duration_secs", "scope", "when_open"],
    ),
    (
        "compensation_retry_policy",
        &[
            "max_retries",
            "backoff",
            "base_delay_ms",
            "max_delay_ms",
            "jitter",
        ],
    ),
];

/// A key written in the wrong attribute (`when_open` in `#[saga_step]`,
/// `cancellable` in `#[saga]`): says which attribute it belongs to, where
/// "did you mean" among this attribute's keys would mislead.
fn elsewhere(attr: &str, key: &str) -> Option<String> {
    if key == "cancellable" && matches!(attr, "saga" | "saga_step") {
        return Some(format!(
            "`cancellable` is not a key of `#[{attr}]` but an attribute of its own: write \
             `#[cancellable]` next to `#[saga]` on the impl block (above or below it)"
        ));
    }
    if !STEP_ATTRS.iter().any(|(a, _)| *a == attr) {
        return None;
    }
    let (owner, _) = STEP_ATTRS
        .iter()
        .find(|(a, keys)| *a != attr && keys.contains(&key))?;
    Some(format!(
        "`{key}` is a setting of `#[{owner}(..)]`, not of `#[{attr}]`: write \
         `#[{owner}({key} = ..)]` on the step (with its other settings)"
    ))
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

/// With `crate = path`: asks that `path` be the runtime crate, spanned on
/// `path`. A module that re-exports the prelude has a stand-in
/// `__private` whose `CrateRoot` fails the check, with a message that says
/// so: one error instead of one per use of `path::__private`.
pub fn crate_root_check(runtime: &syn::Path) -> proc_macro2::TokenStream {
    if is_default(runtime) {
        return proc_macro2::TokenStream::new();
    }
    let span = runtime.span();
    quote::quote_spanned! {span=>
        const _: fn() = #runtime::__private::crate_root::<#runtime::__private::CrateRoot>;
    }
}

fn is_default(runtime: &syn::Path) -> bool {
    runtime.leading_colon.is_some()
        && runtime.segments.len() == 1
        && runtime.segments[0].ident == "saga_runtime"
}

/// `::saga_runtime`, or the `crate = ..` override.
pub fn default_runtime() -> syn::Path {
    syn::parse_quote!(::saga_runtime)
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse::Parser;

    fn errors_for(attr: &str, known: &[&str], args: proc_macro2::TokenStream) -> Vec<String> {
        let items = syn::punctuated::Punctuated::<NestedMeta, syn::Token![,]>::parse_terminated
            .parse2(args)
            .unwrap()
            .into_iter()
            .collect();
        let cx = Ctxt::new();
        let _ = key_values(&cx, attr, known, &[], items);
        cx.check()
            .err()
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn positional_values_are_one_error() {
        let errors = errors_for(
            "retry_policy",
            &["max_retries", "backoff"],
            quote::quote!(5, exponential, 200),
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("not positional values"), "{errors:?}");
    }

    #[test]
    fn a_key_of_another_step_attribute_names_it() {
        let errors = errors_for(
            "saga_step",
            &["timeout_ms"],
            quote::quote!(when_open = fail),
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("setting of `#[circuit_breaker(..)]`"),
            "{errors:?}"
        );
        let errors = errors_for("saga", &["name"], quote::quote!(cancellable));
        assert!(errors[0].contains("attribute of its own"), "{errors:?}");
    }
}
