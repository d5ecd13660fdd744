//! One helper attribute's arguments -> typed structs: `#[saga_step]`,
//! `#[compensate]`, `#[retry_policy]`, `#[compensation_retry_policy]` and
//! `#[circuit_breaker]`, their keys, value ranges and spellings.

use super::*;

/// The arguments of `#[name(..)]`, or an error saying what it should look
/// like if the attribute has none.
pub(super) fn list_args(
    cx: &Ctxt,
    attr: &Attribute,
    needs: &str,
    example: &str,
) -> Option<Vec<NestedMeta>> {
    let name = attr_name(attr).unwrap_or_default();
    let missing = || cx.error_spanned_by(attr, format!("`#[{name}]` needs {needs}: `{example}`"));
    match &attr.meta {
        Meta::List(list) => match NestedMeta::parse_meta_list(list.tokens.clone()) {
            Ok(items) if items.is_empty() => {
                missing();
                None
            }
            Ok(items) => Some(items),
            Err(err) => {
                cx.syn_error(err);
                None
            }
        },
        _ => {
            missing();
            None
        }
    }
}

/// `#[saga_step(n)]` or `#[saga_step(n, timeout_ms = ..)]`: the number
/// first, then `key = value` settings.
pub(super) fn parse_step_args(cx: &Ctxt, attr: &Attribute) -> StepArgs {
    let example = "#[saga_step(1)]";
    let Some(items) = list_args(cx, attr, "the step's number", example) else {
        return StepArgs::default();
    };
    let is_setting = |item: &NestedMeta| {
        matches!(
            item,
            NestedMeta::Meta(Meta::NameValue(_)) | NestedMeta::NameValueInvalidExpr(_)
        )
    };
    // Settings written before the number: the number is either missing or
    // misplaced, and the integer literal after them (if any) is taken as it.
    let late_number = if is_setting(&items[0]) {
        let late = items
            .iter()
            .position(|item| matches!(item, NestedMeta::Lit(Lit::Int(_))));
        if late.is_none() {
            cx.error_spanned_by(
                &items[0],
                "`#[saga_step]` needs the step's number before its settings: \
                 `#[saga_step(1, timeout_ms = 30_000)]`",
            );
        }
        late
    } else {
        Some(0)
    };
    let mut number = None;
    let mut settings = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        if Some(i) == late_number {
            if i > 0 {
                cx.error_spanned_by(
                    &item,
                    "the step's number goes first, before the settings: \
                     `#[saga_step(1, timeout_ms = 30_000)]`",
                );
            }
            number = Some(item);
        } else if matches!(item, NestedMeta::Lit(_)) {
            cx.error_spanned_by(
                &item,
                "`#[saga_step]` takes the step's number, then optional `key = value` \
                 settings: `#[saga_step(1)]` or `#[saga_step(1, timeout_ms = 30_000)]`",
            );
        } else {
            settings.push(item);
        }
    }
    let order = number.and_then(|item| parse_step_number(cx, &item));
    let keys = key_values(cx, "saga_step", &["timeout_ms"], &[], settings);
    let timeout_ms = keys
        .get("timeout_ms")
        .and_then(name_value)
        .and_then(|expr| timeout_ms(cx, expr, raw_value(attr, "timeout_ms")));
    StepArgs { order, timeout_ms }
}

/// The tokens after the first `key =` in `#[name(..)]`, up to the next
/// comma, as written: syn reads `-5` as one literal spanning only the `-`,
/// and an error about the value should underline all of it.
pub(super) fn raw_value(attr: &Attribute, key: &str) -> Option<TokenStream> {
    use proc_macro2::TokenTree;
    let Meta::List(list) = &attr.meta else {
        return None;
    };
    let tokens: Vec<TokenTree> = list.tokens.clone().into_iter().collect();
    let mut args = tokens.split(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ','));
    args.find_map(|arg| match arg {
        [TokenTree::Ident(k), TokenTree::Punct(eq), value @ ..]
            if k == key && eq.as_char() == '=' && !value.is_empty() =>
        {
            Some(value.iter().cloned().collect())
        }
        _ => None,
    })
}

