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
use syn::visit::Visit;
use syn::{Ident, Type};

use super::model::{HandlerDef, ProcessDef};
use crate::ctxt::Ctxt;
use crate::saga::check::normalize;
use crate::saga::model::type_to_string;

pub fn check(cx: &Ctxt, pm: &ProcessDef) {
    check_has_starts(cx, pm);
    check_one_handler_per_message(cx, pm);
    check_one_on_error(cx, pm);
    check_generic_params(cx, pm);
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
    let params: Vec<Ident> = pm
        .item
        .generics
        .type_params()
        .map(|p| p.ident.clone())
        .chain(pm.item.generics.const_params().map(|p| p.ident.clone()))
        .chain(std::iter::once(Ident::new("Self", Span::call_site())))
        .collect();
    let report = |ty: &Type, what: &str| {
        let mut finder = FindParam {
            params: &params,
            found: None,
        };
        finder.visit_type(ty);
        let Some(param) = finder.found else {
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
