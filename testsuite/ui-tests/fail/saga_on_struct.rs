//! `#[saga]` on a struct.
use saga_runtime::prelude::*;

#[saga]
#[cancellable]
pub struct CreateZip;

fn main() {}