/// What `#[saga_step(..)]` says, as far as it is valid.
#[derive(Default)]
pub(super) struct StepArgs {
    pub(super) order: Option<SpannedValue<u32>>,
    pub(super) timeout_ms: Option<u64>,
}

pub(super) fn parse_step_number(cx: &Ctxt, item: &NestedMeta) -> Option<SpannedValue<u32>> {
    let number = match item {
        NestedMeta::Lit(lit @ Lit::Int(_)) => UInt::from_value(lit),
        other => {
            cx.error_spanned_by(
                other,
                "expected the step's number as an integer literal, e.g. `#[saga_step(1)]`",
            );
            return None;
        }
    };
    let number = match number {
        Ok(n) => n,
        Err(err) => {
            cx.darling_error(err);
            return None;
        }
    };
    let span = item.span();
    match u32::try_from(number.0) {
        Ok(0) => {
            cx.error_at(
                span,
                "step numbers start at 1: number the steps 1, 2, 3, ...",
            );
            None
        }
        Ok(n) => Some(SpannedValue::new(n, span)),
        Err(_) => {
            cx.error_at(
                span,
                format!(
                    "step number `{}` is out of range: number the steps 1, 2, 3, ... (at most {})",
                    number.0,
                    u32::MAX
                ),
            );
            None
        }
    }
}

/// The value of `timeout_ms = ..`: a positive integer literal, in
/// milliseconds.
///
/// `raw` is the value as written, for the one error whose span syn does
/// not keep whole.
pub(super) fn timeout_ms(cx: &Ctxt, expr: &Expr, raw: Option<TokenStream>) -> Option<u64> {
    const DEFAULT: &str = "or remove `timeout_ms` to use the engine's default \
                           (`EngineBuilder::step_timeout`, 5 minutes)";
    let int = match expr {
        Expr::Group(group) => return timeout_ms(cx, &group.expr, None),
        // syn reads `-5` as one literal; `-(5)` or `-N` is an expression.
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(int), ..
        }) if !int.base10_digits().starts_with('-') => int,
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(_), ..
        })
        | Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            ..
        }) => {
            cx.error_spanned_by(
                raw.unwrap_or_else(|| expr.to_token_stream()),
                format!(
                    "`timeout_ms` can't be negative: give how long one attempt may run as a \
                     positive number of milliseconds, e.g. `timeout_ms = 30_000`, {DEFAULT}"
                ),
            );
            return None;
        }
        Expr::Lit(syn::ExprLit { lit, .. }) => {
            let what = match lit {
                Lit::Str(_) | Lit::ByteStr(_) | Lit::CStr(_) => "a string",
                Lit::Float(_) => "a floating-point number",
                Lit::Bool(_) => "a boolean",
                Lit::Char(_) | Lit::Byte(_) => "a character",
                _ => "this literal",
            };
            cx.error_spanned_by(
                expr,
                format!(
                    "`timeout_ms` is a whole number of milliseconds, not {what}: write e.g. \
                     `timeout_ms = 30_000` for 30 seconds"
                ),
            );
            return None;
        }
        other => {
            cx.error_spanned_by(
                other,
                "`timeout_ms` needs the number of milliseconds written as an integer literal, \
                 e.g. `timeout_ms = 30_000`: the macro reads it at compile time and can't \
                 evaluate constants or expressions",
            );
            return None;
        }
    };
    const INTEGER_TYPES: &[&str] = &[
        "", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize",
    ];
    if !INTEGER_TYPES.contains(&int.suffix()) {
        cx.error_spanned_by(
            int,
            format!(
                "`timeout_ms` is in milliseconds and takes no unit: write \
                 `timeout_ms = 30_000` for 30 seconds, not `{int}`"
            ),
        );
        return None;
    }
    match int.base10_parse::<u64>() {
        Ok(0) => {
            cx.error_spanned_by(
                int,
                format!(
                    "`timeout_ms = 0` would cancel every attempt before it could succeed: give \
                     how long one attempt may run as a positive number of milliseconds, e.g. \
                     `timeout_ms = 30_000`, {DEFAULT}"
                ),
            );
            None
        }
        Ok(ms) => Some(ms),
        Err(_) => {
            cx.error_spanned_by(
                int,
                format!(
                    "`timeout_ms = {}` is out of range: give how long one attempt may run in \
                     milliseconds, at most {}",
                    int.base10_digits(),
                    u64::MAX
                ),
            );
            None
        }
    }
}

