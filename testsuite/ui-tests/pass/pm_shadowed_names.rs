//! The code `#[process_manager]` and `#[derive(Message)]` generate must not
//! depend on what `Result`, `Option`, `Vec`, `Box`, `String`, `Send`,
//! `Value` or `Clone` mean in the user's module.
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
    pub struct Pin;
    pub struct Clone;
    pub trait Future {}
    pub enum Ok {}
    pub enum Err {}
    pub enum Some {}
    pub enum None {}
    pub fn drop() {}
    pub fn decode_message() {}
    pub fn correlation_value() {}

    #[derive(Message, Serialize, Deserialize)]
    pub struct Opened {
        #[correlation_id]
        pub id: u64,
        pub key: std::string::String,
    }

    #[derive(Message, Serialize, Deserialize)]
    pub struct Touched {
        pub key: std::string::String,
    }

    #[derive(Default, Serialize, Deserialize)]
    pub struct Tracked {
        pub key: std::string::String,
        pub touches: u32,
    }

    pub struct Shadowed;

    #[process_manager(state = Tracked)]
    impl Shadowed {
        #[starts]
        #[correlate(state.key = msg.key)]
        async fn opened(
            &self,
            msg: Opened,
            state: &mut Tracked,
            ctx: &mut ProcessContext,
        ) -> std::result::Result<(), ProcessError> {
            let _ = (msg.id, ctx);
            state.touches = 0;
            std::result::Result::Ok(())
        }

        #[handles(strict)]
        #[correlate(state.key = msg.key)]
        async fn touched(
            &self,
            msg: Touched,
            state: &mut Tracked,
            ctx: &mut ProcessContext,
        ) -> std::result::Result<(), ProcessError> {
            let _ = (msg, ctx);
            state.touches += 1;
            std::result::Result::Ok(())
        }
    }
}

fn main() {
    use saga_runtime::process::ProcessManager;
    use shadowing::{Shadowed, Tracked};

    assert_eq!(<Shadowed as ProcessManager>::NAME, "shadowed");
    assert_eq!(Shadowed::definition().handlers.len(), 2);
    let opened = serde_json::json!({ "id": 7, "key": "k-1" });
    assert_eq!(
        Shadowed::message_key("Opened", &opened).unwrap(),
        Some("k-1".to_owned())
    );
    // A starting message correlated by a field seeds the fresh state.
    let mut state = Tracked::default();
    Shadowed::seed("Opened", &opened, &mut state).unwrap();
    assert_eq!(state.key, "k-1");
    // One index key per distinct state field.
    assert_eq!(
        Shadowed::state_keys(&state),
        vec![("key", "k-1".to_owned())]
    );
}
