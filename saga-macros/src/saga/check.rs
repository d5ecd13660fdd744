//! Rules that relate several methods of one saga: step numbering and which
//! compensation belongs to which step.
//!
//! A rule runs only when what it depends on is known to be valid. This is
//! what keeps one mistake at one error.
//!
//! The chain of types from one step to the next is not judged here: types
//! written differently may be the same (an alias, a path) and types written
//! alike may differ, so `expand.rs` hands that question to the compiler.

use std::collections::HashMap;

use syn::Ident;

use super::model::{CompensationDef, SagaDef, StepDef};
use crate::ctxt::Ctxt;
use crate::limit::model::Limit;
use crate::suggest;

pub fn check(cx: &Ctxt, saga: &SagaDef) {
    check_has_steps(cx, saga);
    check_numbering(cx, saga);
    check_compensations(cx, saga);
    check_outcome_params(cx, saga);
    check_generic_params(cx, saga);
    check_limits(cx, saga);
}

/// A limit's name is one budget (`crate::limit::check`); a keyed one
/// names the step's input in the definition.
fn check_limits(cx: &Ctxt, saga: &SagaDef) {
    let uses: Vec<(&Ident, &[Limit])> = saga
        .steps
        .iter()
        .map(|s| (&s.ident, s.limits.as_slice()))
        .collect();
    crate::limit::check::check_names(cx, &saga.name, &uses);
    for step in &saga.steps {
        crate::limit::check::check_key_type(cx, &step.limits, step.input.as_ref());
    }
}

fn check_has_steps(cx: &Ctxt, saga: &SagaDef) {
    if !saga.any_step_attr {
        cx.error_spanned_by(
            &saga.item.self_ty,
            format!(
                "`#[saga]` impl `{}` has no steps: mark its methods `#[saga_step(1)]`, \
                 `#[saga_step(2)]`, ... in the order they run",
                saga.type_ident
            ),
        );
    }
}

/// Duplicates, then 1, 2, 3, ... without gaps.
fn check_numbering(cx: &Ctxt, saga: &SagaDef) {
    // A step whose number was invalid has been reported already; any
    // conclusion about the numbering would be a guess.
    if saga.steps.iter().any(|s| s.order.is_none()) || saga.steps.is_empty() {
        return;
    }
    let mut first_with: HashMap<u32, &StepDef> = HashMap::new();
    for step in &saga.steps {
        let n = step.number();
        if let Some(first) = first_with.get(&n) {
            cx.error_at(
                step.number_span(),
                format!(
                    "step number {n} is already used by `{}`; give each step its own number",
                    first.ident
                ),
            );
        } else {
            first_with.insert(n, step);
        }
    }
    let mut numbers: Vec<u32> = first_with.keys().copied().collect();
    numbers.sort_unstable();
    for (expected, n) in (1u32..).zip(numbers) {
        if n != expected {
            let step = first_with[&n];
            cx.error_at(
                step.number_span(),
                format!(
                    "steps must be numbered 1, 2, 3, ... without gaps; expected {expected} here"
                ),
            );
            // Later numbers are off by the same gap: one error is enough.
            return;
        }
    }
}

fn check_compensations(cx: &Ctxt, saga: &SagaDef) {
    let step_names: Vec<String> = saga.steps.iter().map(|s| s.ident.to_string()).collect();
    let mut taken: HashMap<String, &CompensationDef> = HashMap::new();
    let mut all_resolved = true;
    for comp in &saga.compensations {
        let Some(target) = &comp.target else {
            all_resolved = false;
            continue;
        };
        if !saga.steps.iter().any(|s| s.ident == *target) {
            all_resolved = false;
            report_unknown_target(cx, saga, target, &step_names);
            continue;
        }
        if let Some(first) = taken.get(&target.to_string()) {
            cx.error_spanned_by(
                target,
                format!(
                    "step `{target}` already has a compensation, `{}`; a step has at most one \
                     (merge the two methods)",
                    first.ident
                ),
            );
            continue;
        }
        taken.insert(target.to_string(), comp);
    }

    // With an unresolved `#[compensate(..)]`, "no compensation" may just be
    // the consequence of that typo.
    if !all_resolved {
        return;
    }
    for step in &saga.steps {
        if let Some(policy) = &step.compensation_retry {
            if saga.compensation_of(step).is_none() {
                cx.error_spanned_by(
                    &policy.attr,
                    format!(
                        "`#[compensation_retry_policy]` is on `{0}`, which has no compensation: \
                         add a method marked `#[compensate({0})]`, or remove this attribute",
                        step.ident
                    ),
                );
            }
        }
    }
}

/// `Outcome` names two types, the step's output then its input: any
/// other number is one error on the arguments, with the two types of the
/// step it undoes (when that step is known). Whether the two are the
/// right ones is the compiler's call (`expand.rs`).
fn check_outcome_params(cx: &Ctxt, saga: &SagaDef) {
    for comp in &saga.compensations {
        let Some(outcome) = comp.outcome.as_ref().filter(|o| o.args.is_none()) else {
            continue;
        };
        let step = comp
            .target
            .as_ref()
            .and_then(|target| saga.steps.iter().find(|s| s.ident == *target));
        let (input, output) = match step.map(|s| &s.written) {
            Some((input, output)) if !input.is_empty() && !output.is_empty() => {
                (input.as_str(), output.as_str())
            }
            _ => ("Input", "Output"),
        };
        let step = match step {
            Some(step) => format!("step `{}`", step.ident),
            None => "the step".to_owned(),
        };
        cx.error_spanned_by(
            &outcome.written,
            format!(
                "`Outcome` takes two types, the output of the step it undoes and then that \
                 step's input: `Outcome<{output}, {input}>` for {step} (`Completed` carries the \
                 output; `Unknown`, for an attempt whose outcome was lost, the input)"
            ),
        );
    }
}

fn report_unknown_target(cx: &Ctxt, saga: &SagaDef, target: &Ident, step_names: &[String]) {
    let hint = suggest::did_you_mean(&target.to_string(), step_names.iter().map(String::as_str));
    let message = if saga.method_names.iter().any(|m| m == target) {
        format!("`{target}` is not a step: only `#[saga_step]` methods can be compensated{hint}")
    } else {
        let steps = if step_names.is_empty() {
            String::new()
        } else {
            format!(
                " (steps: {})",
                step_names
                    .iter()
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        format!("there is no step named `{target}` in this saga{hint}{steps}")
    };
    cx.error_spanned_by(target, message);
}

/// Step inputs and outputs are persisted and named by the generated
/// `{Type}StepOutput` enum, which is not generic: they can't mention the
/// impl's type parameters.
fn check_generic_params(cx: &Ctxt, saga: &SagaDef) {
    let params = crate::item::params(&saga.item.generics);
    if params.is_empty() {
        return;
    }
    let types = saga
        .steps
        .iter()
        .flat_map(|s| [&s.input, &s.output])
        .chain(saga.compensations.iter().map(|c| &c.param))
        .flatten();
    for ty in types {
        if let Some(param) = crate::item::param_used_in(ty, &params) {
            cx.error_spanned_by(
                &param,
                format!(
                    "a step's input or output can't use the impl's generic parameter `{param}`: \
                     step values are persisted as JSON and named by the generated `{}` enum; \
                     use a concrete type",
                    saga.output_enum_ident()
                ),
            );
        }
    }
}
