//! What the macros need to know about types as written: their text for
//! messages, their last identifier, and a syntactic comparison for hints.
//! Whether two types are *the same* is the compiler's call (the generated
//! `where` clauses ask it); nothing here decides that.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::visit_mut::VisitMut;
use syn::{Ident, Type};

/// The last identifier of a type's path: `CreateZip` in `a::CreateZip<T>`.
pub fn type_ident(ty: &Type) -> Option<Ident> {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last().map(|s| s.ident.clone()),
        Type::Group(g) => type_ident(&g.elem),
        Type::Paren(p) => type_ident(&p.elem),
        _ => None,
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

/// Whether two types are written the same, ignoring leading path qualifiers
/// (`crate::a::UploadResult` == `UploadResult`) and grouping.
///
/// Syntactic: good for guessing what a mistake was meant to be (a state
/// passed where the message goes) and for spotting one message type
/// handled twice, not for deciding that two types differ.
pub fn same_type(a: &Type, b: &Type) -> bool {
    normalize(a) == normalize(b)
}

/// The token string of `ty` with every path reduced to its last segment.
pub fn normalize(ty: &Type) -> String {
    let mut ty = ty.clone();
    StripQualifiers.visit_type_mut(&mut ty);
    ty.to_token_stream().to_string()
}

struct StripQualifiers;

impl VisitMut for StripQualifiers {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        // `(T)` and invisible groups (from `macro_rules!` fragments) are
        // just `T`.
        loop {
            match ty {
                Type::Group(g) => *ty = (*g.elem).clone(),
                Type::Paren(p) => *ty = (*p.elem).clone(),
                _ => break,
            }
        }
        syn::visit_mut::visit_type_mut(self, ty);
    }

    fn visit_type_path_mut(&mut self, ty: &mut syn::TypePath) {
        if ty.qself.is_none() && ty.path.segments.len() > 1 {
            if let Some(last) = ty.path.segments.pop() {
                ty.path.segments.clear();
                ty.path.segments.push(last);
            }
        }
        ty.path.leading_colon = None;
        syn::visit_mut::visit_type_path_mut(self, ty);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

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

    fn same(a: Type, b: Type) -> bool {
        same_type(&a, &b)
    }

    #[test]
    fn leading_qualifiers_are_ignored() {
        assert!(same(
            parse_quote!(crate::a::UploadResult),
            parse_quote!(UploadResult)
        ));
        assert!(same(
            parse_quote!(::std::vec::Vec<u8>),
            parse_quote!(Vec<u8>)
        ));
        assert!(same(
            parse_quote!(Option<crate::x::Receipt>),
            parse_quote!(std::option::Option<Receipt>)
        ));
        assert!(same(parse_quote!((A)), parse_quote!(A)));
    }

    #[test]
    fn different_types_differ() {
        assert!(!same(parse_quote!(Foo), parse_quote!(UploadResult)));
        assert!(!same(parse_quote!(Vec<u8>), parse_quote!(Vec<u16>)));
        assert!(!same(parse_quote!((A, B)), parse_quote!((B, A))));
        assert!(!same(parse_quote!(Option<A>), parse_quote!(A)));
    }

    #[test]
    fn qualified_self_paths_are_kept() {
        assert!(!same(
            parse_quote!(<T as a::Tr>::Out),
            parse_quote!(<T as b::Other>::Out)
        ));
    }
}
