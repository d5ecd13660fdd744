//! `#[limit(..)]` -> [`Limit`]: everything one attribute can tell (keys,
//! values, which settings go together, the shape of the key), judged on the
//! attribute's own tokens. Whether the key's fields exist and can be shown
//! is the compiler's call, asked by the generated code (`expand.rs`); the
//! rules across methods are in `check.rs`.
//!
//! As elsewhere in this crate, everything is reported into the [`Ctxt`]; an
//! invalid attribute yields `None` and nothing further is said about it.

use darling::ast::NestedMeta;
use darling::util::SpannedValue;
use quote::ToTokens;
use syn::{Attribute, Expr, Ident, ImplItemFn, Lit, Meta};

use super::model::{KeyDef, Limit, RateDef, Site};
use crate::attr_args::{key_values, name_value, path_str};
use crate::ctxt::Ctxt;

/// The settings of `#[limit(..)]`, in the order the docs give them.
pub const KEYS: [&str; 6] = ["concurrency", "rate", "per", "burst", "key", "name"];

/// The longest limit name: it is part of store keys and metric labels.
const MAX_NAME_LEN: usize = 100;

/// Whether `attr` is a `#[limit]` of ours: `#[limit]` or
/// `#[saga_runtime::limit]`, not another crate's `#[other::limit]`.
pub fn is_limit(attr: &Attribute) -> bool {
    let segments = &attr.path().segments;
    let ours = segments.len() == 1 || segments.first().is_some_and(|s| s.ident == "saga_runtime");
    ours && segments.last().is_some_and(|s| s.ident == "limit")
}

/// The name of a method's first parameter after `self` (the step's input,
/// the handler's message), which a key may start with instead of `input`
/// or `msg`.
pub fn first_param(method: &ImplItemFn) -> Option<Ident> {
    method.sig.inputs.iter().find_map(|arg| match arg {
        syn::FnArg::Typed(pat) => match &*pat.pat {
            syn::Pat::Ident(p) if p.subpat.is_none() => Some(p.ident.clone()),
            _ => None,
        },
        syn::FnArg::Receiver(_) => None,
    })
}

/// Every `#[limit]` of one step or handler, in source order: the valid
/// ones (each invalid one is reported).
pub fn parse_all(cx: &Ctxt, attrs: &[Attribute], site: Site, param: Option<&Ident>) -> Vec<Limit> {
    attrs
        .iter()
        .filter_map(|attr| parse_limit(cx, attr, site, param))
        .collect()
}

/// Where a `#[limit]` was found that it does not apply to.
pub enum Misplaced<'a> {
    /// A `#[compensate]` method of a saga.
    Compensation,
    /// A saga method that is neither a step nor a compensation.
    NotAStep(&'a Ident),
    /// The `#[on_error]` policy of a process manager.
    OnError,
    /// A process-manager method that is not a handler.
    NotAHandler(&'a Ident),
    /// The impl block itself, of a `#[saga]` (`Site::Step`) or a
    /// `#[process_manager]` (`Site::Handler`).
    Impl(Site),
}

/// Why a limit can't go on a whole saga or process manager, and where it
/// goes instead: what the mistake "one limit for the saga" needs to hear
/// (the impl's own attribute is right there, so "add it" would not help).
pub fn on_impl_message(site: Site) -> &'static str {
    match site {
        Site::Step => {
            "`#[limit]` goes on a step (a `#[saga_step]` method) or on a process manager's \
             handler, not on the impl block: there is no saga-wide limit; put it on each step \
             it limits (steps that give the same `name = \"..\"` share one budget)"
        }
        Site::Handler => {
            "`#[limit]` goes on a process manager's `#[starts]`, `#[handles]` or `#[timeout]` \
             handler, or on a saga's `#[saga_step]` method, not on the impl block: there is no \
             limit for a whole process manager; put it on each handler it limits (handlers \
             that give the same `name = \"..\"` share one budget)"
        }
    }
}

