//! `#[correlate(state.x = msg.y)]` -> which state field a message's field
//! finds its instance by.

use super::*;

const CORRELATE_EXAMPLE: &str = "#[correlate(state.order_number = msg.order_number)]";

pub(super) fn parse_correlate(
    cx: &Ctxt,
    attr: &Attribute,
    sig: &HandlerSig,
) -> Option<CorrelateArgs> {
    let tokens = match &attr.meta {
        Meta::List(list) if !list.tokens.is_empty() => &list.tokens,
        _ => {
            cx.error_spanned_by(
                attr,
                format!(
                    "`#[correlate]` needs the mapping from a state field to a message field: \
                     `{CORRELATE_EXAMPLE}`"
                ),
            );
            return None;
        }
    };
    let malformed = |at: &dyn ToTokens| {
        cx.error_spanned_by(
            at.to_token_stream(),
            format!(
                "expected `state.<field> = msg.<field>` in `#[correlate]`, e.g. \
                 `{CORRELATE_EXAMPLE}`"
            ),
        );
    };
    let expr = match syn::parse2::<Expr>(tokens.clone()) {
        Ok(expr) => expr,
        Err(_) => {
            malformed(tokens);
            return None;
        }
    };
    let Expr::Assign(assign) = &expr else {
        malformed(&expr);
        return None;
    };
    let is_state = |i: &Ident| i == "state" || sig.state_name.as_ref() == Some(i);
    let is_msg = |i: &Ident| i == "msg" || sig.message_name.as_ref() == Some(i);
    let (Some((left_base, left_field)), Some((right_base, right_field))) = (
        field_access(cx, &assign.left),
        field_access(cx, &assign.right),
    ) else {
        return None;
    };
    if is_msg(&left_base) && is_state(&right_base) {
        cx.error_spanned_by(
            &expr,
            format!(
                "write the state's field on the left: `#[correlate({} = {})]`",
                quote::quote!(#right_base.#right_field),
                quote::quote!(#left_base.#left_field),
            ),
        );
        return None;
    }
    let state_names = names("state", sig.state_name.as_ref());
    let msg_names = names("msg", sig.message_name.as_ref());
    if !is_state(&left_base) {
        cx.error_spanned_by(
            &left_base,
            format!(
                "the left side of `#[correlate]` is a field of the state: {state_names} \
                 (e.g. `{CORRELATE_EXAMPLE}`)"
            ),
        );
        return None;
    }
    if !is_msg(&right_base) {
        cx.error_spanned_by(
            &right_base,
            format!(
                "the right side of `#[correlate]` is a field of the message: {msg_names} \
                 (e.g. `{CORRELATE_EXAMPLE}`)"
            ),
        );
        return None;
    }
    Some(CorrelateArgs {
        state_field: left_field,
        message_field: right_field,
    })
}

/// "`state.<field>`", or "`state.<field>` (or `s.<field>`)" when the
/// parameter has another name.
pub(super) fn names(default: &str, param: Option<&Ident>) -> String {
    match param {
        Some(p) if p != default => format!("`{default}.<field>` (or `{p}.<field>`)"),
        _ => format!("`{default}.<field>`"),
    }
}

/// `base.field` with `base` a plain name.
pub(super) fn field_access(cx: &Ctxt, expr: &Expr) -> Option<(Ident, Member)> {
    let report = |at: &dyn ToTokens, what: &str| {
        cx.error_spanned_by(
            at.to_token_stream(),
            format!("{what}: expected `state.<field> = msg.<field>`, e.g. `{CORRELATE_EXAMPLE}`"),
        );
    };
    let Expr::Field(field) = expr else {
        report(
            expr,
            "`#[correlate]` maps a field of the state to a field of the message",
        );
        return None;
    };
    let base = match &*field.base {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident(),
        _ => None,
    };
    if let Some(base) = base {
        return Some((base.clone(), field.member.clone()));
    }
    match &*field.base {
        Expr::Field(_) => {
            report(
                expr,
                "`#[correlate]` maps a direct field (it becomes an index key), not a nested one",
            );
            None
        }
        other => {
            report(other, "`#[correlate]` maps a field of `state` or `msg`");
            None
        }
    }
}
