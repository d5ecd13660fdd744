//! [`Limits`](crate::backend::Limits) decide as the
//! [limit machine](crate::limit::machine) does, whichever store keeps them.

use super::*;
use crate::backend::limits::twins::{LimitOp, LimitOpKind, LimitTwins};
use crate::limit::{LimitConfig, Rate};

/// The store's limits against the machine: a seeded sequence of acquires,
/// releases, renewals, waiters leaving and usage reads on limits of every
/// kind (slots, a rate, both; keyed and not) gets the same decisions,
/// places in line, wake lists and usage from both. Holds are long and the
/// rate slow, so that the few milliseconds between the two clocks decide
/// nothing. `LIMIT_SEED` replays another sequence (the seed is printed).
pub async fn limits_decide_as_the_machine_does(b: Arc<dyn Backend>) {
    use rand::{Rng, SeedableRng};

    let store = b.clone().limits().expect(
        "this case needs `Backend::limits`: for a saga-only backend run `backend_conformance!(fresh, core)`",
    );
    let mut twins = LimitTwins::new(store);
    let slow = Rate {
        count: 1,
        per: Duration::from_secs(3600),
        burst: 3,
    };
    let configs = [
        (
            "slots",
            LimitConfig {
                concurrency: Some(2),
                rate: None,
            },
        ),
        (
            "paced",
            LimitConfig {
                concurrency: None,
                rate: Some(slow),
            },
        ),
        (
            "both",
            LimitConfig {
                concurrency: Some(2),
                rate: Some(Rate { burst: 4, ..slow }),
            },
        ),
    ];
    let seed = std::env::var("LIMIT_SEED").map_or(27, |s| s.parse().expect("LIMIT_SEED: a number"));
    println!("limits_decide_as_the_machine_does: LIMIT_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let kinds = [
        [LimitOpKind::Acquire; 6].as_slice(),
        &[LimitOpKind::Release; 2],
        &[LimitOpKind::Renew, LimitOpKind::Usage, LimitOpKind::Leave],
    ]
    .concat();
    for step in 0..500 {
        let (name, config) = configs[rng.gen_range(0..configs.len())];
        let op = LimitOp {
            name,
            config,
            key: [None, Some("k")][rng.gen_range(0..2)],
            task: rng.gen_range(0..6),
            attempt: rng.gen_range(0..2),
            kind: kinds[rng.gen_range(0..kinds.len())],
            wakes: rng.gen_bool(0.8),
        };
        let at = format!("seed {seed} step {step}: {name} {:?} t{}", op.key, op.task);
        twins
            .run(&op, Duration::from_secs(60), Duration::from_secs(1), &at)
            .await;
    }
    twins.covered(&["G", "C", "R", "woken", "freed", "left", "booked"], 5);
}