/// Reports each of `attrs`, found where no limit applies.
pub fn misplaced(cx: &Ctxt, attrs: &[Attribute], place: Misplaced<'_>) {
    let message = match place {
        Misplaced::Compensation => "`#[limit]` applies to steps, not to compensations: a \
             compensation undoes work already done and must not wait behind new attempts (a \
             refund must not queue behind new charges); remove it"
            .to_owned(),
        Misplaced::NotAStep(ident) => format!(
            "`#[limit]` applies only to a `#[saga_step]` method, and `{ident}` is not a step; \
             mark the method `#[saga_step(n)]` or remove the attribute"
        ),
        Misplaced::OnError => "`#[limit]` goes on a `#[starts]`, `#[handles]` or `#[timeout]` \
             handler, not on the `#[on_error]` policy: it decides at once what happens to a \
             failed message and calls no one; remove it"
            .to_owned(),
        Misplaced::NotAHandler(ident) => format!(
            "`#[limit]` goes on a `#[starts]`, `#[handles]` or `#[timeout]` handler, and \
             `{ident}` is none of them: mark it as a handler, or remove `#[limit]`"
        ),
        Misplaced::Impl(site) => on_impl_message(site).to_owned(),
    };
    for attr in attrs {
        cx.error_spanned_by(attr, &message);
    }
}

/// One `#[limit(..)]`.
pub fn parse_limit(
    cx: &Ctxt,
    attr: &Attribute,
    site: Site,
    param: Option<&Ident>,
) -> Option<Limit> {
    let items = settings(cx, attr)?;
    let errors_before = cx.error_count();
    let keys = key_values(cx, "limit", &KEYS, &[], items);
    let malformed = cx.error_count() > errors_before;

    let noun = match site {
        Site::Step => "step",
        Site::Handler => "handler",
    };
    let concurrency = keys.get("concurrency").map(|m| {
        count(
            cx,
            m,
            &format!(
                "would never let an attempt start: give how many attempts of this {noun} may \
                 run at once across the deployment, 1 or more"
            ),
        )
    });
    let rate = keys.get("rate").map(|m| {
        count(
            cx,
            m,
            "would never let an attempt start: give how many attempts may start per `per` \
             (one second by default), 1 or more",
        )
    });
    let per = keys.get("per").map(|m| period(cx, m));
    let burst = keys.get("burst").map(|m| {
        count(
            cx,
            m,
            "would never let an attempt start: `burst` is how many may start at once (1 by \
             default: evenly paced); give 1 or more, or remove it",
        )
    });
    let key = keys.get("key").map(|m| key(cx, m, site, param));
    let name = keys.get("name").map(|m| limit_name(cx, m));

    // Which settings go together.
    if rate.is_none() {
        for (setting, what) in [
            ("burst", "how many of a rate's starts may come at once"),
            ("per", "the period of a rate"),
        ] {
            if let Some(meta) = keys.get(setting) {
                cx.error_spanned_by(
                    meta.path(),
                    format!(
                        "`{setting}` is {what}, and this `#[limit]` has no `rate`: add \
                         `rate = N` (at most N starts per `per`), or remove `{setting}`"
                    ),
                );
            }
        }
        let shaped = keys.contains_key("burst") || keys.contains_key("per");
        if concurrency.is_none() && !shaped && !malformed {
            cx.error_spanned_by(
                attr,
                "`#[limit]` needs `concurrency = N` (at most N attempts at once), `rate = N` \
                 (at most N starts per `per`), or both: e.g. `#[limit(concurrency = 10)]` or \
                 `#[limit(rate = 100, per = \"1s\")]`",
            );
        }
        if shaped || concurrency.is_none() {
            return None;
        }
    }
    // A misspelled or repeated setting may have been meant to be another
    // name or value: the rules across methods would only guess.
    if malformed {
        return None;
    }

    Some(Limit {
        attr: attr.to_token_stream(),
        name: flatten(name)?,
        concurrency: flatten(concurrency)?,
        rate: match rate {
            Some(count) => Some(RateDef {
                count: count?,
                per_ms: flatten(per)?,
                burst: flatten(burst)?,
            }),
            None => None,
        },
        key: flatten(key)?,
    })
}

/// A setting that was absent (`Some(None)`: fine), or present and valid
/// (`Some(Some(v))`); `None` when it was present and invalid (reported).
fn flatten<T>(setting: Option<Option<T>>) -> Option<Option<T>> {
    match setting {
        None => Some(None),
        Some(Some(value)) => Some(Some(value)),
        Some(None) => None,
    }
}

