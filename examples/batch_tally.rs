//! Batch fan-in, two ways: a process manager hands out a batch of items and
//! must learn when all are done (the scenario of the NServiceBus article on
//! saga contention).
//!
//! ```text
//! cargo run --features redis --release --example batch_tally
//! cargo run --features redis --release --example batch_tally -- --redis redis://127.0.0.1:6379 --items 100000
//! ```
//!
//! (`--tally-only` skips the naive run, which takes a while on Redis.)
//!
//! - **naive**: every finished item is an `ItemDone` message to the batch's
//!   instance, which counts them in its state. Every message loads, changes
//!   and saves the same instance: they queue behind each other.
//! - **tally**: the batch opens a tally of its items; whoever finishes an
//!   item checks it off (one atomic step that never touches the instance),
//!   and the instance gets one `TallyCompleted` when the last one is
//!   checked.
//!
//! Both run the same item workers (`--checkers`, default 16) and engine
//! workers (`--workers`, default 4) on the same backend; on Redis the
//! program also times as many `INCR`s from as many concurrent clients, the
//! floor for anything that writes Redis once per item.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use saga_runtime::backend::redis::RedisBackend;
use saga_runtime::prelude::*;
use saga_runtime::Error;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// Starts a batch of `items` items, counted by the naive process manager.
#[derive(Message, Serialize, Deserialize)]
struct NaiveStarted {
    #[correlation_id]
    batch: String,
    items: u32,
}

/// One item of a naive batch is done.
#[derive(Message, Serialize, Deserialize)]
struct ItemDone {
    #[correlation_id]
    batch: String,
}

#[derive(Default, Serialize, Deserialize)]
struct Counted {
    total: u32,
    done: u32,
}

/// The naive batch: it counts `ItemDone` messages in its state. (Exact
/// duplicates of a message are dropped by the instance, by message id.)
struct NaiveBatch {
    finished: Arc<Notify>,
}

#[process_manager(name = "naive-batch", state = Counted)]
impl NaiveBatch {
    #[starts]
    async fn started(
        &self,
        msg: NaiveStarted,
        state: &mut Counted,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.total = msg.items;
        Ok(())
    }

    #[handles]
    async fn item_done(
        &self,
        _msg: ItemDone,
        state: &mut Counted,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.done += 1;
        if state.done == state.total {
            ctx.mark_complete();
            self.finished.notify_one();
        }
        Ok(())
    }
}

/// Starts a batch whose items are checked off a tally.
#[derive(Message, Serialize, Deserialize)]
struct TallyStarted {
    #[correlation_id]
    batch: String,
    items: u32,
}

#[derive(Default, Serialize, Deserialize)]
struct Sheet {
    /// Handed to the item workers (in a real system: in each work item).
    tally: Option<TallyRef>,
}

/// The tally batch: it opens the sheet and is told once, at the end.
struct TallyBatch {
    finished: Arc<Notify>,
}

#[process_manager(name = "tally-batch", state = Sheet)]
impl TallyBatch {
    #[starts]
    async fn started(
        &self,
        msg: TallyStarted,
        state: &mut Sheet,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let items = (0..msg.items).map(|i| i.to_string());
        let tally = ctx
            .open_tally("items", items)
            .deadline(Duration::from_secs(3600));
        state.tally = Some(tally.reference());
        Ok(())
    }

    #[handles]
    async fn all_done(
        &self,
        _msg: TallyCompleted,
        _state: &mut Sheet,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.mark_complete();
        self.finished.notify_one();
        Ok(())
    }

    #[handles]
    async fn overdue(
        &self,
        msg: TallyStatus,
        _state: &mut Sheet,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        eprintln!(
            "batch overdue: {} of {} items missing, e.g. {:?}",
            msg.remaining(),
            msg.total,
            msg.missing.first()
        );
        Ok(())
    }
}

struct Args {
    redis: Option<String>,
    items: u32,
    checkers: u32,
    workers: usize,
    /// `--tally-only`: skip the naive run (it takes a while on Redis).
    tally_only: bool,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        redis: None,
        items: 100_000,
        checkers: 16,
        workers: 4,
        tally_only: false,
    };
    let mut it = std::env::args().skip(1);
    let number = |flag: &str, v: Option<String>| -> Result<u32, String> {
        v.and_then(|v| v.parse().ok())
            .ok_or(format!("{flag} needs a positive number"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--redis" => args.redis = Some(it.next().ok_or("--redis needs a URL")?),
            "--items" => args.items = number("--items", it.next())?,
            "--checkers" => args.checkers = number("--checkers", it.next())?.max(1),
            "--workers" => args.workers = number("--workers", it.next())?.max(1) as usize,
            "--tally-only" => args.tally_only = true,
            other => {
                return Err(format!(
                    "unknown argument `{other}`; expected --redis URL, --items N, --checkers N, --workers N, --tally-only"
                ))
            }
        }
    }
    Ok(args)
}

