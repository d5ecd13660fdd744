//! Rules that relate several methods of one process manager: there is a way
//! to create an instance, each message type has one handler, one error
//! policy, and the persisted types do not depend on the impl's generics.
//!
//! What only the compiler can judge (does the state have the correlated
//! field, do both fields have the same type, is the state `Default +
//! Serialize + DeserializeOwned`) is asserted by the generated code, spanned
//! on the user's tokens: see `expand.rs`.

use std::collections::HashMap;

use proc_macro2::Span;
use syn::{Ident, Type};

use super::model::{member_name, Correlation, HandlerDef, HandlerKind, ProcessDef};
use crate::ctxt::Ctxt;
use crate::limit::model::Limit;
use crate::types::{normalize, type_to_string};

pub fn check(cx: &Ctxt, pm: &ProcessDef) {
    check_has_starts(cx, pm);
    check_one_handler_per_message(cx, pm);
    check_one_on_error(cx, pm);
    check_generic_params(cx, pm);
    check_shared_fields_do_not_start(cx, pm);
    let limits: Vec<(&Ident, &[Limit])> = pm
        .handlers
        .iter()
        .map(|h| (&h.ident, h.limits.as_slice()))
        .collect();
    crate::limit::check::check_names(cx, &pm.name, &limits);
}

/// A field `#[handles(many)]` shares among instances cannot find the one
/// instance a starting message creates or continues.
fn check_shared_fields_do_not_start(cx: &Ctxt, pm: &ProcessDef) {
    for starts in &pm.handlers {
        let (HandlerKind::Starts { .. }, Correlation::Field { state, .. }) =
            (&starts.kind, &starts.correlation)
        else {
            continue;
        };
        let sharer = pm.handlers.iter().find(|h| {
            h.shared_field()
                .is_some_and(|f| member_name(f) == member_name(state))
        });
        if let Some(sharer) = sharer {
            cx.error_spanned_by(
                state,
                format!(
                    "`state.{field}` is shared by many instances (`#[handles(many)]` on `{}`), \
                     so a starting message could not tell which one to continue: correlate \
                     `{}` by the message's `#[correlation_id]` or by another field",
                    sharer.ident,
                    starts.ident,
                    field = member_name(state),
                ),
            );
        }
    }
}

fn check_has_starts(cx: &Ctxt, pm: &ProcessDef) {
    let ty = &pm.type_ident;
    if !pm.any_handler_attr {
        cx.error_spanned_by(
            &pm.item.self_ty,
            format!(
                "`#[process_manager]` impl `{ty}` has no handlers: mark the method that handles \
                 the first message `#[starts]`, and the others `#[handles]` (or `#[timeout]`)"
            ),
        );
    } else if !pm.any_starts_attr {
        cx.error_spanned_by(
            &pm.item.self_ty,
            format!(
                "process manager `{ty}` has no `#[starts]` handler, so nothing could ever \
                 create an instance: mark the handler of the first message with `#[starts]`"
            ),
        );
    }
}

fn check_one_handler_per_message(cx: &Ctxt, pm: &ProcessDef) {
    let mut first_for: HashMap<String, &HandlerDef> = HashMap::new();
    for handler in &pm.handlers {
        let Some(message) = &handler.message else {
            continue;
        };
        let key = normalize(message);
        match first_for.get(&key) {
            Some(first) => cx.error_spanned_by(
                message,
                format!(
                    "`{}` is already handled by `{}`: messages are routed by type, so a \
                     process manager has one handler per message type; merge `{}` into `{}`",
                    type_to_string(message),
                    first.ident,
                    handler.ident,
                    first.ident
                ),
            ),
            None => {
                first_for.insert(key, handler);
            }
        }
    }
}

fn check_one_on_error(cx: &Ctxt, pm: &ProcessDef) {
    if let [first, rest @ ..] = pm.on_errors.as_slice() {
        for other in rest {
            cx.error_spanned_by(
                &other.attr,
                format!(
                    "`#[on_error]` is already on `{}`: a process manager has one error policy; \
                     merge `{}` into it",
                    first.ident, other.ident
                ),
            );
        }
    }
}

/// The state and the messages are persisted, named by a definition fixed
/// at compile time and asserted outside the impl: they can't mention the
/// impl's type parameters, nor `Self`.
fn check_generic_params(cx: &Ctxt, pm: &ProcessDef) {
    let mut params = crate::item::params(&pm.item.generics);
    params.push(Ident::new("Self", Span::call_site()));
    let report = |ty: &Type, what: &str| {
        let Some(param) = crate::item::param_used_in(ty, &params) else {
            return;
        };
        let message = if param == "Self" {
            format!(
                "{what} can't be written with `Self`: it is checked outside the impl block; \
                 write the type's name"
            )
        } else {
            format!(
                "{what} can't use the impl's generic parameter `{param}`: it is persisted and \
                 routed by a name fixed at compile time; use a concrete type"
            )
        };
        cx.error_spanned_by(&param, message);
    };
    if let Some(state) = &pm.state {
        report(state, "the state type");
    }
    for handler in &pm.handlers {
        if let Some(message) = &handler.message {
            report(message, "a handler's message type");
        }
    }
}