/// The items of `#[limit(..)]`, or an error saying what it should hold.
fn settings(cx: &Ctxt, attr: &Attribute) -> Option<Vec<NestedMeta>> {
    let missing = || {
        cx.error_spanned_by(
            attr,
            "`#[limit]` needs its settings: `#[limit(concurrency = 10)]` (at most 10 at once) \
             or `#[limit(rate = 100, per = \"1s\")]` (at most 100 starts a second)",
        );
    };
    let Meta::List(list) = &attr.meta else {
        missing();
        return None;
    };
    match NestedMeta::parse_meta_list(list.tokens.clone()) {
        Ok(items) if items.is_empty() => {
            missing();
            None
        }
        Ok(items) => Some(items),
        Err(err) => {
            cx.syn_error(err);
            None
        }
    }
}

fn ungroup(expr: &Expr) -> &Expr {
    match expr {
        Expr::Group(group) => ungroup(&group.expr),
        Expr::Paren(paren) => ungroup(&paren.expr),
        other => other,
    }
}

/// `key = N`: a positive integer literal that fits a `u32`. `zero` says
/// why 0 is wrong, after "`key = 0` ".
fn count(cx: &Ctxt, meta: &Meta, zero: &str) -> Option<SpannedValue<u32>> {
    let key = path_str(meta.path());
    let expr = name_value(meta)?;
    let negative = || {
        cx.error_spanned_by(
            expr,
            format!("`{key}` can't be negative: write a whole number, 1 or more"),
        );
    };
    let int = match ungroup(expr) {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(int), ..
        }) if int.base10_digits().starts_with('-') => {
            negative();
            return None;
        }
        Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            ..
        }) => {
            negative();
            return None;
        }
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(int), ..
        }) => int,
        Expr::Lit(_) => {
            cx.error_spanned_by(
                expr,
                format!("`{key}` is a whole number: write e.g. `{key} = 10`"),
            );
            return None;
        }
        other => {
            cx.error_spanned_by(
                other,
                format!(
                    "`{key}` needs an integer literal, e.g. `{key} = 10`: the macro reads it at \
                     compile time and can't evaluate constants or expressions"
                ),
            );
            return None;
        }
    };
    const INTEGER_TYPES: &[&str] = &["", "u8", "u16", "u32", "u64", "u128", "usize"];
    if !INTEGER_TYPES.contains(&int.suffix()) {
        cx.error_spanned_by(
            int,
            format!(
                "`{key}` is a count and takes no unit: write `{key} = {}`{}",
                int.base10_digits(),
                if key == "rate" {
                    format!(", per = \"1{}\"", int.suffix())
                } else {
                    String::new()
                }
            ),
        );
        return None;
    }
    match int.base10_parse::<u32>() {
        Ok(0) => {
            cx.error_spanned_by(int, format!("`{key} = 0` {zero}"));
            None
        }
        Ok(n) => Some(SpannedValue::new(n, int.span())),
        Err(_) => {
            cx.error_spanned_by(
                int,
                format!(
                    "`{key} = {}` is out of range: it must be at most {}",
                    int.base10_digits(),
                    u32::MAX
                ),
            );
            None
        }
    }
}

/// Why a period does not read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BadPeriod {
    /// Not `<digits><unit>`.
    Form,
    /// Longer than a `u64` of milliseconds.
    TooLong,
}

/// `"500ms"`, `"1s"`, `"2m"`, `"1h"` -> milliseconds.
pub(crate) fn parse_period(text: &str) -> Result<u64, BadPeriod> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(BadPeriod::Form),
    };
    if digits.is_empty() {
        return Err(BadPeriod::Form);
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit_ms))
        .ok_or(BadPeriod::TooLong)
}

