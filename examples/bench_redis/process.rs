//! The process-manager part of the benchmark (default run and
//! `--process-only`): one instance receiving many messages at once, in both
//! concurrency modes, with one engine and with two.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::Partitions;
use saga_runtime::prelude::*;

use super::durability;

#[derive(Message, serde::Serialize, serde::Deserialize)]
struct Tick {
    #[correlation_id]
    id: String,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Ticks {
    n: u64,
}

struct Hot {
    done: Arc<AtomicU64>,
}

#[process_manager(name = "hot", state = Ticks)]
impl Hot {
    #[starts]
    async fn tick(
        &self,
        _t: Tick,
        s: &mut Ticks,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.n += 1;
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The same instance counter, with `concurrency = pessimistic`.
struct HotLocked {
    done: Arc<AtomicU64>,
}

#[derive(serde::Serialize, serde::Deserialize, saga_runtime::Message)]
struct LockedTick {
    #[correlation_id]
    id: String,
}

#[process_manager(name = "hot-locked", state = Ticks, concurrency = pessimistic)]
impl HotLocked {
    #[starts]
    async fn tick(
        &self,
        _t: LockedTick,
        s: &mut Ticks,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.n += 1;
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Enqueues `messages` for one instance, then runs `workers` workers in
/// each of `engines` engines (as separate processes would: each its own
/// runtime, instance locks and partitions) until the instance has counted
/// them all. Returns messages per second.
async fn run_process(
    url: &str,
    messages: u64,
    (engines, workers): (usize, usize),
    id: &str,
    locked: bool,
) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let build = |workers| {
        let done = done.clone();
        async move {
            let config = RedisConfig {
                block: Duration::from_millis(100),
                durability: durability(),
                ..RedisConfig::default()
            };
            Engine::builder()
                .backend(RedisBackend::connect_with(url, config).await.unwrap())
                .process_manager(Hot { done: done.clone() })
                .process_manager(HotLocked { done })
                .workers(workers)
                .build()
                .await
                .unwrap()
        }
    };
    let client = build(0).await;
    // Queued as while workers run (on the instance's partition, not the
    // stream a deployment without partition readers writes to), by a
    // stand-in reader that lets go before the workers start.
    let stand_in = RedisBackend::connect(url).await.unwrap();
    stand_in
        .process_partitions("bench-publisher", Duration::from_secs(60), 0)
        .await
        .unwrap();
    for _ in 0..messages {
        match locked {
            true => client.publish(LockedTick { id: id.to_owned() }).await,
            false => client.publish(Tick { id: id.to_owned() }).await,
        }
        .unwrap();
    }
    stand_in
        .leave_process_partitions("bench-publisher", 0, Duration::from_secs(1))
        .await
        .unwrap();
    let started = Instant::now();
    let mut pools = Vec::new();
    for _ in 0..engines {
        pools.push(build(workers).await);
    }
    loop {
        let n = match locked {
            true => client.process_state::<HotLocked>(id).await,
            false => client.process_state::<Hot>(id).await,
        }
        .unwrap()
        .map_or(0, |s| s.n);
        if n >= messages {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    for pool in pools {
        pool.shutdown().await;
    }
    messages as f64 / elapsed.as_secs_f64()
}

/// One instance receiving `messages` at once, with 1 and 4 workers, in
/// both concurrency modes; and the ratios the issue tracks.
pub(crate) async fn hot_instance(url: &str, messages: u64) {
    let mut rates = Vec::new();
    for locked in [false, true] {
        for (engines, workers) in [(1usize, 1usize), (1, 4), (2, 2)] {
            let mode = if locked { "pessimistic" } else { "optimistic" };
            let id = format!("hot-{mode}-{engines}x{workers}");
            let rate = run_process(url, messages, (engines, workers), &id, locked).await;
            println!(
                "process manager, one instance, {mode}, {engines} engine(s) x {workers} worker(s): {rate:.0} messages/s ({messages} messages)"
            );
            rates.push(rate);
        }
    }
    println!(
        "hot instance / 1 worker: optimistic 4 workers {:.2}, 2 engines x 2 {:.2}; pessimistic 4 workers {:.2}, 2 engines x 2 {:.2}",
        rates[1] / rates[0],
        rates[2] / rates[0],
        rates[4] / rates[3],
        rates[5] / rates[3],
    );
    // The two modes side by side, with the same workers.
    let ratio = |i: usize| rates[i].min(rates[i + 3]) / rates[i].max(rates[i + 3]);
    println!(
        "hot instance, slower concurrency mode / faster: 1 worker {:.2}, 4 workers {:.2}, 2 engines x 2 {:.2}",
        ratio(0),
        ratio(1),
        ratio(2),
    );
}
