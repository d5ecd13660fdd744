//! Counts the Redis round trips a step costs, so that a change that adds
//! one fails here rather than show up months later as a slower benchmark.
//!
//! Every command a client sends is one round trip; commands a script runs
//! inside Redis are not (MONITOR marks them `lua`). The engine's budget is
//! at most 2 per step in the steady state; today a 3-step chain costs about
//! 1.7 (one read that also takes the task's lease, one write per step, one
//! commit per task). The commands Redis runs per step, those scripts run
//! included, are counted too (`INFO commandstats`): 9.5 at most.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use sagas::NoOp;

async fn engine(redis: &TestRedis, done: &Arc<AtomicU64>, workers: usize) -> Engine {
    let config = RedisConfig {
        block: Duration::from_millis(200),
        ..RedisConfig::default()
    };
    Engine::builder()
        .backend(
            RedisBackend::connect_with(&redis.url(), config)
                .await
                .unwrap(),
        )
        .saga(NoOp { done: done.clone() })
        // The timer poller and the janitor run on their own clocks, not
        // per step: out of the way of the count, however slow the machine.
        .timeout_poll_interval(Duration::from_secs(600))
        .housekeeping_interval(Duration::from_secs(600))
        .workers(workers)
        .build()
        .await
        .unwrap()
}

/// Every command clients sent while `work` ran, by name.
async fn commands_during<F: std::future::Future<Output = ()>>(
    redis: &TestRedis,
    work: F,
) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::<String, u64>::new();
    for (cmd, _) in monitor_during(redis, work).await {
        *counts.entry(cmd).or_default() += 1;
    }
    counts
}

/// Every command clients sent while `work` ran: its name and the length of
/// its MONITOR line (about the bytes it sent).
async fn monitor_during<F: std::future::Future<Output = ()>>(
    redis: &TestRedis,
    work: F,
) -> Vec<(String, usize)> {
    let monitor = redis.monitor();
    work.await;
    monitor.stop()
}

/// `NoOp` tasks started by one engine, for another engine's one worker to
/// run: that engine connects (and loads its scripts) in `start`, so what a
/// test counts around [`Chains::run`] is the steady state of one worker.
struct Chains {
    client: Engine,
    workers: Engine,
    ids: Vec<TaskId>,
    done: Arc<AtomicU64>,
}

impl Chains {
    async fn start(redis: &TestRedis, tasks: u64) -> Chains {
        let done = Arc::new(AtomicU64::new(0));
        let client = engine(redis, &done, 0).await;
        let mut ids = Vec::new();
        for n in 0..tasks {
            ids.push(client.start::<NoOp>(n).await.unwrap());
        }
        let workers = engine(redis, &done, 0).await;
        Chains {
            client,
            workers,
            ids,
            done,
        }
    }

