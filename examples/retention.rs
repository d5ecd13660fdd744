//! Measures what finished tasks cost Redis, and that retention gives it
//! all back: runs TASKS 3-step tasks (default 10,000) on a private
//! loopback redis-server, twice, with a 20-second retention (long enough for the
//! last task to finish before the first expires), and prints the server's
//! key count and `used_memory` before, once every task finished, and once
//! the retention passed.
//!
//! ```text
//! cargo run --features redis --release --example retention [-- TASKS]
//! ```

#[path = "../testsuite/tests/common/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use sagas::NoOp;

fn dbsize(redis: &redis_server::TestRedis) -> u64 {
    redis::cmd("DBSIZE").query(&mut redis.conn()).unwrap()
}

#[tokio::main]
async fn main() {
    let tasks: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let redis = redis_server::TestRedis::start_with_aof(false);
    let retention = Duration::from_secs(20);
    let done = Arc::new(AtomicU64::new(0));
    let config = RedisConfig {
        block: Duration::from_millis(100),
        ..RedisConfig::default()
    };
    let engine = Engine::builder()
        .backend(
            RedisBackend::connect_with(&redis.url(), config)
                .await
                .unwrap(),
        )
        .saga(NoOp { done: done.clone() })
        .retention(Some(retention))
        .housekeeping_interval(Duration::from_millis(500))
        .workers(4)
        .build()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (keys0, mem0) = (dbsize(&redis), redis.used_memory());
    println!("before:            {keys0:>7} keys {mem0:>11} bytes");

    // Two rounds: what the first leaves behind (if anything) must not grow
    // with the second.
    for round in 1..=2 {
        let started = Instant::now();
        let before = done.load(Ordering::Relaxed);
        for n in 0..tasks {
            engine.start::<NoOp>(n).await.unwrap();
        }
        while done.load(Ordering::Relaxed) < before + tasks {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The last commits land just after the last step returns.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (keys1, mem1) = (dbsize(&redis), redis.used_memory());
        println!(
            "round {round}: {tasks} finished: {keys1:>7} keys {mem1:>11} bytes = {:.0} bytes per task ({:.1}s)",
            (mem1.saturating_sub(mem0)) as f64 / tasks as f64,
            started.elapsed().as_secs_f64()
        );
        let deadline = Instant::now() + retention * 3;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if dbsize(&redis) <= keys0 || Instant::now() > deadline {
                break;
            }
        }
        let (keys2, mem2) = (dbsize(&redis), redis.used_memory());
        println!(
            "round {round}: after retention: {keys2:>7} keys {mem2:>11} bytes ({:+} bytes against before)",
            mem2 as i64 - mem0 as i64
        );
    }
    if std::env::var("RETENTION_DEBUG").is_ok() {
        for key in redis.keys() {
            let bytes: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .query(&mut redis.conn())
                .unwrap();
            println!("  {key}: {bytes:?}");
        }
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query(&mut redis.conn())
            .unwrap();
        for line in info
            .lines()
            .filter(|l| l.starts_with("used_memory_") && !l.contains("human"))
        {
            println!("  {line}");
        }
    }
}