pub(super) fn parse_compensate_target(cx: &Ctxt, attr: &Attribute) -> Option<Ident> {
    let example = "#[compensate(step_method)]";
    let items = list_args(cx, attr, "the step it undoes", example)?;
    let message = "`#[compensate]` names the one step it undoes: `#[compensate(step_method)]`";
    if items.len() > 1 {
        cx.error_spanned_by(&items[1], message);
        return None;
    }
    match &items[0] {
        NestedMeta::Meta(Meta::Path(path)) if path.get_ident().is_some() => {
            path.get_ident().cloned()
        }
        other => {
            cx.error_spanned_by(other, message);
            None
        }
    }
}

// ---------------------------------------------------------------------------
// Key-value attributes

/// One required key reported missing, with an example value to paste.
pub(super) fn report_missing(cx: &Ctxt, attr: &Attribute, missing: &[(&str, &str)]) {
    if missing.is_empty() {
        return;
    }
    let name = attr_name(attr).unwrap_or_default();
    let keys: Vec<_> = missing.iter().map(|(k, _)| format!("`{k}`")).collect();
    let examples: Vec<_> = missing.iter().map(|(_, e)| *e).collect();
    cx.error_spanned_by(
        attr,
        format!(
            "`#[{name}]` is missing {}: add `{}`",
            keys.join(" and "),
            examples.join(", ")
        ),
    );
}

/// A non-negative integer literal, before its range is checked against the
/// key's type (so that an overflow gets a message naming the key's range
/// instead of a bare parse error).
pub(super) struct UInt(u128);

impl FromMeta for UInt {
    fn from_value(lit: &Lit) -> darling::Result<Self> {
        match lit {
            Lit::Int(int) => int
                .base10_parse::<u128>()
                .map(UInt)
                .map_err(|_| darling::Error::custom("this number is too large").with_span(int)),
            other => Err(darling::Error::custom("expected an integer, e.g. `3`").with_span(other)),
        }
    }

    fn from_expr(expr: &Expr) -> darling::Result<Self> {
        match expr {
            Expr::Lit(lit) => Self::from_value(&lit.lit),
            Expr::Group(group) => Self::from_expr(&group.expr),
            Expr::Unary(syn::ExprUnary {
                op: syn::UnOp::Neg(_),
                ..
            }) => Err(darling::Error::custom("expected a non-negative integer").with_span(expr)),
            other => Err(
                darling::Error::custom("expected an integer literal, e.g. `3`").with_span(other),
            ),
        }
    }
}

/// `-5`, whether it reached us as a negation or (from another macro) as one
/// literal token: either way `u128` parsing would call it "too large".
pub(super) fn is_negative(expr: &Expr) -> bool {
    match expr {
        Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            ..
        }) => true,
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(int), ..
        }) => int.base10_digits().starts_with('-'),
        Expr::Group(group) => is_negative(&group.expr),
        _ => false,
    }
}

/// Reads `key = <integer>` and checks `min..=max`.
pub(super) fn int_key(
    cx: &Ctxt,
    meta: &Meta,
    min: u128,
    max: u128,
    why_min: &str,
) -> Option<SpannedValue<u128>> {
    let key = path_str(meta.path());
    let expr = name_value(meta)?;
    if is_negative(expr) {
        cx.error_spanned_by(
            expr,
            format!("`{key}` cannot be negative: write a whole number, {min} or more"),
        );
        return None;
    }
    let value = match SpannedValue::<UInt>::from_expr(expr) {
        Ok(v) => v,
        Err(err) => {
            cx.darling_error(err);
            return None;
        }
    };
    let n = value.0;
    if n < min {
        cx.error_at(
            value.span(),
            format!("`{key}` must be at least {min}{why_min}"),
        );
        return None;
    }
    if n > max {
        cx.error_at(
            value.span(),
            format!("`{key} = {n}` is out of range: it must be at most {max}"),
        );
        return None;
    }
    Some(SpannedValue::new(n, value.span()))
}

