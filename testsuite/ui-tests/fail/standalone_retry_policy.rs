//! `#[retry_policy]` outside a `#[saga]` impl.
use saga_runtime::prelude::*;

#[retry_policy(max_retries = 3, backoff = exponential, base_delay_ms = 200)]
async fn upload() {}

fn main() {}
