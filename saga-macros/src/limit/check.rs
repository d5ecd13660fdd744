//! Rules that relate the limits of several methods of one impl: a name is
//! one budget, so it is declared once per method and alike everywhere.
//!
//! Across impls (two sagas naming `"psp"`), the engine compares the
//! declarations when it is built: the compiler sees one impl at a time.

use std::collections::HashMap;

use proc_macro2::Span;
use quote::ToTokens;
use syn::{Ident, Type};

use super::model::Limit;
use crate::ctxt::Ctxt;

/// `uses`: each method with its limits, in source order; `owner` the
/// saga's or process manager's name (the default names' prefix).
pub fn check_names(cx: &Ctxt, owner: &str, uses: &[(&Ident, &[Limit])]) {
    let mut first_use: HashMap<String, (&Ident, &Limit)> = HashMap::new();
    for (method, limits) in uses {
        let mut on_method: Vec<String> = Vec::new();
        for limit in limits.iter() {
            let name = limit.name_in(owner, method);
            if on_method.contains(&name) {
                twice_on_one_method(cx, method, limit, &name);
                continue;
            }
            on_method.push(name.clone());
            match first_use.get(&name) {
                Some((first_method, first)) if first.config() != limit.config() => {
                    let message = format!(
                        "the limit `{name}` is declared on `{first_method}` with `{}`, and \
                             here with `{}`: everything that names `{name}` spends one budget, \
                             so all must declare the same `concurrency` and `rate` (`per` and \
                             `burst` included); make them equal, or give this one another \
                             `name`",
                        first.config(),
                        limit.config()
                    );
                    match conflict_span(first, limit) {
                        Some(span) => cx.error_at(span, message),
                        None => cx.error_spanned_by(&limit.attr, message),
                    }
                }
                Some(_) => {}
                None => {
                    first_use.insert(name, (method, limit));
                }
            }
        }
    }
}

fn twice_on_one_method(cx: &Ctxt, method: &Ident, limit: &Limit, name: &str) {
    match &limit.name {
        Some(written) => cx.error_at(
            written.span(),
            format!(
                "the limit `{name}` is already on `{method}`: an attempt spends from a budget \
                 once; merge the two `#[limit]` into one, or give this one another `name`"
            ),
        ),
        None => cx.error_spanned_by(
            &limit.attr,
            format!(
                "two `#[limit]` on `{method}` have the default name, `{name}`: merge them into \
                 one `#[limit(..)]`, or give this one its own `name = \"..\"`"
            ),
        ),
    }
}

/// Where the second declaration differs from the first: the first
/// setting whose value differs, or its name when it lacks the setting
/// (`None`: the attribute, when the name is the default).
fn conflict_span(first: &Limit, second: &Limit) -> Option<Span> {
    let fallback = || second.name.as_ref().map(|name| name.span());
    let (a, b) = (first.config(), second.config());
    if a.concurrency != b.concurrency {
        return second
            .concurrency
            .as_ref()
            .map(|c| c.span())
            .or_else(fallback);
    }
    let (Some(first_rate), Some(rate)) = (&first.rate, &second.rate) else {
        return fallback();
    };
    if *first_rate.count != *rate.count {
        return Some(rate.count.span());
    }
    if first_rate.per_ms() != rate.per_ms() {
        return rate.per_ms.as_ref().map(|p| p.span()).or_else(fallback);
    }
    rate.burst.as_ref().map(|b| b.span()).or_else(fallback)
}