/// `jitter` or `jitter = true|false`.
pub(super) fn flag(cx: &Ctxt, meta: &Meta) -> Option<bool> {
    match meta {
        Meta::Path(_) => Some(true),
        Meta::NameValue(nv) => match &nv.value {
            Expr::Lit(syn::ExprLit {
                lit: Lit::Bool(b), ..
            }) => Some(b.value),
            other => {
                cx.error_spanned_by(
                    other,
                    "`jitter` is a flag: write `jitter`, `jitter = true` or `jitter = false`",
                );
                None
            }
        },
        Meta::List(_) => None,
    }
}

/// The backoff of a policy that does not name one: Temporal's and
/// Restate's choice (Polly's is constant), and what most transient faults
/// (an overloaded service, a failover) want.
const DEFAULT_BACKOFF: Backoff = Backoff::Exponential;

/// The first delay of a policy that does not give one: Temporal's initial
/// interval (Polly waits 2 s, Restate 50 ms); long enough for a restarting
/// dependency, short enough not to be noticed.
const DEFAULT_BASE_DELAY_MS: u64 = 1000;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum PolicyFor {
    Step,
    Compensation,
}

pub(super) fn parse_policy(
    cx: &Ctxt,
    attr: &Attribute,
    policy_for: PolicyFor,
) -> Option<PolicyArgs> {
    let name = attr_name(attr).unwrap_or_default();
    let example = format!("#[{name}(max_retries = 3, backoff = exponential, base_delay_ms = 200)]");
    let items = list_args(cx, attr, "its settings", &example)?;
    let known: &[&str] = match policy_for {
        PolicyFor::Step => &[
            "max_retries",
            "backoff",
            "base_delay_ms",
            "max_delay_ms",
            "jitter",
            "on_exhausted",
        ],
        PolicyFor::Compensation => &[
            "max_retries",
            "backoff",
            "base_delay_ms",
            "max_delay_ms",
            "jitter",
        ],
    };
    // `on_exhausted` gets its own explanation rather than "unknown key".
    let items = items
        .into_iter()
        .filter(|item| {
            let is_on_exhausted =
                matches!(item, NestedMeta::Meta(m) if m.path().is_ident("on_exhausted"));
            if is_on_exhausted && policy_for == PolicyFor::Compensation {
                cx.error_spanned_by(
                    item,
                    "`on_exhausted` does not apply to a compensation: one that still fails \
                     after its retries always ends the task `CompensationFailed` for an \
                     operator to resolve; remove it",
                );
                return false;
            }
            true
        })
        .collect();
    let errors_before = cx.error_count();
    let keys = key_values(cx, &name, known, &["jitter"], items);
    let malformed = cx.error_count() > errors_before;

    let mut missing = Vec::new();
    let max_retries = match keys.get("max_retries") {
        Some(m) => int_key(cx, m, 0, u32::MAX.into(), ""),
        None => {
            missing.push(("max_retries", "max_retries = 3"));
            None
        }
    };
    let backoff = match keys.get("backoff") {
        Some(m) => choice(
            cx,
            m,
            "backoff",
            &[
                ("exponential", Backoff::Exponential),
                ("linear", Backoff::Linear),
                ("constant", Backoff::Constant),
            ],
        ),
        None => Some(DEFAULT_BACKOFF),
    };
    let base_delay_ms = match keys.get("base_delay_ms") {
        Some(m) => int_key(cx, m, 0, u64::MAX.into(), ""),
        None => Some(SpannedValue::new(
            DEFAULT_BASE_DELAY_MS.into(),
            Span::call_site(),
        )),
    };
    // A missing key is only worth reporting if the key was not just
    // misspelled (which is already reported, with a suggestion).
    if !malformed {
        report_missing(cx, attr, &missing);
    }
    let max_delay_ms = keys
        .get("max_delay_ms")
        .map(|m| int_key(cx, m, 0, u64::MAX.into(), ""));
    if let (Some(Some(max)), Some(base)) = (&max_delay_ms, &base_delay_ms) {
        if **max < **base {
            let base = match keys.get("base_delay_ms") {
                Some(_) => format!("`base_delay_ms = {}`", **base),
                None => format!("the default `base_delay_ms` ({DEFAULT_BASE_DELAY_MS} ms)"),
            };
            cx.error_at(
                max.span(),
                format!(
                    "`max_delay_ms = {}` is below {base}: every delay would be capped below \
                     the base; raise `max_delay_ms` or lower `base_delay_ms`",
                    **max
                ),
            );
        }
    }
    let jitter = keys.get("jitter").map(|m| flag(cx, m));
    let on_exhausted = keys.get("on_exhausted").map(|m| {
        choice(
            cx,
            m,
            "on_exhausted action",
            &[
                ("compensate", OnExhausted::Compensate),
                ("fail", OnExhausted::Fail),
                ("dead_letter", OnExhausted::DeadLetter),
            ],
        )
    });

    Some(PolicyArgs {
        attr: attr.to_token_stream(),
        max_retries: u32::try_from(*max_retries?).ok()?,
        backoff: backoff?,
        base_delay_ms: u64::try_from(*base_delay_ms?).ok()?,
        max_delay_ms: match max_delay_ms {
            Some(v) => Some(u64::try_from(*v?).ok()?),
            None => None,
        },
        jitter: match jitter {
            Some(v) => Some(v?),
            None => None,
        },
        on_exhausted: match on_exhausted {
            Some(v) => Some(v?),
            None => None,
        },
    })
}

