//! A saga for fault-injection tests and benchmarks: three steps that record
//! every successful execution in Redis, so a test can check afterwards that
//! no step whose completion was recorded ran again and that no two
//! executions of one task overlapped.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use redis::aio::ConnectionManager;
use saga_runtime::prelude::*;

/// How the steps behave.
#[derive(Debug, Clone, Copy)]
pub struct ChaosConfig {
    /// Upper bound of the random work time of a step.
    pub max_work: Duration,
    /// Probability that a call fails transiently.
    pub failure_rate: f64,
    /// Whether to record executions (off for benchmarks).
    pub record: bool,
    /// A poison input: a step given it aborts the whole process, every
    /// time (as a crash in native code or running out of memory would).
    pub poison: Option<u64>,
}

/// The saga's dependencies.
pub struct Chaos {
    redis: ConnectionManager,
    worker: String,
    config: ChaosConfig,
}

/// One recorded successful execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    /// The step's name.
    pub step: String,
    /// `ctx.attempt()`.
    pub attempt: u32,
    /// Wall-clock microseconds.
    pub start_us: u128,
    /// Wall-clock microseconds.
    pub end_us: u128,
    /// Which worker process ran it.
    pub worker: String,
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// The Redis list of a task's executions.
pub fn executions_key(task: TaskId) -> String {
    format!("chaos:exec:{task}")
}

impl Chaos {
    /// Steps record into the Redis at `redis`.
    pub fn new(redis: ConnectionManager, worker: impl Into<String>, config: ChaosConfig) -> Self {
        Chaos {
            redis,
            worker: worker.into(),
            config,
        }
    }

    async fn work(&self, n: u64, ctx: &StepContext) -> Result<u64, StepError> {
        if self.config.poison == Some(n) {
            std::process::abort();
        }
        let start = now_us();
        let (work, fail) = {
            let mut rng = rand::thread_rng();
            let work = if self.config.max_work.is_zero() {
                Duration::ZERO
            } else {
                rng.gen_range(Duration::ZERO..self.config.max_work)
            };
            (work, rng.gen_bool(self.config.failure_rate))
        };
        if !work.is_zero() {
            tokio::time::sleep(work).await;
        }
        if fail {
            return Err(StepError::transient("injected transient failure"));
        }
        if self.config.record {
            let entry = format!(
                "{}|{}|{}|{}|{}",
                ctx.step(),
                ctx.attempt(),
                start,
                now_us(),
                self.worker
            );
            let _: i64 = redis::cmd("RPUSH")
                .arg(executions_key(ctx.task_id()))
                .arg(entry)
                .query_async(&mut self.redis.clone())
                .await?;
        }
        Ok(n + 1)
    }

    /// The recorded executions of a task.
    pub async fn executions(
        redis: &mut ConnectionManager,
        task: TaskId,
    ) -> redis::RedisResult<Vec<Execution>> {
        let entries: Vec<String> = redis::cmd("LRANGE")
            .arg(executions_key(task))
            .arg(0)
            .arg(-1)
            .query_async(redis)
            .await?;
        Ok(entries
            .iter()
            .filter_map(|e| {
                let mut parts = e.split('|');
                Some(Execution {
                    step: parts.next()?.to_owned(),
                    attempt: parts.next()?.parse().ok()?,
                    start_us: parts.next()?.parse().ok()?,
                    end_us: parts.next()?.parse().ok()?,
                    worker: parts.next()?.to_owned(),
                })
            })
            .collect())
    }
}

#[saga(name = "chaos")]
impl Chaos {
    #[saga_step(1)]
    #[retry_policy(max_retries = 8, backoff = constant, base_delay_ms = 5)]
    async fn one(&self, n: u64, ctx: &StepContext) -> Result<u64, StepError> {
        self.work(n, ctx).await
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 8, backoff = constant, base_delay_ms = 5)]
    async fn two(&self, n: u64, ctx: &StepContext) -> Result<u64, StepError> {
        self.work(n, ctx).await
    }

    #[saga_step(3)]
    #[retry_policy(max_retries = 8, backoff = constant, base_delay_ms = 5)]
    async fn three(&self, n: u64, ctx: &StepContext) -> Result<u64, StepError> {
        self.work(n, ctx).await
    }
}

/// The `chaos` saga with a retry budget of two per step: a task charged
/// for crashes it did not cause (tests/crash_isolation.rs) is soon
/// exhausted and compensated, where `chaos`'s eight retries would hide it.
pub struct Brittle(pub Chaos);

#[saga(name = "chaos-brittle")]
impl Brittle {
    #[saga_step(1)]
    #[retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 5)]
    async fn one(&self, n: u64, ctx: &StepContext) -> Result<u64, StepError> {
        self.0.work(n, ctx).await
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 5)]
    async fn two(&self, n: u64, ctx: &StepContext) -> Result<u64, StepError> {
        self.0.work(n, ctx).await
    }

    #[saga_step(3)]
    #[retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 5)]
    async fn three(&self, n: u64, ctx: &StepContext) -> Result<u64, StepError> {
        self.0.work(n, ctx).await
    }
}

/// Checks the invariants on one finished task: every step's recorded
/// completion is its last execution (nothing ran after it), attempt numbers
/// are unique, and no two executions of the task overlapped in time.
pub fn check_task(task: &TaskInstance, executions: &[Execution]) -> Result<(), String> {
    for step in &task.steps {
        let runs: Vec<&Execution> = executions.iter().filter(|e| e.step == step.name).collect();
        if step.status == StepStatus::Completed {
            let last = runs.iter().map(|e| e.attempt).max();
            if last != Some(step.attempt_count) {
                return Err(format!(
                    "task {} step {}: completion recorded at attempt {}, but executions were {:?}",
                    task.id, step.name, step.attempt_count, runs
                ));
            }
        }
        let mut attempts: Vec<u32> = runs.iter().map(|e| e.attempt).collect();
        attempts.sort_unstable();
        if attempts.windows(2).any(|w| w[0] == w[1]) {
            return Err(format!(
                "task {} step {}: one attempt ran twice: {runs:?}",
                task.id, step.name
            ));
        }
    }
    let mut sorted: Vec<&Execution> = executions.iter().collect();
    sorted.sort_by_key(|e| e.start_us);
    for pair in sorted.windows(2) {
        if pair[1].start_us < pair[0].end_us {
            return Err(format!(
                "task {}: executions overlap: {:?} and {:?}",
                task.id, pair[0], pair[1]
            ));
        }
    }
    Ok(())
}
