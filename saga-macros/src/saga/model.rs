//! The IR: what a `#[saga]` impl declares, independent of how it was written.
//!
//! Built from the parsed attributes by `lower.rs` (this module does not know
//! how they were parsed); `check.rs` validates it as a whole and
//! `expand.rs` generates code from it alone. Parts that were invalid are
//! `None` (already reported), which tells the checks to skip the rules that
//! depend on them.

use darling::util::SpannedValue;
use heck::ToUpperCamelCase;
use proc_macro2::{Span, TokenStream};
use quote::format_ident;
use syn::{Ident, Type};

pub use super::vocab::{Backoff, BreakerScope, OnExhausted, WhenOpen};
use crate::limit::model::Limit;

#[derive(Clone)]
pub struct SagaDef {
    /// The user's impl block, helper attributes removed, otherwise untouched.
    pub item: syn::ItemImpl,
    /// The type's name (last path segment): `CreateZip` in `impl CreateZip<T>`.
    pub type_ident: Ident,
    /// `#[saga(name = "..")]`, or the kebab-case of `type_ident`.
    pub name: String,
    /// `#[saga(version = N)]`, 1 by default.
    pub version: u32,
    /// Where the runtime is: `::saga_runtime`, or `#[saga(crate = ..)]`.
    pub runtime: syn::Path,
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

#[derive(Clone)]
pub struct StepDef {
    pub ident: Ident,
    pub order: Option<SpannedValue<u32>>,
    /// `#[saga_step(n, timeout_ms = ..)]`: one attempt's time limit in
    /// milliseconds (positive); `None` for the engine's default.
    pub timeout_ms: Option<u64>,
    pub input: Option<Type>,
    pub output: Option<Type>,
    /// `input` and `output` as the user wrote them: what the definition
    /// and the fingerprint say, whatever the expansion names them by.
    pub written: (String, String),
    pub takes_ctx: bool,
    pub retry: Option<PolicyDef>,
    pub compensation_retry: Option<PolicyDef>,
    pub breaker: Option<BreakerDef>,
    /// `#[limit(..)]`, in source order.
    pub limits: Vec<Limit>,
}

#[derive(Clone)]
pub struct CompensationDef {
    pub ident: Ident,
    /// The step it undoes.
    pub target: Option<Ident>,
    /// Its parameter: the step's output, or `Outcome<Output, Input>`.
    pub param: Option<Type>,
    /// Set when `param` is written `Outcome<..>`: the compensation also
    /// undoes an attempt of its step whose outcome was lost.
    pub outcome: Option<OutcomeParam>,
    pub takes_ctx: bool,
}

/// A compensation's parameter written `Outcome<..>`.
#[derive(Clone)]
pub struct OutcomeParam {
    /// The two type arguments, `Outcome<Output, Input>`; `None` when not
    /// exactly two types are written (reported by `check`).
    pub args: Option<(Type, Type)>,
    /// The arguments as written (`<..>`), where an error about them goes.
    pub written: TokenStream,
}

#[derive(Clone)]
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

#[derive(Clone)]
pub struct BreakerDef {
    pub failure_threshold: u32,
    pub duration_secs: u64,
    pub scope: Option<BreakerScope>,
    pub when_open: Option<WhenOpen>,
}

/// What `#[saga]` turned out to be on.
pub enum Model {
    Saga(Box<SagaDef>),
    /// Not an impl block (reported); the tokens to re-emit.
    Other(TokenStream),
}

impl SagaDef {
    /// What generated code reaches the runtime through.
    pub fn rt(&self) -> TokenStream {
        let runtime = &self.runtime;
        quote::quote!(#runtime::__private)
    }

    /// What a task started on this definition must find again to go on:
    /// each step's number, name, input and output type as written, hashed
    /// (64-bit FNV-1a, stable across compilers and platforms, unlike
    /// `std`'s hasher). Renaming, reordering, adding or retyping a step
    /// changes it; a changed body does not.
    pub fn fingerprint(&self) -> u64 {
        let mut canonical = String::new();
        for step in self.steps_in_order() {
            let (input, output) = &step.written;
            canonical.push_str(&format!(
                "{}|{}|{input}|{output};",
                step.number(),
                step.ident,
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