/// `"2d"` (or `"1w"`, `"3 days"`) -> `Some(48)`: the hours of a period
/// written in a unit longer than `h`, the longest one periods take, so that
/// the error can show the spelling to write instead.
pub(crate) fn days_as_hours(text: &str) -> Option<u64> {
    let digits_end = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(digits_end);
    let per_unit: u64 = match unit.trim_start() {
        "d" | "day" | "days" => 24,
        "w" | "week" | "weeks" => 7 * 24,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(per_unit)
}

/// `per = ".."`: a positive period, in milliseconds.
fn period(cx: &Ctxt, meta: &Meta) -> Option<SpannedValue<u64>> {
    const FORMS: &str = "a whole number and a unit (`ms`, `s`, `m` or `h`), without a space: \
                         `per = \"1s\"`, `per = \"500ms\"`, `per = \"2m\"`";
    let expr = name_value(meta)?;
    let text = match ungroup(expr) {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Str(s), ..
        }) => s,
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(int), ..
        }) => {
            let written = int.to_string();
            let example = if int.suffix().is_empty() {
                format!("`per = \"{written}s\"` or `per = \"{written}ms\"`")
            } else {
                format!("`per = \"{written}\"`")
            };
            cx.error_spanned_by(
                expr,
                format!("`per` is a period written as a string with its unit: {example}"),
            );
            return None;
        }
        other => {
            cx.error_spanned_by(
                other,
                format!("`per` is a period written as a string: {FORMS}"),
            );
            return None;
        }
    };
    let value = text.value();
    if let Some(hours) = days_as_hours(&value) {
        cx.error_spanned_by(
            text,
            format!(
                "`per = \"{value}\"`: a period's units are `ms`, `s`, `m` and `h`, the longest \
                 an hour; write it in hours, `per = \"{hours}h\"`"
            ),
        );
        return None;
    }
    match parse_period(&value) {
        Ok(0) => {
            cx.error_spanned_by(
                text,
                format!(
                    "`per = \"{value}\"` is an empty period: every start would be due at once; \
                     give a positive period, e.g. `per = \"1s\"` (the default)"
                ),
            );
            None
        }
        Ok(ms) => Some(SpannedValue::new(ms, text.span())),
        Err(BadPeriod::Form) => {
            cx.error_spanned_by(
                text,
                format!("`per = \"{value}\"` is not a period: write {FORMS}"),
            );
            None
        }
        Err(BadPeriod::TooLong) => {
            cx.error_spanned_by(
                text,
                format!(
                    "`per = \"{value}\"` is too long a period: give at most {} ms, or rather \
                     an hour or less (`per = \"1h\"`)",
                    u64::MAX
                ),
            );
            None
        }
    }
}

/// `name = ".."`: 1 to 100 of `A-Z a-z 0-9 _ . : -`.
fn limit_name(cx: &Ctxt, meta: &Meta) -> Option<SpannedValue<String>> {
    let expr = name_value(meta)?;
    let Expr::Lit(syn::ExprLit {
        lit: Lit::Str(s), ..
    }) = ungroup(expr)
    else {
        cx.error_spanned_by(expr, "the limit's name is a string: `name = \"psp\"`");
        return None;
    };
    let name = s.value();
    let problem = if name.is_empty() {
        "the limit's name is empty: every step or handler that writes the same name shares \
         one budget; write e.g. `name = \"psp\"`, or leave `name` out for a limit of this method \
         alone"
            .to_owned()
    } else if name.len() > MAX_NAME_LEN {
        format!(
            "the limit's name is {} characters long; keep it to {MAX_NAME_LEN} (it is part of \
             store keys and metric labels)",
            name.len()
        )
    } else if let Some(bad) = name.chars().find(|c| !is_name_char(*c)) {
        format!(
            "the limit's name `{name}` contains `{}`: use only letters, digits, `_`, `.`, `:` \
             and `-` (it is part of store keys and metric labels), e.g. `name = \"{}\"`",
            bad.escape_default(),
            suggestion(&name)
        )
    } else {
        return Some(SpannedValue::new(name, s.span()));
    };
    cx.error_spanned_by(s, problem);
    None
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-')
}

