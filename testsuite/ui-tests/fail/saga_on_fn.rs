//! `#[saga]` on a function.
use saga_runtime::prelude::*;

#[saga]
pub fn create_zip() {}

fn main() {}
