//! The generated code must not depend on what `Result`, `Option`, `Vec`,
//! `Box`, `Send`, `Sync` or `Value` mean in the user's module.
#![allow(dead_code)]

mod shadowing {
    use saga_runtime::prelude::*;
    use serde::{Deserialize, Serialize};

    pub struct Result;
    pub struct Option;
    pub struct Vec;
    pub struct Box;
    pub struct Send;
    pub struct Sync;
    pub struct Value;
    pub struct String;
    pub trait Future {}
    pub enum Ok {}
    pub enum Err {}
    pub enum Some {}
    pub enum None {}
    pub struct Pin;
    pub struct Duration;
    pub fn drop() {}

    #[derive(Serialize, Deserialize)]
    pub struct Input(pub u32);
    #[derive(Serialize, Deserialize)]
    pub struct Output(pub u32);

    pub struct Shadowed;

    #[saga]
    #[cancellable]
    impl Shadowed {
        #[saga_step(1, timeout_ms = 250)]
        #[retry_policy(max_retries = 2, backoff = linear, base_delay_ms = 10)]
        async fn first(
            &self,
            input: Input,
            ctx: &StepContext,
        ) -> std::result::Result<Output, StepError> {
            let _ = ctx;
            std::result::Result::Ok(Output(input.0))
        }

        #[compensate(first)]
        async fn undo_first(&self, output: Output) -> std::result::Result<(), StepError> {
            let _ = output;
            std::result::Result::Ok(())
        }

        #[saga_step(2)]
        async fn second(&self, output: Output) -> std::result::Result<Output, StepError> {
            std::result::Result::Ok(output)
        }
    }
}

fn main() {
    use saga_runtime::Saga;
    let steps = shadowing::Shadowed::definition().steps;
    assert_eq!(steps.len(), 2);
    assert_eq!(
        steps[0].timeout,
        Some(std::time::Duration::from_millis(250))
    );
    assert_eq!(steps[1].timeout, None);
}
