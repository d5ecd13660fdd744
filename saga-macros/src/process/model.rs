//! The IR: what a `#[process_manager]` impl declares.
//!
//! Built from the parsed attributes by `lower.rs` (this module does not know
//! how they were parsed); `check.rs` validates it as a whole and
//! `expand.rs` generates code from it alone. Parts that were invalid are
//! `None` (already reported).

use proc_macro2::TokenStream;
use syn::{Ident, Member, Type};

pub use super::vocab::{Concurrency, OnComplete};
use crate::limit::model::Limit;

pub struct ProcessDef {
    /// The user's impl block, helper attributes removed, otherwise untouched.
    pub item: syn::ItemImpl,
    /// The type's name (last path segment).
    pub type_ident: Ident,
    /// `name = ".."`, or the kebab-case of `type_ident`.
    pub name: String,
    /// Where the runtime is: `::saga_runtime`, or `crate = ..`.
    pub runtime: syn::Path,
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
    /// `#[limit(..)]`, in source order.
    pub limits: Vec<Limit>,
    /// `#[handles(hold = "..", then = ..)]`.
    pub unmatched: super::parse::Unmatched,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum HandlerKind {
    Starts {
        strict: bool,
    },
    /// `many`: the message reaches every instance holding its value.
    Handles {
        strict: bool,
        many: bool,
    },
    Timeout,
}

pub enum Correlation {
    /// The message's `#[correlation_id]`.
    Id,
    /// `#[correlate(state.a = msg.b)]`, the members spanned where the user
    /// wrote them (rustc's "no field" and the type check point there).
    Field { state: Member, message: Member },
    /// A timeout: the instance that requested it.
    Instance,
}

pub struct OnErrorDef {
    pub ident: Ident,
    /// The attribute, for "given twice".
    pub attr: syn::Attribute,
}

pub enum Model {
    Process(Box<ProcessDef>),
    /// Not an inherent impl (reported); the tokens to re-emit.
    Other(TokenStream),
}

impl ProcessDef {
    /// What generated code reaches the runtime through.
    pub fn rt(&self) -> TokenStream {
        let runtime = &self.runtime;
        quote::quote!(#runtime::__private)
    }

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

impl ProcessDef {
    /// The first `#[correlate]` that names the same state field as
    /// `member`: generated code reads a state field with that one's tokens
    /// wherever it is correlated, so that rustc's diagnostics about the
    /// field itself (private, missing) come once, not once per handler.
    pub fn first_mention<'a>(&'a self, member: &'a Member) -> &'a Member {
        let name = member_name(member);
        self.state_keys()
            .into_iter()
            .find(|k| member_name(k) == name)
            .unwrap_or(member)
    }
}

impl HandlerDef {
    /// The state field this handler shares among instances
    /// (`#[handles(many)]` with `#[correlate]`).
    pub fn shared_field(&self) -> Option<&Member> {
        match (&self.kind, &self.correlation) {
            (HandlerKind::Handles { many: true, .. }, Correlation::Field { state, .. }) => {
                Some(state)
            }
            _ => None,
        }
    }
}

/// A field's name as the runtime sees it: `order_number`, or `0`.
pub fn member_name(member: &Member) -> String {
    match member {
        Member::Named(ident) => syn::ext::IdentExt::unraw(ident).to_string(),
        Member::Unnamed(index) => index.index.to_string(),
    }
}
