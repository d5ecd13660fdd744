//! Parsed attributes -> the IR: the one place that knows both, so that
//! `parse/` and `model.rs` need not know each other.

use heck::ToKebabCase;
use proc_macro2::TokenStream;

use super::model::{Correlation, HandlerDef, HandlerKind, Model, OnErrorDef, ProcessDef};
use super::parse::{self, Kind, Parsed, ParsedProcess, Role};
use crate::ctxt::Ctxt;
use crate::types::type_ident;

pub fn build(cx: &Ctxt, parsed: Parsed) -> Model {
    match parsed {
        Parsed::Impl(process) => match build_process(cx, *process) {
            Ok(def) => Model::Process(Box::new(def)),
            Err(tokens) => Model::Other(tokens),
        },
        Parsed::Other(tokens) => Model::Other(tokens),
    }
}

fn build_process(cx: &Ctxt, parsed: ParsedProcess) -> Result<ProcessDef, TokenStream> {
    let ParsedProcess {
        item,
        args,
        methods,
        any_handler_attr,
        any_starts_attr,
    } = parsed;
    let Some(type_ident) = type_ident(&item.self_ty) else {
        cx.error_spanned_by(
            &item.self_ty,
            "`#[process_manager]` goes on the impl block of a named type: `impl MyProcess { .. }`",
        );
        return Err(quote::quote!(#item));
    };
    let name = match args.name {
        Some(name) => name.into_inner(),
        None => type_ident.to_string().to_kebab_case(),
    };

    let mut handlers = Vec::new();
    let mut on_errors = Vec::new();
    for method in methods {
        match method.role {
            Role::OnError => on_errors.push(OnErrorDef {
                ident: method.ident,
                attr: method.attr,
            }),
            Role::Handler(handler) => {
                let parse::HandlerAttrs {
                    kind,
                    message,
                    state,
                    correlate,
                    limits,
                } = *handler;
                let mut unmatched = parse::Unmatched::default();
                let kind = match kind {
                    Kind::Starts { strict } => HandlerKind::Starts { strict },
                    Kind::Handles {
                        strict,
                        many,
                        unmatched: u,
                    } => {
                        unmatched = u;
                        HandlerKind::Handles { strict, many }
                    }
                    Kind::Timeout => HandlerKind::Timeout,
                };
                let correlation = match (kind, correlate) {
                    (HandlerKind::Timeout, _) => Correlation::Instance,
                    (_, Some(c)) => Correlation::Field {
                        state: c.state_field,
                        message: c.message_field,
                    },
                    (_, None) => Correlation::Id,
                };
                handlers.push(HandlerDef {
                    ident: method.ident,
                    kind,
                    message,
                    state,
                    correlation,
                    limits,
                    unmatched,
                });
            }
        }
    }

    Ok(ProcessDef {
        item,
        type_ident,
        name,
        runtime: args
            .runtime
            .unwrap_or_else(crate::attr_args::default_runtime),
        state: args.state,
        on_complete: args.on_complete.unwrap_or_default(),
        concurrency: args.concurrency.unwrap_or_default(),
        handlers,
        on_errors,
        any_handler_attr,
        any_starts_attr,
    })
}
