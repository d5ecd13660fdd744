//! The IR: what a `#[saga]` impl declares, independent of how it was written.
//!
//! Built from the parsed attributes; `check.rs` validates it as a whole and
//! `expand.rs` generates code from it alone. Parts that were invalid are
//! `None` (already reported), which tells the checks to skip the rules that
//! depend on them.

use darling::util::SpannedValue;
use heck::{ToKebabCase, ToUpperCamelCase};
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, ToTokens};
use syn::{Ident, ImplItem, Type};

use super::parse::{self, Parsed, ParsedSaga, Role};
use crate::ctxt::Ctxt;

pub struct SagaDef {
    /// The user's impl block, helper attributes removed, otherwise untouched.
    pub item: syn::ItemImpl,
    /// The type's name (last path segment): `CreateZip` in `impl CreateZip<T>`.
    pub type_ident: Ident,
    /// `#[saga(name = "..")]`, or the kebab-case of `type_ident`.
    pub name: String,
    /// `#[saga(version = N)]`, 1 by default.
    pub version: u32,
    pub cancellable: bool,
    /// In source order; `check` makes sure their numbers are 1..=n.
    pub steps: Vec<StepDef>,
    pub compensations: Vec<CompensationDef>,
    /// Whether `#[saga_step]` appears at all (even if malformed).
    pub any_step_attr: bool,
    /// Names of every method in the impl, for "is not a step" messages.
    pub method_names: Vec<Ident>,
    /// `#[saga]` on a trait impl (reported): the rules about steps are not
    /// checked, only the stand-ins are generated.
    pub misplaced: bool,
}

pub struct StepDef {
    pub ident: Ident,
    pub order: Option<SpannedValue<u32>>,
    /// `#[saga_step(n, timeout_ms = ..)]`: one attempt's time limit in
    /// milliseconds (positive); `None` for the engine's default.
    pub timeout_ms: Option<u64>,
    pub input: Option<Type>,
    pub output: Option<Type>,
    pub takes_ctx: bool,
    pub retry: Option<PolicyDef>,
    pub compensation_retry: Option<PolicyDef>,
    pub breaker: Option<BreakerDef>,
}

pub struct CompensationDef {
    pub ident: Ident,
    /// The step it undoes.
    pub target: Option<Ident>,
    /// Its parameter: the step's output.
    pub param: Option<Type>,
    pub takes_ctx: bool,
}

pub struct PolicyDef {
    /// The attribute's tokens, to point errors at it.
    pub attr: TokenStream,
    pub max_retries: u32,
    pub backoff: Backoff,
    pub base_delay_ms: u64,
    pub max_delay_ms: Option<u64>,
    pub jitter: Option<bool>,
    pub on_exhausted: Option<OnExhausted>,
}

/// `backoff = ..` of a retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backoff {
    Exponential,
    Linear,
    Constant,
}

/// `on_exhausted = ..` of a retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExhausted {
    Compensate,
    Fail,
    DeadLetter,
}

pub struct BreakerDef {
    pub failure_threshold: u32,
    pub duration_secs: u64,
}

/// What `#[saga]` turned out to be on.
pub enum Model {
    Saga(Box<SagaDef>),
    /// Not an impl block (reported); the tokens to re-emit.
    Other(TokenStream),
}

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
                    input: step.sig.input,
                    output: step.sig.output,
                    takes_ctx: step.sig.takes_ctx,
                    retry: step.retry.map(policy),
                    compensation_retry: step.compensation_retry.map(policy),
                    breaker: step.breaker.map(|b| BreakerDef {
                        failure_threshold: b.failure_threshold,
                        duration_secs: b.duration_secs,
                    }),
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

pub(crate) fn type_ident(ty: &Type) -> Option<Ident> {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last().map(|s| s.ident.clone()),
        Type::Group(g) => type_ident(&g.elem),
        Type::Paren(p) => type_ident(&p.elem),
        _ => None,
    }
}

