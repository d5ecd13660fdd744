//! `#[derive(Message)]` with two `#[correlation_id]` fields.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub struct Twice {
    #[correlation_id]
    pub a: u64,
    #[correlation_id]
    pub b: u64,
}

fn main() {}
