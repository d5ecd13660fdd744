//! A checker process for the tally scenarios (tests/scenarios/tally.rs):
//! checks items `FROM..TO` off the tally `TALLY` (JSON) on the store at
//! `BACKEND_URL`, in an order shuffled by `SEED`, each `CHECKS` times
//! (duplicates), pausing `PACE_US` after each, then prints
//! `completed=<n>` (how many of its checks completed the tally) and exits.
//! With `NAME`, it counts its checks on `tally-checker:<NAME>:checks` on
//! the Redis at `RECORD_URL`, so that a scenario can SIGKILL it once it is
//! checking.
//!
//! Environment: `BACKEND_URL` (the store: `postgres://..` or a Redis
//! server's `redis://..`; default `REDIS_URL`), `RECORD_URL` (a Redis
//! server, whatever the store; default `REDIS_URL`, or `BACKEND_URL` when
//! that is a Redis; needed only with `NAME`).

use std::time::Duration;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use redis::AsyncCommands;
use saga_runtime::engine::Checked;
use saga_runtime::process::TallyRef;
use saga_runtime::Engine;
use sagas_tests::worker_env::{env, record_url, store_url};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = store_url()?;
    // Where it counts its checks, if it is named.
    let mut counter = match std::env::var("NAME").ok() {
        None => None,
        Some(name) => {
            let recorder = redis::Client::open(record_url(&url)?.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            Some((recorder, format!("tally-checker:{name}:checks")))
        }
    };
    let tally: TallyRef = serde_json::from_str(&std::env::var("TALLY")?)?;
    let (from, to): (u32, u32) = (env("FROM", 0), env("TO", 0));
    let mut items: Vec<u32> = (from..to)
        .flat_map(|i| std::iter::repeat_n(i, env("CHECKS", 1)))
        .collect();
    items.shuffle(&mut rand::rngs::StdRng::seed_from_u64(env("SEED", 0)));
    let pace = Duration::from_micros(env("PACE_US", 0));
    let engine = Engine::builder()
        .backend_arc(saga_runtime::backend::connect(&url).await?)
        .workers(0)
        .build()
        .await?;
    let mut completed = 0;
    for item in items {
        if let Checked::Completed { .. } = engine.tally(&tally).check(item.to_string()).await? {
            completed += 1;
        }
        if let Some((recorder, key)) = &mut counter {
            let _: u64 = recorder.incr(key.as_str(), 1).await?;
        }
        if !pace.is_zero() {
            tokio::time::sleep(pace).await;
        }
    }
    println!("completed={completed}");
    Ok(())
}
