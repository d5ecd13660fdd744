//! Error accumulation, after serde_derive's `internals/ctxt.rs`.
//!
//! Every stage reports into one [`Ctxt`] and keeps going, so a user sees all
//! independent mistakes of one `#[saga]` at once instead of fixing them one
//! compile at a time. The `Drop` check makes forgetting to look at the errors
//! a bug caught in this crate's tests rather than silently lost diagnostics.

use std::cell::RefCell;
use std::fmt::Display;
use std::thread;

use proc_macro2::Span;
use quote::ToTokens;

/// Collects errors while the input is parsed, modelled and checked.
pub struct Ctxt {
    // `None` once `check` has consumed them.
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    pub fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// An error spanning the tokens of `obj` (its first to its last token).
    pub fn error_spanned_by<A: ToTokens, T: Display>(&self, obj: A, msg: T) {
        self.syn_error(syn::Error::new_spanned(obj.into_token_stream(), msg));
    }

    /// An error at one span.
    pub fn error_at<T: Display>(&self, span: Span, msg: T) {
        self.syn_error(syn::Error::new(span, msg));
    }

    /// Adds an error produced by syn (a parse failure).
    // Reporting after `check()` is a bug of this crate, as in serde_derive's
    // `Ctxt`: the panic names it (a proc macro's panic is a compile error).
    #[allow(clippy::expect_used)]
    pub fn syn_error(&self, err: syn::Error) {
        self.errors
            .borrow_mut()
            .as_mut()
            .expect("Ctxt used after check()")
            .push(err);
    }

    /// Adds every error inside a darling error, each at its own span.
    pub fn darling_error(&self, err: darling::Error) {
        for e in err.flatten() {
            self.syn_error(e.into());
        }
    }

    /// How many errors have been reported so far: lets a stage tell whether
    /// its own input was already found wrong, and stay quiet about what
    /// follows from that.
    pub fn error_count(&self) -> usize {
        self.errors.borrow().as_ref().map_or(0, Vec::len)
    }

    /// Consumes the context: `Err` with every error reported, in order.
    // Checking twice is a bug of this crate (see `syn_error`).
    #[allow(clippy::expect_used)]
    pub fn check(self) -> Result<(), Vec<syn::Error>> {
        let errors = self
            .errors
            .borrow_mut()
            .take()
            .expect("check() called twice");
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// One `compile_error!` per error, each at its own span.
pub fn compile_errors(errors: Vec<syn::Error>) -> proc_macro2::TokenStream {
    errors.into_iter().map(|e| e.into_compile_error()).collect()
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !thread::panicking() && self.errors.borrow().is_some() {
            panic!("forgot to check for errors");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_returns_errors_in_order() {
        let cx = Ctxt::new();
        cx.error_at(Span::call_site(), "first");
        cx.error_at(Span::call_site(), "second");
        let errors = cx.check().unwrap_err();
        let messages: Vec<_> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(messages, ["first", "second"]);
    }

    #[test]
    #[should_panic(expected = "forgot to check for errors")]
    fn dropping_unchecked_panics() {
        let _cx = Ctxt::new();
    }
}