pub(super) fn parse_breaker(cx: &Ctxt, attr: &Attribute) -> Option<BreakerArgs> {
    let example = "#[circuit_breaker(failure_threshold = 5, duration_secs = 30)]";
    let items = list_args(cx, attr, "its settings", example)?;
    let errors_before = cx.error_count();
    let keys = key_values(
        cx,
        "circuit_breaker",
        &["failure_threshold", "duration_secs", "scope", "when_open"],
        &[],
        items,
    );
    let scope = keys.get("scope").map(|m| {
        choice(
            cx,
            m,
            "breaker scope",
            &[
                ("process", BreakerScope::Process),
                ("shared", BreakerScope::Shared),
            ],
        )
    });
    let when_open = keys.get("when_open").map(|m| {
        choice(
            cx,
            m,
            "`when_open` action",
            &[("fail", WhenOpen::Fail), ("wait", WhenOpen::Wait)],
        )
    });
    let malformed = cx.error_count() > errors_before;
    let mut missing = Vec::new();
    let failure_threshold = match keys.get("failure_threshold") {
        Some(m) => int_key(
            cx,
            m,
            1,
            u32::MAX.into(),
            ": it is the number of consecutive failures that opens the circuit",
        ),
        None => {
            missing.push(("failure_threshold", "failure_threshold = 5"));
            None
        }
    };
    let duration_secs = match keys.get("duration_secs") {
        Some(m) => int_key(
            cx,
            m,
            1,
            u64::MAX.into(),
            ": it is how long the circuit stays open before a probe call",
        ),
        None => {
            missing.push(("duration_secs", "duration_secs = 30"));
            None
        }
    };
    if !malformed {
        report_missing(cx, attr, &missing);
    }
    Some(BreakerArgs {
        failure_threshold: u32::try_from(*failure_threshold?).ok()?,
        duration_secs: u64::try_from(*duration_secs?).ok()?,
        scope: match scope {
            Some(v) => Some(v?),
            None => None,
        },
        when_open: match when_open {
            Some(v) => Some(v?),
            None => None,
        },
    })
}
