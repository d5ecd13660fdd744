//! `#[process_manager(..)]`'s own arguments -> [`ProcessArgs`]: the
//! state type, and the keys beside it.

use super::*;

const ARG_KEYS: [&str; 5] = ["name", "state", "on_complete", "concurrency", "crate"];

pub(super) fn parse_args(cx: &Ctxt, args: TokenStream) -> ProcessArgs {
    let items = match parse_arg_items.parse2(args) {
        Ok(items) => items,
        Err(err) => {
            cx.syn_error(err);
            return ProcessArgs::default();
        }
    };
    let errors_before = cx.error_count();
    let keys = key_values(cx, "process_manager", &ARG_KEYS, &[], items);
    let malformed = cx.error_count() > errors_before;

    let mut args = ProcessArgs::default();
    if let Some(meta) = keys.get("name") {
        match name_value(meta) {
            Some(Expr::Lit(syn::ExprLit {
                lit: Lit::Str(s), ..
            })) => {
                let name = s.value();
                if crate::name::check(cx, "process manager", &name, s.span(), "fulfillment") {
                    args.name = Some(SpannedValue::new(name, s.span()));
                }
            }
            Some(other) => {
                cx.error_spanned_by(other, "expected a string literal: `name = \"fulfillment\"`")
            }
            None => cx.error_spanned_by(meta, "`name` needs a value: `name = \"fulfillment\"`"),
        }
    }
    match keys.get("state") {
        Some(meta) => args.state = state_type(cx, meta),
        // A misspelled `state` key is reported already, with a suggestion.
        None if !malformed => cx.error_at(
            Span::call_site(),
            "`#[process_manager]` needs the state type: `#[process_manager(state = MyState)]`, \
             where `MyState` is what one instance remembers between messages \
             (`#[derive(Default, Serialize, Deserialize)]`)",
        ),
        None => {}
    }
    args.on_complete = keys.get("on_complete").and_then(|m| {
        choice(
            cx,
            m,
            "on_complete action",
            &[("keep", OnComplete::Keep), ("delete", OnComplete::Delete)],
        )
    });
    args.concurrency = keys.get("concurrency").and_then(|m| {
        choice(
            cx,
            m,
            "concurrency mode",
            &[
                ("optimistic", Concurrency::Optimistic),
                ("pessimistic", Concurrency::Pessimistic),
            ],
        )
    });
    args.runtime = keys.get("crate").and_then(|m| runtime_path(cx, m));
    args
}

/// `key = value, ..` where the value of `state` is a type (`Wrapper<u8>`,
/// `HashMap<K, V>`: not an expression, and its commas are not separators).
pub(super) fn parse_arg_items(input: ParseStream) -> syn::Result<Vec<NestedMeta>> {
    let mut items = Vec::new();
    while !input.is_empty() {
        let is_state = input.peek(syn::Ident) && input.peek2(syn::Token![=]) && {
            let fork = input.fork();
            fork.parse::<Ident>().is_ok_and(|i| i == "state")
        };
        if is_state {
            let path: syn::Path = input.parse()?;
            let eq_token: syn::Token![=] = input.parse()?;
            let value = parse_type_value(input)?;
            items.push(NestedMeta::Meta(Meta::NameValue(syn::MetaNameValue {
                path,
                eq_token,
                value,
            })));
        } else {
            items.push(input.parse::<NestedMeta>()?);
        }
        if input.is_empty() {
            break;
        }
        input.parse::<syn::Token![,]>()?;
    }
    Ok(items)
}

/// A type, kept as verbatim tokens; or a string literal naming one.
pub(super) fn parse_type_value(input: ParseStream) -> syn::Result<Expr> {
    let fork = input.fork();
    if let Ok(ty) = fork.parse::<Type>() {
        if fork.is_empty() || fork.peek(syn::Token![,]) {
            input.advance_to(&fork);
            return Ok(Expr::Verbatim(ty.into_token_stream()));
        }
    }
    input.parse::<Expr>()
}

pub(super) fn state_type(cx: &Ctxt, meta: &Meta) -> Option<Type> {
    let example = "`state = MyState`";
    let Some(value) = name_value(meta) else {
        cx.error_spanned_by(meta, format!("`state` needs the state type: {example}"));
        return None;
    };
    let parsed = match value {
        Expr::Verbatim(tokens) => syn::parse2::<Type>(tokens.clone()),
        Expr::Lit(syn::ExprLit {
            lit: Lit::Str(s), ..
        }) => s.parse::<Type>(),
        other => Err(syn::Error::new_spanned(
            other,
            format!("expected the state type: {example}"),
        )),
    };
    match parsed {
        Ok(ty) => Some(ty),
        Err(err) => {
            cx.syn_error(err);
            None
        }
    }
}
