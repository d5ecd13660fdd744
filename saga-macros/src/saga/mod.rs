//! `#[saga]`: parse -> model -> check -> expand.

pub(crate) mod check;
mod expand;
pub(crate) mod model;
pub(crate) mod parse;

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
    let model = model::build(&cx, parsed);
    if let Model::Saga(saga) = &model {
        if !saga.misplaced {
            check::check(&cx, saga);
        }
    }
    match (cx.check(), model) {
        (Ok(()), Model::Saga(saga)) => expand::expand(&saga),
        (result, model) => {
            let errors = crate::ctxt::compile_errors(result.err().unwrap_or_default());
            let item = match model {
                Model::Saga(saga) => expand::fallback(&saga),
                Model::Other(tokens) => tokens,
            };
            quote!(#errors #item)
        }
    }
}
