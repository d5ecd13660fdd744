//! `#[saga]`, in four stages, one module each:
//!
//! 1. `parse/`: attributes and signatures -> typed structs (what one
//!    attribute or one method can tell), with the settings' words in
//!    `vocab.rs`;
//! 2. `lower.rs`: the parsed structs -> the IR of `model.rs` (`SagaDef`,
//!    `StepDef`, `PolicyDef`, ...);
//! 3. `check.rs`: the rules that relate several methods, on the IR;
//! 4. `expand.rs`: the IR -> tokens.
//!
//! Errors gather in one `Ctxt` (`crate::ctxt`) across the stages.

pub(crate) mod check;
mod expand;
mod lower;
pub(crate) mod model;
pub(crate) mod parse;
mod vocab;

use proc_macro2::TokenStream;
use quote::quote;

use crate::ctxt::Ctxt;
use model::Model;

/// Expands `#[saga(args)] item`.
///
/// On any error the output is the user's impl with our helper attributes
/// removed, stand-ins for the generated items, and one `compile_error!` per
/// error: the user sees the mistakes they made and nothing that follows
/// from them (no "cannot find attribute `saga_step`", no "`Saga` is not
/// implemented").
pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let cx = Ctxt::new();
    let parsed = parse::parse(&cx, args, item);
    let model = lower::build(&cx, parsed);
    if let Model::Saga(saga) = &model {
        if !saga.misplaced {
            check::check(&cx, saga);
        }
    }
    // `crate = path` naming something other than the runtime: one error.
    let crate_root = match &model {
        Model::Saga(saga) => crate::attr_args::crate_root_check(&saga.runtime),
        Model::Other(_) => TokenStream::new(),
    };
    let expansion = match (cx.check(), model) {
        (Ok(()), Model::Saga(saga)) => expand::expand(&saga),
        (result, model) => {
            let errors = crate::ctxt::compile_errors(result.err().unwrap_or_default());
            let item = match model {
                Model::Saga(saga) => expand::fallback(&saga),
                Model::Other(tokens) => tokens,
            };
            quote!(#errors #item)
        }
    };
    quote!(#expansion #crate_root)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expansion of a saga of `steps` no-op steps, each with a
    /// compensation and a retry policy: what one more step costs in
    /// generated code, counted in tokens (rustfmt's lines are not at hand
    /// in a proc-macro crate; tokens track them).
    fn tokens_for(steps: u32) -> usize {
        let mut methods = TokenStream::new();
        for n in 1..=steps {
            let step = quote::format_ident!("step_{n}");
            let undo = quote::format_ident!("undo_{n}");
            methods.extend(quote! {
                #[saga_step(#n)]
                #[retry_policy(max_retries = 3, backoff = exponential, base_delay_ms = 1000)]
                async fn #step(&self, input: Value) -> Result<Value, StepError> { Ok(input) }
                #[compensate(#step)]
                async fn #undo(&self, output: Value) -> Result<(), StepError> { Ok(()) }
            });
        }
        let item = quote!(impl Chain { #methods });
        fn count(tokens: TokenStream) -> usize {
            tokens
                .into_iter()
                .map(|tree| match tree {
                    proc_macro2::TokenTree::Group(group) => 1 + count(group.stream()),
                    _ => 1,
                })
                .sum()
        }
        count(expand(TokenStream::new(), item))
    }

    /// Generated code grows by a bounded amount per step: one match arm to
    /// run it, one to compensate it, its definition, its enum variant, its
    /// type checks. A change that makes it grow faster fails here; the
    /// figure printed is what the issue notes report.
    #[test]
    fn generated_code_per_step_stays_small() {
        let (one, eleven) = (tokens_for(1), tokens_for(11));
        let per_step = (eleven - one) / 10;
        println!("expansion: {one} tokens for 1 step, {per_step} tokens per further step");
        assert!(per_step <= 560, "{per_step} tokens per step");
    }
}
