//! An empty `#[message(name = "")]`.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
#[message(name = "")]
pub struct PaymentDue;

fn main() {}