/// Runs `checkers` concurrent item workers over `0..items`, each calling
/// `finish(item)` for the items it takes.
async fn item_workers<F, Fut>(items: u32, checkers: u32, finish: F) -> Result<(), Error>
where
    F: Fn(u32) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), Error>> + Send,
{
    let next = Arc::new(AtomicU32::new(0));
    let workers = (0..checkers).map(|_| {
        let (next, finish) = (next.clone(), finish.clone());
        tokio::spawn(async move {
            loop {
                let item = next.fetch_add(1, Ordering::Relaxed);
                if item >= items {
                    return Ok::<(), Error>(());
                }
                finish(item).await?;
            }
        })
    });
    for worker in futures::future::join_all(workers).await {
        worker.expect("item worker panicked")?;
    }
    Ok(())
}

async fn engine(args: &Args, naive: Arc<Notify>, tally: Arc<Notify>) -> Result<Engine, Error> {
    let builder = Engine::builder()
        .process_manager(NaiveBatch { finished: naive })
        .process_manager(TallyBatch { finished: tally })
        .workers(args.workers);
    match &args.redis {
        Some(url) => {
            builder
                .backend(RedisBackend::connect(url).await?)
                .build()
                .await
        }
        None => builder.build().await,
    }
}

async fn naive(engine: &Engine, args: &Args, finished: &Notify) -> Result<Duration, Error> {
    let batch = uuid::Uuid::new_v4().to_string();
    let started = Instant::now();
    engine
        .publish(NaiveStarted {
            batch: batch.clone(),
            items: args.items,
        })
        .await?;
    let (engine2, batch2) = (engine.clone(), batch.clone());
    item_workers(args.items, args.checkers, move |_| {
        let (engine, batch) = (engine2.clone(), batch2.clone());
        async move { engine.publish(ItemDone { batch }).await.map(|_| ()) }
    })
    .await?;
    finished.notified().await;
    Ok(started.elapsed())
}

async fn tallied(engine: &Engine, args: &Args, finished: &Notify) -> Result<Duration, Error> {
    let batch = uuid::Uuid::new_v4().to_string();
    let started = Instant::now();
    engine
        .publish(TallyStarted {
            batch: batch.clone(),
            items: args.items,
        })
        .await?;
    let tally = loop {
        if let Some(Sheet { tally: Some(t) }) = engine.process_state::<TallyBatch>(&batch).await? {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let opened = started.elapsed();
    let tally = Arc::new(engine.tally(&tally));
    item_workers(args.items, args.checkers, move |item| {
        let tally = tally.clone();
        async move {
            tally.check(item.to_string()).await?;
            Ok(())
        }
    })
    .await?;
    finished.notified().await;
    println!(
        "  (of which opening the tally of {} items: {:.3} s)",
        args.items,
        opened.as_secs_f64()
    );
    Ok(started.elapsed())
}

/// `items` INCRs from `checkers` concurrent clients on one multiplexed
/// connection, as the engine's own connection is.
async fn incr_floor(url: &str, args: &Args) -> Result<Duration, Box<dyn std::error::Error>> {
    let conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let key = format!("batch_tally:incr:{}", uuid::Uuid::new_v4());
    let started = Instant::now();
    let (key2, conn2) = (key.clone(), conn.clone());
    item_workers(args.items, args.checkers, move |_| {
        let (key, mut conn) = (key2.clone(), conn2.clone());
        async move {
            let _: i64 = redis::cmd("INCR")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .map_err(|e| Error::Config(e.to_string()))?;
            Ok(())
        }
    })
    .await?;
    let elapsed = started.elapsed();
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn.clone())
        .await?;
    Ok(elapsed)
}

fn line(what: &str, took: Duration, items: u32) {
    println!(
        "{what:<46} {:>8.3} s  {:>9.0} items/s",
        took.as_secs_f64(),
        f64::from(items) / took.as_secs_f64()
    );
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let (naive_done, tally_done) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let engine = engine(&args, naive_done.clone(), tally_done.clone()).await?;
    println!(
        "batch_tally: {} items, {} item workers, {} engine workers, on {}",
        args.items,
        args.checkers,
        args.workers,
        args.redis.as_deref().unwrap_or("the in-memory backend")
    );
    let tally = tallied(&engine, &args, &tally_done).await?;
    line("tally (items checked off a tally sheet)", tally, args.items);
    if !args.tally_only {
        let naive = naive(&engine, &args, &naive_done).await?;
        line(
            "naive (one instance counts ItemDone messages)",
            naive,
            args.items,
        );
        println!(
            "naive / tally: {:.1}x",
            naive.as_secs_f64() / tally.as_secs_f64()
        );
    }
    if let Some(url) = &args.redis {
        let incr = incr_floor(url, &args).await?;
        line(
            &format!("{} INCR from {} clients", args.items, args.checkers),
            incr,
            args.items,
        );
        println!(
            "tally / INCR: {:.2}x",
            tally.as_secs_f64() / incr.as_secs_f64()
        );
    }
    engine.shutdown().await;
    Ok(())
}
