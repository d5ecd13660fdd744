//! Owns the workspace's examples and integration tests; the library is
//! `saga-runtime`. The README's code blocks are compiled and run as doctests
//! from here.

#[doc(hidden)]
pub mod batch;
#[doc(hidden)]
pub mod chaos;
#[doc(hidden)]
pub mod crashy;
#[doc(hidden)]
pub mod shop;

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
