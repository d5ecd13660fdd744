//! `#[correlation_id]` inside an enum message.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Message, Serialize, Deserialize)]
pub enum Payment {
    Captured {
        #[correlation_id]
        order_id: u64,
    },
    Declined,
}

fn main() {}
