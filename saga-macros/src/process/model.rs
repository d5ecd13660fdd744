//! The IR: what a `#[process_manager]` impl declares.
//!
//! Built from the parsed attributes; `check.rs` validates it as a whole and
//! `expand.rs` generates code from it alone. Parts that were invalid are
//! `None` (already reported).

use heck::ToKebabCase;
use proc_macro2::TokenStream;
use syn::{Ident, Member, Type};

use super::parse::{self, Kind, Parsed, ParsedProcess, Role};
use crate::ctxt::Ctxt;
use crate::saga::model::type_ident;

pub struct ProcessDef {
    /// The user's impl block, helper attributes removed, otherwise untouched.
    pub item: syn::ItemImpl,
    /// The type's name (last path segment).
    pub type_ident: Ident,
    /// `name = ".."`, or the kebab-case of `type_ident`.
    pub name: String,
    /// `state = S`; `None` if missing or malformed (reported).
    pub state: Option<Type>,
    pub on_complete: OnComplete,
    pub concurrency: Concurrency,
    /// In source order.
    pub handlers: Vec<HandlerDef>,
    /// Every `#[on_error]` method (`check` allows one).
    pub on_errors: Vec<OnErrorDef>,
    /// Whether `#[starts]`, `#[handles]` or `#[timeout]` appears at all.
    pub any_handler_attr: bool,
    /// Whether `#[starts]` appears at all (even if malformed).
    pub any_starts_attr: bool,
}

pub struct HandlerDef {
    pub ident: Ident,
    pub kind: HandlerKind,
    /// The message type; `None` if the signature was wrong there.
    pub message: Option<Type>,
    /// `S` in the state parameter `&mut S`, as written.
    pub state: Option<Type>,
    pub correlation: Correlation,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum HandlerKind {
    Starts { strict: bool },
    Handles { strict: bool },
    Timeout,
}

pub enum Correlation {
    /// The message's `#[correlation_id]`.
    Id,
    /// `#[correlate(state.a = msg.b)]`, the members spanned where the user
    /// wrote them (rustc's "no field" and "mismatched types" point there).
    Field { state: Member, message: Member },
    /// A timeout: the instance that requested it.
    Instance,
}

pub struct OnErrorDef {
    pub ident: Ident,
    /// The attribute, for "given twice".
    pub attr: syn::Attribute,
}

/// `on_complete = keep | delete`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnComplete {
    #[default]
    Keep,
    Delete,
}

/// `concurrency = optimistic | pessimistic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Concurrency {
    #[default]
    Optimistic,
    Pessimistic,
}

pub enum Model {
    Process(Box<ProcessDef>),
    /// Not an inherent impl (reported); the tokens to re-emit.
    Other(TokenStream),
}

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
                } = *handler;
                let kind = match kind {
                    Kind::Starts { strict } => HandlerKind::Starts { strict },
                    Kind::Handles { strict } => HandlerKind::Handles { strict },
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
                });
            }
        }
    }

    Ok(ProcessDef {
        item,
        type_ident,
        name,
        state: args.state,
        on_complete: args.on_complete.unwrap_or_default(),
        concurrency: args.concurrency.unwrap_or_default(),
        handlers,
        on_errors,
        any_handler_attr,
        any_starts_attr,
    })
}

impl ProcessDef {
    /// The distinct state fields named in `#[correlate]`, first occurrence
    /// first: the index keys of an instance.
    pub fn state_keys(&self) -> Vec<&Member> {
        let mut keys: Vec<&Member> = Vec::new();
        for handler in &self.handlers {
            if let Correlation::Field { state, .. } = &handler.correlation {
                if !keys.iter().any(|k| member_name(k) == member_name(state)) {
                    keys.push(state);
                }
            }
        }
        keys
    }
}

/// A field's name as the runtime sees it: `order_number`, or `0`.
pub fn member_name(member: &Member) -> String {
    match member {
        Member::Named(ident) => syn::ext::IdentExt::unraw(ident).to_string(),
        Member::Unnamed(index) => index.index.to_string(),
    }
}
