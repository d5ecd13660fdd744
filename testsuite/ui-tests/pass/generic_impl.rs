//! `#[saga]` on a generic impl: the saga's dependencies are generic, its step
//! types are concrete.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

pub trait Client: Send + Sync + 'static {
    fn put(&self, key: &str) -> String;
}

pub struct Fake;

impl Client for Fake {
    fn put(&self, key: &str) -> String {
        format!("fake:{key}")
    }
}

#[derive(Serialize, Deserialize)]
pub struct Request {
    pub key: String,
}

#[derive(Serialize, Deserialize)]
pub struct Stored {
    pub location: String,
}

pub struct Store<T: Client> {
    client: T,
}

#[saga]
#[cancellable]
impl<T: Client> Store<T>
where
    T: Default,
{
    #[saga_step(1)]
    async fn store(&self, req: Request) -> Result<Stored, StepError> {
        Ok(Stored {
            location: self.client.put(&req.key),
        })
    }

    #[compensate(store)]
    async fn unstore(&self, stored: Stored, ctx: &StepContext) -> Result<(), StepError> {
        let _ = (stored.location, ctx.step());
        Ok(())
    }
}

impl Default for Fake {
    fn default() -> Self {
        Fake
    }
}

fn assert_cancellable<S: Cancellable>() {}

fn main() {
    assert_cancellable::<Store<Fake>>();
    assert_eq!(<Store<Fake> as Saga>::NAME, "store");
    let store = Store { client: Fake };
    assert_eq!(store.client.put("k"), "fake:k");
    let _ = StoreStepOutput::Store(Stored {
        location: String::new(),
    });
}
