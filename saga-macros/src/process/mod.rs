//! `#[process_manager]`, in the same four stages as `#[saga]`, one module
//! each: `parse/` (attributes and handler signatures -> typed structs,
//! the settings' words in `vocab.rs`), `lower.rs` (-> the IR of
//! `model.rs`), `check.rs` (rules across handlers), `expand.rs` (IR ->
//! tokens); and here, the standalone entry points of its helper
//! attributes, which run only when misplaced, to say so.

mod check;
mod expand;
mod lower;
mod model;
mod parse;
mod vocab;

pub(crate) use parse::is_helper;

use proc_macro2::{Span, TokenStream};
use quote::quote;

use crate::ctxt::Ctxt;
use model::Model;

/// Expands `#[process_manager(args)] item`.
///
/// On any error the output is the user's impl with our helper attributes
/// removed, a stand-in `ProcessManager` impl, and one `compile_error!` per
/// error (as `#[saga]` does): no "cannot find attribute `starts`", no
/// "`ProcessManager` is not implemented" on top of the real mistake.
pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let cx = Ctxt::new();
    let parsed = parse::parse(&cx, args, item);
    let model = lower::build(&cx, parsed);
    if let Model::Process(pm) = &model {
        check::check(&cx, pm);
    }
    // `crate = path` naming something other than the runtime: one error.
    let crate_root = match &model {
        Model::Process(pm) => crate::attr_args::crate_root_check(&pm.runtime),
        Model::Other(_) => TokenStream::new(),
    };
    let expansion = match (cx.check(), model) {
        (Ok(()), Model::Process(pm)) => expand::expand(&pm),
        (result, model) => {
            let errors = crate::ctxt::compile_errors(result.err().unwrap_or_default());
            let item = match model {
                Model::Process(pm) => expand::fallback(&pm),
                Model::Other(tokens) => tokens,
            };
            quote!(#errors #item)
        }
    };
    quote!(#expansion #crate_root)
}

/// A helper attribute (`#[starts]`, `#[handles]`, `#[correlate]`,
/// `#[timeout]`, `#[on_error]`) whose own macro runs: `#[process_manager]`
/// removes them first, so it is not inside one. Says where it belongs and
/// re-emits the item without any of our helpers, so that a method with
/// several of them gives one error.
pub fn standalone(name: &str, _args: TokenStream, item: TokenStream) -> TokenStream {
    let place = if name == "correlate" {
        "a `#[starts]` or `#[handles]` method"
    } else {
        "a method"
    };
    let message = format!(
        "`#[{name}]` must be on {place} of an `impl` block annotated with \
         `#[process_manager(state = ..)]`; add `#[process_manager]` to the impl block (or \
         remove `#[{name}]`)"
    );
    // The call site of an attribute macro is the attribute itself.
    let error = syn::Error::new(Span::call_site(), message).into_compile_error();
    let item = match syn::parse2::<syn::ImplItemFn>(item.clone()) {
        Ok(mut method) => {
            method.attrs.retain(|a| !parse::is_helper(a));
            quote!(#method)
        }
        Err(_) => match syn::parse2::<syn::Item>(item.clone()) {
            Ok(mut parsed) => {
                if let Some(attrs) = item_attrs(&mut parsed) {
                    attrs.retain(|a| !parse::is_helper(a));
                }
                quote!(#parsed)
            }
            Err(_) => item,
        },
    };
    quote!(#error #item)
}

fn item_attrs(item: &mut syn::Item) -> Option<&mut Vec<syn::Attribute>> {
    match item {
        syn::Item::Fn(f) => Some(&mut f.attrs),
        syn::Item::Impl(i) => Some(&mut i.attrs),
        syn::Item::Struct(s) => Some(&mut s.attrs),
        syn::Item::Enum(e) => Some(&mut e.attrs),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    fn fulfillment() -> (proc_macro2::TokenStream, proc_macro2::TokenStream) {
        let args = quote!(name = "fulfillment", state = FulfillmentState);
        let item = quote! {
            impl Fulfillment {
                #[starts]
                async fn submitted(&self, msg: OrderSubmitted, state: &mut FulfillmentState, ctx: &mut ProcessContext) -> Result<(), ProcessError> { Ok(()) }
                #[handles(strict)]
                #[correlate(state.order_number = msg.order_number)]
                #[limit(concurrency = 2, rate = 10, per = "1m", key = msg.warehouse.code)]
                #[saga_runtime::limit(concurrency = 5, name = "wms")]
                async fn reserved(&self, msg: InventoryReserved, state: &mut FulfillmentState, ctx: &mut ProcessContext) -> Result<(), ProcessError> { Ok(()) }
                #[timeout]
                async fn payment_due(&self, t: PaymentDue, state: &mut FulfillmentState, ctx: &mut ProcessContext) -> Result<(), ProcessError> { Ok(()) }
                #[on_error]
                fn on_error(&self, failure: &Failure) -> ErrorAction { ErrorAction::Skip }
            }
        };
        (args, item)
    }

    #[test]
    fn expansion_is_valid_rust_with_absolute_paths() {
        let (args, item) = fulfillment();
        let out = super::expand(args, item);
        let file: syn::File = syn::parse2(out.clone()).expect("the expansion parses");
        // The user's impl, the assertions and the trait impl.
        assert_eq!(file.items.len(), 3);
        let text = out.to_string();
        if std::env::var_os("SHOW_EXPANSION").is_some() {
            println!("{text}");
        }
        assert!(!text.contains("compile_error"), "{text}");
        // Helper attributes are gone from the re-emitted impl.
        for helper in [
            "# [starts]",
            "# [handles",
            "# [correlate",
            "# [timeout]",
            "# [on_error]",
            "# [limit",
            "# [saga_runtime :: limit",
        ] {
            assert!(!text.contains(helper), "{helper} left in {text}");
        }
        // Everything generated is named absolutely: no bare `Result`, `Box`,
        // `Vec`, ... (the user's own impl, item 0, may say what it likes).
        let mut bare = Vec::new();
        find_bare(
            quote!(-> ::core::result::Result<Vec<u8>, E>),
            &mut None,
            &mut bare,
        );
        assert_eq!(bare, ["Vec"]);
        for item in &file.items[1..] {
            let mut bare = Vec::new();
            find_bare(quote!(#item), &mut None, &mut bare);
            assert!(bare.is_empty(), "bare {bare:?} in {item:?}");
        }
        assert!(text.contains("state_field : \"order_number\""), "{text}");
        assert!(
            text.contains("Handles { strict : true , many : false }"),
            "{text}"
        );
        assert!(text.contains("fn on_error"), "{text}");
        assert!(text.contains("name : \"fulfillment.reserved\""), "{text}");
        assert!(text.contains("expr : \"msg.warehouse.code\""), "{text}");
        assert!(text.contains("name : \"wms\""), "{text}");
        // Two assertions per pair of handlers (three pairs here): one type,
        // one wire name.
        assert_eq!(text.matches(":: core :: assert !").count(), 6, "{text}");
        assert!(
            text.contains("`PaymentDue` (the message of `payment_due`) is the same type as `InventoryReserved` (the message of `reserved`)"),
            "{text}"
        );
        assert!(
            text.contains("`PaymentDue` (the message of `payment_due`) has the same wire name as `InventoryReserved` (the message of `reserved`)"),
            "{text}"
        );
    }

    /// Prelude names used without a leading `::path::`.
    fn find_bare(
        tokens: proc_macro2::TokenStream,
        prev: &mut Option<proc_macro2::TokenTree>,
        out: &mut Vec<String>,
    ) {
        use proc_macro2::TokenTree;
        const PRELUDE: [&str; 12] = [
            "Result", "Option", "Vec", "Box", "String", "Some", "None", "Ok", "Err", "Send",
            "Sync", "Value",
        ];
        for tt in tokens {
            match &tt {
                TokenTree::Group(g) => {
                    *prev = None;
                    find_bare(g.stream(), prev, out);
                }
                TokenTree::Ident(i) if PRELUDE.contains(&i.to_string().as_str()) => {
                    let qualified = matches!(prev, Some(TokenTree::Punct(p)) if p.as_char() == ':');
                    if !qualified {
                        out.push(i.to_string());
                    }
                }
                _ => {}
            }
            *prev = Some(tt);
        }
    }

    #[test]
    fn standalone_helper_strips_the_others() {
        let item = quote! {
            #[correlate(state.a = msg.a)]
            async fn reserved(&self) {}
        };
        let out = super::standalone("handles", quote!(), item).to_string();
        assert!(out.contains("compile_error"), "{out}");
        assert!(!out.contains("correlate ("), "{out}");
    }
}