    /// Runs the worker until every task completed (read back with `wait`:
    /// the last commit lands after the last step returned).
    async fn run(&self) {
        let pool = self.workers.clone();
        tokio::spawn(async move { pool.run_workers(1).await });
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.done.load(Ordering::Relaxed) < self.ids.len() as u64 {
            assert!(Instant::now() < deadline, "the tasks did not finish");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for id in &self.ids {
            let task = self.client.wait(*id).await.unwrap();
            assert_eq!(task.status, TaskStatus::Completed);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_steps_costs_at_most_two_round_trips_per_step() {
    let redis = TestRedis::start_with_aof(false);
    let tasks = 200u64;
    let chains = Chains::start(&redis, tasks).await;
    let counts = commands_during(&redis, chains.run()).await;
    chains.workers.shutdown().await;
    // `Chains::run`'s `wait` reads each task once (record and audit log, pipelined);
    // those reads are the test's, not the worker's.
    let waits = ["HGETALL", "LRANGE"]
        .iter()
        .map(|c| counts.get(*c).copied().unwrap_or(0).min(tasks))
        .sum::<u64>();
    let total: u64 = counts.values().sum::<u64>() - waits;
    let steps = tasks * 3;
    let per_step = total as f64 / steps as f64;
    println!("commands while {tasks} tasks x 3 steps ran (1 worker): {counts:?}");
    println!("=> {per_step:.2} round trips per step");
    assert!(
        per_step <= 2.0,
        "{per_step:.2} round trips per step (budget 2): {counts:?}"
    );
}

/// Every command the server ran since `CONFIG RESETSTAT`, by name
/// (`INFO commandstats`: those scripts ran included).
fn commands_run(redis: &TestRedis) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.conn())
        .unwrap();
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(":calls=")?;
            let calls = rest.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// What Redis does per step, counted as the commands it runs (a script's
/// own commands included, the script call itself not): a script that
/// grows by a command per step shows here long before a benchmark could
/// tell it from noise. 28 per task of a 3-step chain with one worker that
/// reads one message at a time (9.33 per step, 9.4 with the housekeeping
/// that falls in the window): the read's 4 (`XREADGROUP`, the record in
/// one `HMGET`, the lock, the fence), the first attempt's 5 (the check,
/// the audit, the record, the status index twice), two writes of 3, and
/// the commit's 13 (the server's time, the check, the audit, the record,
/// the index twice, the expiry of 2 keys and its index entry, the
/// acknowledgement and deletion of the message, the lock, the waiters'
/// notice). It was 30 before the record's steps came with its first
/// `HMGET` and the commit stopped reading the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_steps_runs_at_most_nine_and_a_half_commands_per_step_inside_redis() {
    let redis = TestRedis::start_with_aof(false);
    let tasks = 200u64;
    let chains = Chains::start(&redis, tasks).await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut redis.conn())
        .unwrap();
    chains.run().await;
    chains.workers.shutdown().await;
    let run = commands_run(&redis);
    // The script calls, this test's reads (`wait`: the record and the
    // audit log, and its subscription) and the counting itself are not the
    // work of a step.
    let not_steps = [
        "evalsha",
        "eval",
        "script|load",
        "hgetall",
        "lrange",
        "subscribe",
        "unsubscribe",
        "config|resetstat",
        "info",
        "client|setname",
        "client|setinfo",
        "hello",
        "ping",
    ];
    let total: u64 = run
        .iter()
        .filter(|(name, _)| !not_steps.contains(&name.as_str()))
        .map(|(_, n)| n)
        .sum();
    let per_step = total as f64 / (tasks * 3) as f64;
    println!("commands Redis ran while {tasks} tasks x 3 steps ran (1 worker): {run:?}");
    println!("=> {per_step:.2} commands per step");
    assert!(
        per_step <= 9.5,
        "{per_step:.2} commands per step inside Redis (budget 9.5): {run:?}"
    );
}

/// `NoOp` with a concurrency limit on every step, never saturated.
struct ChainSlots {
    done: Arc<AtomicU64>,
}

#[saga(name = "chain-slots")]
impl ChainSlots {
    #[saga_step(1)]
    #[limit(concurrency = 1000)]
    async fn one(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(2)]
    #[limit(concurrency = 1000)]
    async fn two(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(3)]
    #[limit(concurrency = 1000)]
    async fn three(&self, n: u64) -> Result<u64, StepError> {
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(n)
    }
}

/// `NoOp` with a start rate on every step, never saturated.
struct ChainRate {
    done: Arc<AtomicU64>,
}

#[saga(name = "chain-rate")]
impl ChainRate {
    #[saga_step(1)]
    #[limit(rate = 100000, per = "1s", burst = 10000)]
    async fn one(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(2)]
    #[limit(rate = 100000, per = "1s", burst = 10000)]
    async fn two(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(3)]
    #[limit(rate = 100000, per = "1s", burst = 10000)]
    async fn three(&self, n: u64) -> Result<u64, StepError> {
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(n)
    }
}

/// What one worker sends per step while it runs `tasks` 3-step tasks of
/// `S` (made by `saga`) on a fresh server, as the test above counts it:
/// by command, then in all.
async fn per_step<S: Saga<Input = u64>>(
    saga: impl Fn(Arc<AtomicU64>) -> S,
    tasks: u64,
) -> (BTreeMap<String, f64>, f64) {
    let redis = TestRedis::start_with_aof(false);
    let done = Arc::new(AtomicU64::new(0));
    let build = |workers| {
        let saga = saga(done.clone());
        let redis = &redis;
        async move {
            let config = RedisConfig {
                block: Duration::from_millis(200),
                ..RedisConfig::default()
            };
            Engine::builder()
                .backend(
                    RedisBackend::connect_with(&redis.url(), config)
                        .await
                        .unwrap(),
                )
                .saga(saga)
                .timeout_poll_interval(Duration::from_secs(600))
                .housekeeping_interval(Duration::from_secs(600))
                .workers(workers)
                .build()
                .await
                .unwrap()
        }
    };
    let client = build(0).await;
    let mut ids = Vec::new();
    for n in 0..tasks {
        ids.push(client.start::<S>(n).await.unwrap());
    }
    let workers = build(0).await;
    let counts = commands_during(&redis, async {
        let pool = workers.clone();
        tokio::spawn(async move { pool.run_workers(1).await });
        let deadline = Instant::now() + Duration::from_secs(60);
        while done.load(Ordering::Relaxed) < tasks {
            assert!(Instant::now() < deadline, "the tasks did not finish");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for id in &ids {
            let task = client.wait(*id).await.unwrap();
            assert_eq!(task.status, TaskStatus::Completed);
            assert!(task.steps.iter().all(|s| s.attempt_count == 1));
        }
        // The last slot's release is sent after the last commit.
        tokio::time::sleep(Duration::from_millis(100)).await;
    })
    .await;
    workers.shutdown().await;
    let steps = (tasks * 3) as f64;
    let mut by_command: BTreeMap<String, f64> = BTreeMap::new();
    for (cmd, n) in &counts {
        // `wait` reads each task once (record and audit log): the test's.
        let n = match cmd.as_str() {
            "HGETALL" | "LRANGE" => n - n.min(&tasks),
            _ => *n,
        };
        by_command.insert(cmd.clone(), n as f64 / steps);
    }
    let total = by_command.values().sum();
    (by_command, total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_step_costs_one_round_trip_more_per_grant_and_one_per_slot_release() {
    let tasks = 200;
    let (plain, plain_total) = per_step(|done| NoOp { done }, tasks).await;
    let (slots, slots_total) = per_step(|done| ChainSlots { done }, tasks).await;
    let (rate, rate_total) = per_step(|done| ChainRate { done }, tasks).await;
    let evalsha = |c: &BTreeMap<String, f64>| c.get("EVALSHA").copied().unwrap_or(0.0);
    println!("round trips per step, 1 worker, {tasks} tasks x 3 steps:");
    println!("  unlimited          {plain_total:.2} {plain:.2?}");
    println!(
        "  concurrency = 1000 {slots_total:.2} (+{:.2}; EVALSHA +{:.2}) {slots:.2?}",
        slots_total - plain_total,
        evalsha(&slots) - evalsha(&plain)
    );
    println!(
        "  rate = 100000/s    {rate_total:.2} (+{:.2}; EVALSHA +{:.2}) {rate:.2?}",
        rate_total - plain_total,
        evalsha(&rate) - evalsha(&plain)
    );
    // The unlimited chain keeps its budget (the test above, again here on
    // a fresh server).
    assert!(plain_total <= 2.0, "{plain_total:.2} per unlimited step");
    // A slot costs its acquire and its release (a script call each); a
    // rate its acquire only. A little slack for the idle reads, whose
    // number depends on timing.
    let slack = 0.05;
    let slot_scripts = evalsha(&slots) - evalsha(&plain);
    let rate_scripts = evalsha(&rate) - evalsha(&plain);
    assert!(
        (slot_scripts - 2.0).abs() <= slack,
        "a slot's scripts per step: {slot_scripts:.2} (acquire + release)"
    );
    assert!(
        (rate_scripts - 1.0).abs() <= slack,
        "a rate's scripts per step: {rate_scripts:.2} (acquire)"
    );
    assert!(
        slots_total - plain_total <= 2.0 + slack,
        "a concurrency limit costs {:.2} round trips per step",
        slots_total - plain_total
    );
    assert!(
        rate_total - plain_total <= 1.0 + slack,
        "a rate costs {:.2} round trips per step",
        rate_total - plain_total
    );
}

/// Fails its first `failures` calls, then succeeds.
struct Flaky {
    failures: u32,
    calls: std::sync::atomic::AtomicU32,
}

#[saga(name = "flaky")]
impl Flaky {
    #[saga_step(1)]
    #[retry_policy(max_retries = 100, backoff = constant, base_delay_ms = 0)]
    async fn one(&self, n: u64) -> Result<u64, StepError> {
        if self.calls.fetch_add(1, Ordering::Relaxed) < self.failures {
            return Err(StepError::transient("not yet"));
        }
        Ok(n)
    }
    #[saga_step(2)]
    async fn two(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(3)]
    async fn three(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
}

/// The largest write (script call) of one `Flaky` task run to its end.
async fn largest_write(failures: u32) -> (usize, usize) {
    let redis = TestRedis::start_with_aof(false);
    let engine = Engine::builder()
        .backend(RedisBackend::connect(&redis.url()).await.unwrap())
        .saga(Flaky {
            failures,
            calls: Default::default(),
        })
        .workers(1)
        .build()
        .await
        .unwrap();
    let mut audit = 0;
    let seen = monitor_during(&redis, async {
        let id = engine.start::<Flaky>(7).await.unwrap();
        let task = engine.wait(id).await.unwrap();
        assert_eq!(task.status, TaskStatus::Completed);
        assert_eq!(task.steps[0].attempt_count, failures + 1);
        audit = task.audit_log.len();
    })
    .await;
    engine.shutdown().await;
    let largest = seen
        .iter()
        .filter(|(cmd, _)| cmd == "EVALSHA")
        .map(|(_, len)| *len)
        .max()
        .unwrap();
    (largest, audit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_step_writes_does_not_grow_with_the_tasks_history() {
    let (fresh, fresh_audit) = largest_write(0).await;
    let (retried, retried_audit) = largest_write(60).await;
    println!(
        "largest write: {fresh} bytes with {fresh_audit} audit entries; \
         {retried} bytes with {retried_audit}"
    );
    assert!(retried_audit >= fresh_audit + 60, "{retried_audit}");
    // Sixty more audit entries are several kilobytes: none of them is sent
    // again by a later write.
    assert!(
        retried < fresh + 1024,
        "the largest write grew from {fresh} to {retried} bytes with the task's history"
    );
}

#[derive(Message, serde::Serialize, serde::Deserialize)]
struct Opened {
    #[correlation_id]
    account: String,
    code: String,
}

#[derive(Message, serde::Serialize, serde::Deserialize)]
struct Deposited {
    code: String,
    cents: u64,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Balance {
    code: String,
    cents: u64,
}

struct Accounts {
    handled: Arc<AtomicU64>,
}

#[process_manager(name = "accounts", state = Balance)]
impl Accounts {
    #[starts]
    async fn opened(
        &self,
        msg: Opened,
        state: &mut Balance,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.code = msg.code;
        self.handled.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    #[handles]
    #[correlate(state.code = msg.code)]
    async fn deposited(
        &self,
        msg: Deposited,
        state: &mut Balance,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.cents += msg.cents;
        self.handled.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

async fn accounts(redis: &TestRedis, handled: &Arc<AtomicU64>) -> Engine {
    Engine::builder()
        .backend(RedisBackend::connect(&redis.url()).await.unwrap())
        .process_manager(Accounts {
            handled: handled.clone(),
        })
        // The timer poller and the janitor run on their own clocks, not
        // per message: out of the way of the count.
        .timeout_poll_interval(Duration::from_secs(600))
        .housekeeping_interval(Duration::from_secs(600))
        .workers(0)
        .build()
        .await
        .unwrap()
}

/// Runs one worker over what is queued until `expected` messages were
/// handled; returns the commands it sent per message (of `MESSAGES`).
async fn process_round_trips(redis: &TestRedis, handled: &Arc<AtomicU64>, expected: u64) -> f64 {
    let workers = accounts(redis, handled).await;
    let counts = commands_during(redis, async {
        let pool = workers.clone();
        tokio::spawn(async move { pool.run_workers(1).await });
        let deadline = Instant::now() + Duration::from_secs(60);
        while handled.load(Ordering::Relaxed) < expected {
            assert!(Instant::now() < deadline, "the messages were not handled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The last commit lands after the last handler returned.
        tokio::time::sleep(Duration::from_millis(100)).await;
    })
    .await;
    workers.shutdown().await;
    // Not per message: loading each script once (a refused
    // EVALSHA and a SCRIPT LOAD), the blocking read once idle, the first
    // round of the timer poller and the janitor (a lease and a look each)
    // when the worker starts, and on a slow machine a look for messages of
    // dead consumers (every half visibility timeout, one per stream).
    let count = |c: &str| counts.get(c).copied().unwrap_or(0);
    let once = 2 * count("SCRIPT") + count("XREADGROUP").min(1) + 8;
    let total: u64 = counts.values().sum::<u64>().saturating_sub(once);
    let per_message = total as f64 / MESSAGES as f64;
    println!("commands while {MESSAGES} messages were handled (1 worker): {counts:?}");
    println!("=> {per_message:.2} round trips per message");
    per_message
}

const MESSAGES: u64 = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_manager_message_costs_at_most_two_round_trips() {
    let redis = TestRedis::start_with_aof(false);
    let handled = Arc::new(AtomicU64::new(0));
    let client = accounts(&redis, &handled).await;
    // Correlated by id: each starts an instance.
    for n in 0..MESSAGES {
        let opened = Opened {
            account: format!("a-{n}"),
            code: format!("c-{n}"),
        };
        client.publish(opened).await.unwrap();
    }
    let by_id = process_round_trips(&redis, &handled, MESSAGES).await;
    // Correlated by a state property.
    for n in 0..MESSAGES {
        let deposit = Deposited {
            code: format!("c-{n}"),
            cents: 5,
        };
        client.publish(deposit).await.unwrap();
    }
    let by_field = process_round_trips(&redis, &handled, 2 * MESSAGES).await;
    let state = client
        .process_state::<Accounts>("a-7")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((state.code.as_str(), state.cents), ("c-7", 5));
    assert!(by_id <= 2.0, "{by_id:.2} round trips per message by id");
    assert!(
        by_field <= 2.0,
        "{by_field:.2} round trips per message by property"
    );
}