/// A keyed limit's reader names the input type inside the definition, a
/// `static` where `Self` can't be written: the one case the expansion
/// can't take. (`#[process_manager]` rejects `Self` in message types
/// already.)
pub fn check_key_type(cx: &Ctxt, limits: &[Limit], input: Option<&Type>) {
    let Some(input) = input else { return };
    let this = [Ident::new("Self", Span::call_site())];
    if crate::item::param_used_in(input, &this).is_none() {
        return;
    }
    for key in limits.iter().filter_map(|l| l.key.as_ref()) {
        cx.error_spanned_by(
            key.base.to_token_stream(),
            format!(
                "a keyed limit reads the step's input as `{}`, which is written with `Self`: \
                 write the type's name instead of `Self` in the input's type",
                crate::types::type_to_string(input)
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::model::Site;
    use syn::{parse_quote, Attribute};

    /// `check_names` over methods given as `(name, [#[limit] ..])`: every
    /// error message.
    fn errors(methods: Vec<(&str, Vec<Attribute>)>) -> Vec<String> {
        let cx = Ctxt::new();
        let parsed: Vec<(Ident, Vec<Limit>)> = methods
            .into_iter()
            .map(|(name, attrs)| {
                let limits = crate::limit::parse::parse_all(&cx, &attrs, Site::Step, None);
                (Ident::new(name, Span::call_site()), limits)
            })
            .collect();
        let uses: Vec<(&Ident, &[Limit])> = parsed.iter().map(|(m, l)| (m, l.as_slice())).collect();
        check_names(&cx, "checkout", &uses);
        match cx.check() {
            Ok(()) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn a_shared_name_is_declared_alike() {
        let alike = errors(vec![
            (
                "charge",
                vec![parse_quote!(#[limit(rate = 100, key = input.a, name = "psp")])],
            ),
            (
                "capture",
                vec![parse_quote!(#[limit(rate = 100, per = "1000ms", burst = 1, name = "psp")])],
            ),
        ]);
        assert!(alike.is_empty(), "{alike:?}");

        let per = errors(vec![
            (
                "charge",
                vec![parse_quote!(#[limit(rate = 100, name = "psp")])],
            ),
            (
                "capture",
                vec![parse_quote!(#[limit(rate = 100, per = "2s", name = "psp")])],
            ),
        ]);
        assert_eq!(per.len(), 1, "{per:?}");
        assert!(
            per[0].contains("on `charge` with `rate = 100, per = \"1s\", burst = 1`, and here with `rate = 100, per = \"2s\", burst = 1`"),
            "{per:?}"
        );
    }

    #[test]
    fn one_method_names_a_budget_once() {
        let defaults = errors(vec![(
            "charge",
            vec![
                parse_quote!(#[limit(concurrency = 1)]),
                parse_quote!(#[limit(rate = 5)]),
            ],
        )]);
        assert_eq!(defaults.len(), 1, "{defaults:?}");
        assert!(
            defaults[0].contains("have the default name, `checkout.charge`"),
            "{defaults:?}"
        );
        // An explicit name equal to another method's default is that budget.
        let taken = errors(vec![
            ("charge", vec![parse_quote!(#[limit(concurrency = 1)])]),
            (
                "capture",
                vec![parse_quote!(#[limit(concurrency = 2, name = "checkout.charge")])],
            ),
        ]);
        assert_eq!(taken.len(), 1, "{taken:?}");
        assert!(taken[0].contains("the limit `checkout.charge` is declared on `charge`"));
    }
}

#[cfg(test)]
mod key_type_tests {
    use super::*;
    use crate::limit::model::Site;
    use syn::{parse_quote, Attribute};

    #[test]
    fn a_keyed_limit_needs_an_input_written_without_self() {
        let cx = Ctxt::new();
        let attrs: Vec<Attribute> = vec![
            parse_quote!(#[limit(concurrency = 1, key = input.id)]),
            parse_quote!(#[limit(concurrency = 1, name = "unkeyed")]),
        ];
        let limits = crate::limit::parse::parse_all(&cx, &attrs, Site::Step, None);
        check_key_type(&cx, &limits, Some(&parse_quote!(Request)));
        assert!(cx.error_count() == 0);
        check_key_type(&cx, &limits, Some(&parse_quote!(Wrapper<Self>)));
        let errors = cx.check().unwrap_err();
        assert_eq!(errors.len(), 1);
        assert!(errors[0]
            .to_string()
            .contains("`Wrapper<Self>`, which is written with `Self`"));
    }
}
