//! A checker process for the tally tests: checks items `FROM..TO` off the
//! tally `TALLY` (JSON) on the Redis at `REDIS_URL`, in an order shuffled
//! by `SEED`, each `CHECKS` times (duplicates), pausing `PACE_US` after
//! each, then prints `completed=<n>` (how many of its checks completed the
//! tally) and exits. The tests SIGKILL some of them mid-way.

use std::time::Duration;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use saga_runtime::backend::redis::RedisBackend;
use saga_runtime::engine::Checked;
use saga_runtime::process::TallyRef;
use saga_runtime::Engine;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url: String = env("REDIS_URL", "redis://127.0.0.1:6379/".to_owned());
    let tally: TallyRef = serde_json::from_str(&std::env::var("TALLY")?)?;
    let (from, to): (u32, u32) = (env("FROM", 0), env("TO", 0));
    let mut items: Vec<u32> = (from..to)
        .flat_map(|i| std::iter::repeat_n(i, env("CHECKS", 1)))
        .collect();
    items.shuffle(&mut rand::rngs::StdRng::seed_from_u64(env("SEED", 0)));
    let pace = Duration::from_micros(env("PACE_US", 0));
    let engine = Engine::builder()
        .backend(RedisBackend::connect(&url).await?)
        .workers(0)
        .build()
        .await?;
    let mut completed = 0;
    for item in items {
        if let Checked::Completed { .. } = engine.tally(&tally).check(item.to_string()).await? {
            completed += 1;
        }
        if !pace.is_zero() {
            tokio::time::sleep(pace).await;
        }
    }
    println!("completed={completed}");
    Ok(())
}
