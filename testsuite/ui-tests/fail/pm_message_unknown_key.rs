//! A misspelled key in `#[message(..)]`.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
#[message(nam = "payment-due")]
pub struct PaymentDue;

fn main() {}
