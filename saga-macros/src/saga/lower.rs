//! Parsed attributes -> the IR: the one place that knows both, so that
//! `parse.rs` and `model.rs` need not know each other.

use heck::ToKebabCase;
use proc_macro2::TokenStream;
use syn::ImplItem;

use super::model::{BreakerDef, CompensationDef, Model, PolicyDef, SagaDef, StepDef};
use super::parse::{self, Parsed, ParsedSaga, Role};
use crate::ctxt::Ctxt;
use crate::types::{type_ident, type_to_string};

pub fn build(cx: &Ctxt, parsed: Parsed) -> Model {
    match parsed {
        Parsed::Impl(saga) => match build_saga(cx, *saga) {
            Ok(def) => Model::Saga(Box::new(def)),
            Err(tokens) => Model::Other(tokens),
        },
        Parsed::Other(tokens) => Model::Other(tokens),
    }
}

fn build_saga(cx: &Ctxt, parsed: ParsedSaga) -> Result<SagaDef, TokenStream> {
    let ParsedSaga {
        item,
        args,
        cancellable,
        methods,
        any_step_attr,
        misplaced,
    } = parsed;

    let Some(type_ident) = type_ident(&item.self_ty) else {
        cx.error_spanned_by(
            &item.self_ty,
            "`#[saga]` goes on the impl block of a named type: `impl MySaga { .. }`",
        );
        return Err(quote::quote!(#item));
    };
    let name = match args.name {
        Some(name) => name.into_inner(),
        None => type_ident.to_string().to_kebab_case(),
    };

    let mut steps = Vec::new();
    let mut compensations = Vec::new();
    for method in methods {
        match method.role {
            Role::Step(step) => {
                let step = *step;
                steps.push(StepDef {
                    ident: method.ident,
                    order: step.order,
                    timeout_ms: step.timeout_ms,
                    written: (
                        step.sig
                            .input
                            .as_ref()
                            .map(type_to_string)
                            .unwrap_or_default(),
                        step.sig
                            .output
                            .as_ref()
                            .map(type_to_string)
                            .unwrap_or_default(),
                    ),
                    input: step.sig.input,
                    output: step.sig.output,
                    takes_ctx: step.sig.takes_ctx,
                    retry: step.retry.map(policy),
                    compensation_retry: step.compensation_retry.map(policy),
                    breaker: step.breaker.map(|b| BreakerDef {
                        failure_threshold: b.failure_threshold,
                        duration_secs: b.duration_secs,
                        scope: b.scope,
                        when_open: b.when_open,
                    }),
                    limits: step.limits,
                });
            }
            Role::Compensation(comp) => compensations.push(CompensationDef {
                ident: method.ident,
                target: comp.target,
                param: comp.sig.input,
                takes_ctx: comp.sig.takes_ctx,
            }),
        }
    }

    let method_names = item
        .items
        .iter()
        .filter_map(|i| match i {
            ImplItem::Fn(f) => Some(f.sig.ident.clone()),
            _ => None,
        })
        .collect();

    Ok(SagaDef {
        item,
        type_ident,
        name,
        version: args.version.unwrap_or(1),
        runtime: args
            .runtime
            .unwrap_or_else(crate::attr_args::default_runtime),
        cancellable,
        steps,
        compensations,
        any_step_attr,
        method_names,
        misplaced,
    })
}

fn policy(p: parse::PolicyArgs) -> PolicyDef {
    PolicyDef {
        attr: p.attr,
        max_retries: p.max_retries,
        backoff: p.backoff,
        base_delay_ms: p.base_delay_ms,
        max_delay_ms: p.max_delay_ms,
        jitter: p.jitter,
        on_exhausted: p.on_exhausted,
    }
}
