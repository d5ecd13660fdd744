//! A saga whose type and step types are private to their module, compiled
//! with every warning denied: the generated enum and trait must neither leak
//! nor warn, even though nothing uses them.
#![deny(warnings)]

mod payments {
    use saga_runtime::prelude::*;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    struct Charge {
        cents: u64,
    }

    #[derive(Serialize, Deserialize)]
    struct Charged {
        id: String,
    }

    #[derive(Serialize, Deserialize)]
    struct Refunded;

    struct Billing {
        provider: String,
    }

    #[saga]
    impl Billing {
        #[saga_step(1)]
        #[retry_policy(max_retries = 2, backoff = exponential, base_delay_ms = 100, jitter = false)]
        async fn charge(&self, charge: Charge, ctx: &StepContext) -> Result<Charged, StepError> {
            Ok(Charged {
                id: format!("{}-{}-{}", self.provider, charge.cents, ctx.attempt()),
            })
        }

        #[compensate(charge)]
        async fn refund(&self, charged: Charged) -> Result<(), StepError> {
            let _ = charged.id;
            Ok(())
        }

        #[saga_step(2)]
        async fn settle(&self, charged: Charged) -> Result<Refunded, StepError> {
            let _ = charged.id;
            Ok(Refunded)
        }
    }

    pub fn steps() -> usize {
        let billing = Billing {
            provider: "p".to_owned(),
        };
        let _ = &billing.provider;
        <Billing as Saga>::definition().steps.len()
    }
}

fn main() {
    assert_eq!(payments::steps(), 2);
}
