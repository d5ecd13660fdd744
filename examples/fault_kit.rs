//! The fault kit on a saga of your own: twenty payments run under worker
//! crashes, duplicate, late and unacknowledged deliveries, cancellations
//! and failing compensations, all drawn from one seed, on the virtual
//! clock; then the report says how many times each body ran.
//!
//! ```text
//! cargo run --example fault_kit
//! SAGA_FAULT_SEED=3 cargo run --example fault_kit   # replay one seed
//! ```

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use saga_runtime::prelude::*;
use saga_runtime::testing::FaultKit;

/// A payment provider that, like real ones, honours an idempotency key.
#[derive(Default)]
struct Psp {
    charged: Mutex<HashSet<String>>,
}

struct Payment {
    psp: Arc<Psp>,
}

#[saga(name = "payment")]
#[cancellable]
impl Payment {
    #[saga_step(1)]
    #[retry_policy(max_retries = 3)]
    async fn charge(&self, cents: u64, ctx: &StepContext) -> Result<u64, StepError> {
        self.psp
            .charged
            .lock()
            .unwrap()
            .insert(ctx.idempotency_key());
        Ok(cents)
    }

    #[compensate(charge)]
    async fn refund(&self, _cents: u64) -> Result<(), StepError> {
        Ok(())
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 3)]
    async fn receipt(&self, cents: u64) -> Result<u64, StepError> {
        Ok(cents)
    }
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    let psp = Arc::new(Psp::default());
    let make = psp.clone();
    // README: from here
    let report = FaultKit::new(move || Payment { psp: make.clone() })
        .inputs((1..=20).map(|n| n * 100))
        .seed(7) // SAGA_FAULT_SEED=n overrides it
        .run() // panics, printing the seed, if an engine invariant broke
        .await;
    println!("{report}");
    assert!(
        report.max_runs("charge") > 1,
        "the kit made `charge` run again"
    );
    // ... and the provider charged each task at most once all the same.
    assert!(psp.charged.lock().unwrap().len() <= 20);
}