impl SagaDef {
    /// What a task started on this definition must find again to go on:
    /// each step's number, name, input and output type as written, hashed
    /// (64-bit FNV-1a, stable across compilers and platforms, unlike
    /// `std`'s hasher). Renaming, reordering, adding or retyping a step
    /// changes it; a changed body does not.
    pub fn fingerprint(&self) -> u64 {
        let mut canonical = String::new();
        for step in self.steps_in_order() {
            let ty = |t: &Option<Type>| t.as_ref().map(type_to_string).unwrap_or_default();
            canonical.push_str(&format!(
                "{}|{}|{}|{};",
                step.number(),
                step.ident,
                ty(&step.input),
                ty(&step.output)
            ));
        }
        canonical.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// Steps sorted by number (only meaningful once `check` passed).
    pub fn steps_in_order(&self) -> Vec<&StepDef> {
        let mut steps: Vec<&StepDef> = self.steps.iter().collect();
        // Steps without a valid number (already reported) go last.
        steps.sort_by_key(|s| (s.order.is_none(), s.order.as_deref().copied()));
        steps
    }

    /// The compensation of `step`, if one names it.
    pub fn compensation_of(&self, step: &StepDef) -> Option<&CompensationDef> {
        self.compensations
            .iter()
            .find(|c| c.target.as_ref() == Some(&step.ident))
    }

    /// `{Type}StepOutput`.
    pub fn output_enum_ident(&self) -> Ident {
        format_ident!("{}StepOutput", self.type_ident)
    }

    /// `{Type}Reconciliation`.
    pub fn reconciliation_ident(&self) -> Ident {
        format_ident!("{}Reconciliation", self.type_ident)
    }
}

impl StepDef {
    /// The step's number (`0` only before `check` has passed).
    pub fn number(&self) -> u32 {
        self.order.as_deref().copied().unwrap_or(0)
    }

    pub fn number_span(&self) -> Span {
        self.order
            .as_ref()
            .map_or_else(|| self.ident.span(), |o| o.span())
    }

    /// The variant of `{Type}StepOutput` holding this step's output.
    pub fn variant_ident(&self) -> Ident {
        format_ident!("{}", self.ident.to_string().to_upper_camel_case())
    }
}

/// A type as a user would write it, for messages and for the definition's
/// `input_type`/`output_type` strings.
pub fn type_to_string(ty: &Type) -> String {
    tokens_to_string(&ty.to_token_stream())
}

/// Token text without the spaces `TokenStream`'s `Display` puts around
/// punctuation: `Vec<u8>` rather than `Vec < u8 >`.
fn tokens_to_string(tokens: &TokenStream) -> String {
    let raw = tokens.to_string();
    let mut out = String::with_capacity(raw.len());
    let chars: Vec<char> = raw.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c == ' ' {
            let prev = if i > 0 { chars[i - 1] } else { ' ' };
            let next = chars.get(i + 1).copied().unwrap_or(' ');
            let glue_before = matches!(next, '<' | '>' | ',' | ';' | ':' | ')' | ']');
            let glue_after = matches!(prev, '<' | ':' | '&' | '(' | '[');
            // Keep `dyn Trait`, `&'a T`, `-> T` readable.
            let keep = matches!(prev, ',') || (prev == '>' && next.is_alphanumeric());
            if (glue_before || glue_after) && !keep {
                continue;
            }
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_strings_read_like_source() {
        let ty: Type = syn::parse_quote!(std::collections::HashMap<String, Vec<u8>>);
        assert_eq!(
            type_to_string(&ty),
            "std::collections::HashMap<String, Vec<u8>>"
        );
        let ty: Type = syn::parse_quote!(&'a mut [u8]);
        assert_eq!(type_to_string(&ty), "&'a mut [u8]");
        let ty: Type = syn::parse_quote!((A, B));
        assert_eq!(type_to_string(&ty), "(A, B)");
    }
}