/// `name` with every run of other characters turned into one `-`.
fn suggestion(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if is_name_char(c) {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_matches('-').to_owned();
    if out.is_empty() {
        "psp".to_owned()
    } else {
        out
    }
}

/// `key = input.a.b` (or `req.a.b`, `req` the parameter's name; `msg` for a
/// handler).
fn key(cx: &Ctxt, meta: &Meta, site: Site, param: Option<&Ident>) -> Option<KeyDef> {
    let base_word = site.base();
    let example = format!("`key = {base_word}.{}`", site.example_field());
    let expr = name_value(meta)?;
    let bases = match param {
        Some(p) if p != base_word => format!("`{base_word}` (or `{p}`, {})", site.param()),
        _ => format!("`{base_word}`"),
    };
    let mut fields = Vec::new();
    let mut at = ungroup(expr);
    while let Expr::Field(field) = at {
        fields.push(field.member.clone());
        at = ungroup(&field.base);
    }
    fields.reverse();
    let base = match at {
        Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => p.path.get_ident(),
        _ => None,
    };
    let Some(base) = base else {
        let message = match at {
            Expr::Lit(syn::ExprLit {
                lit: Lit::Str(s), ..
            }) => format!(
                "`key` is a path to a field of {}, not a string: write `key = {base_word}.{}`",
                site.read_from(),
                s.value()
            ),
            _ => format!(
                "`key` is a path to a field of {}, without calls or indexing: {example}",
                site.read_from()
            ),
        };
        cx.error_spanned_by(at, message);
        return None;
    };
    let is_base = base == base_word || param.is_some_and(|p| p == base);
    if !is_base {
        let message = if fields.is_empty() {
            format!(
                "`key` is a path to a field of {}, starting with {bases}: write \
                 `key = {base_word}.{base}`",
                site.read_from()
            )
        } else {
            format!(
                "a limit's key is a field of {}: start it with {bases}, not `{base}`, e.g. \
                 {example}",
                site.read_from()
            )
        };
        cx.error_spanned_by(base, message);
        return None;
    }
    if fields.is_empty() {
        cx.error_spanned_by(
            base,
            format!(
                "`key` names a field of {}, not all of it: {example}",
                site.read_from()
            ),
        );
        return None;
    }
    Some(KeyDef {
        base: base.clone(),
        fields,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::model::member_text;
    use syn::parse_quote;

    /// `parse_limit` on `attr` for a step whose input is `req`: the result
    /// and every error message.
    fn read(attr: Attribute) -> (Option<Limit>, Vec<String>) {
        let cx = Ctxt::new();
        let param: Ident = parse_quote!(req);
        let limit = parse_limit(&cx, &attr, Site::Step, Some(&param));
        let errors = match cx.check() {
            Ok(()) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        };
        (limit, errors)
    }

    fn one_error(attr: Attribute) -> String {
        let (limit, errors) = read(attr);
        assert!(limit.is_none());
        assert_eq!(errors.len(), 1, "{errors:#?}");
        errors.into_iter().next().unwrap_or_default()
    }

    #[test]
    fn every_setting_reads() {
        let (limit, errors) = read(parse_quote!(#[limit(
            concurrency = 10, rate = 100, per = "500ms", burst = 20,
            key = input.merchant.id, name = "psp:eu-1"
        )]));
        assert!(errors.is_empty(), "{errors:?}");
        let limit = limit.unwrap();
        assert_eq!(limit.concurrency.as_deref().copied(), Some(10));
        let rate = limit.rate.as_ref().unwrap();
        assert_eq!((*rate.count, rate.per_ms(), rate.burst()), (100, 500, 20));
        let key = limit.key.as_ref().unwrap();
        assert_eq!(key.text(), "input.merchant.id");
        assert_eq!(limit.name.as_deref().map(String::as_str), Some("psp:eu-1"));

        let (limit, errors) = read(parse_quote!(#[limit(rate = 5, key = req.0)]));
        assert!(errors.is_empty(), "{errors:?}");
        let limit = limit.unwrap();
        let rate = limit.rate.unwrap();
        assert_eq!((rate.per_ms(), rate.burst()), (1000, 1));
        let key = limit.key.unwrap();
        assert_eq!(key.text(), "req.0");
        assert_eq!(member_text(&key.fields[0]), "0");
    }

    #[test]
    fn periods() {
        assert_eq!(parse_period("500ms"), Ok(500));
        assert_eq!(parse_period("1s"), Ok(1000));
        assert_eq!(parse_period("2m"), Ok(120_000));
        assert_eq!(parse_period("1h"), Ok(3_600_000));
        assert_eq!(parse_period("0s"), Ok(0));
        for bad in ["2 seconds", "1.5s", "s", "10", "", "1d", " 1s", "-1s"] {
            assert_eq!(parse_period(bad), Err(BadPeriod::Form), "{bad}");
        }
        assert_eq!(
            parse_period("99999999999999999999h"),
            Err(BadPeriod::TooLong)
        );
        assert_eq!(days_as_hours("2d"), Some(48));
        assert_eq!(days_as_hours("1 week"), Some(168));
        for other in ["d", "2h", "1.5d", "", "2dd"] {
            assert_eq!(days_as_hours(other), None, "{other}");
        }
    }

    #[test]
    fn each_mistake_is_one_error() {
        let cases: Vec<(Attribute, &str)> = vec![
            (
                parse_quote!(#[limit(key = input.a)]),
                "needs `concurrency = N`",
            ),
            (parse_quote!(#[limit]), "needs its settings"),
            (parse_quote!(#[limit()]), "needs its settings"),
            (
                parse_quote!(#[limit(concurrency = 0)]),
                "`concurrency = 0` would never",
            ),
            (parse_quote!(#[limit(rate = 0)]), "`rate = 0` would never"),
            (
                parse_quote!(#[limit(rate = 1, burst = 0)]),
                "`burst = 0` would never",
            ),
            (
                parse_quote!(#[limit(concurrency = 1, burst = 5)]),
                "has no `rate`",
            ),
            (parse_quote!(#[limit(per = "1s")]), "has no `rate`"),
            (
                parse_quote!(#[limit(rate = 1, per = "2 seconds")]),
                "is not a period",
            ),
            (parse_quote!(#[limit(rate = 1, per = "0s")]), "empty period"),
            (
                parse_quote!(#[limit(rate = 1, per = "2d")]),
                "`per = \"48h\"`",
            ),
            (parse_quote!(#[limit(rate = 1, per = 1s)]), "`per = \"1s\"`"),
            (
                parse_quote!(#[limit(rate = 1, per = 1)]),
                "`per = \"1s\"` or",
            ),
            (
                parse_quote!(#[limit(concurency = 1)]),
                "did you mean `concurrency`?",
            ),
            (parse_quote!(#[limit(rate = 1, rate = 2)]), "given twice"),
            (
                parse_quote!(#[limit(concurrency = -1)]),
                "can't be negative",
            ),
            (parse_quote!(#[limit(concurrency = N)]), "integer literal"),
            (
                parse_quote!(#[limit(concurrency = 4294967296)]),
                "out of range",
            ),
            (parse_quote!(#[limit(rate = 10s)]), "takes no unit"),
            (
                parse_quote!(#[limit(concurrency = 1, name = "")]),
                "name is empty",
            ),
            (
                parse_quote!(#[limit(concurrency = 1, name = "psp api")]),
                "`name = \"psp-api\"`",
            ),
            (
                parse_quote!(#[limit(concurrency = 1, name = psp)]),
                "is a string",
            ),
            (
                parse_quote!(#[limit(concurrency = 1, key = order.id)]),
                "not `order`",
            ),
            (
                parse_quote!(#[limit(concurrency = 1, key = merchant_id)]),
                "`key = input.merchant_id`",
            ),
            (
                parse_quote!(#[limit(concurrency = 1, key = input)]),
                "not all of it",
            ),
            (
                parse_quote!(#[limit(concurrency = 1, key = input.id())]),
                "without calls",
            ),
            (
                parse_quote!(#[limit(concurrency = 1, key = "id")]),
                "not a string",
            ),
        ];
        for (attr, expected) in cases {
            let text = attr.to_token_stream().to_string();
            let error = one_error(attr);
            assert!(error.contains(expected), "{text}: {error}");
        }
        let long = "x".repeat(101);
        let error = one_error(parse_quote!(#[limit(concurrency = 1, name = #long)]));
        assert!(error.contains("101 characters"), "{error}");
    }

    #[test]
    fn handler_keys_start_with_msg_or_the_parameter() {
        let cx = Ctxt::new();
        let param: Ident = parse_quote!(reserved);
        let ok: Attribute = parse_quote!(#[limit(concurrency = 2, key = msg.customer)]);
        assert!(parse_limit(&cx, &ok, Site::Handler, Some(&param)).is_some());
        let ok: Attribute = parse_quote!(#[limit(concurrency = 2, key = reserved.customer)]);
        assert!(parse_limit(&cx, &ok, Site::Handler, Some(&param)).is_some());
        let bad: Attribute = parse_quote!(#[limit(concurrency = 2, key = input.customer)]);
        assert!(parse_limit(&cx, &bad, Site::Handler, Some(&param)).is_none());
        let errors = cx.check().unwrap_err();
        assert_eq!(errors.len(), 1);
        let text = errors[0].to_string();
        assert!(
            text.contains("`msg` (or `reserved`, the message parameter)"),
            "{text}"
        );
    }

    #[test]
    fn only_our_limit_is_a_limit() {
        assert!(is_limit(&parse_quote!(#[limit(concurrency = 1)])));
        assert!(is_limit(&parse_quote!(#[saga_runtime::limit(rate = 1)])));
        assert!(!is_limit(&parse_quote!(#[governor::limit(rate = 1)])));
        assert!(!is_limit(&parse_quote!(#[limits])));
    }
}
