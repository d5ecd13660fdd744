//! stub
use proc_macro::TokenStream;
macro_rules! stub { ($($n:ident),*) => { $( #[proc_macro_attribute] pub fn $n(_a: TokenStream, i: TokenStream) -> TokenStream { i } )* } }
stub!(saga, saga_step, retry_policy, compensation_retry_policy, compensate, circuit_breaker, cancellable);
