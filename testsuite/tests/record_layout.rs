//! What a step writes to Redis does not grow with the task's history
//! (record layout 2: the head and the steps that changed, not the whole
//! record), and how a deployment moves from layout 1 to layout 2: new
//! engines write layout 1, which engines of earlier versions read, until
//! the operator switches; records in either layout are read and run on;
//! a task keeps the layout it was created in.

mod common;

use std::time::Duration;

use common::redis_server::TestRedis;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::prelude::*;
use saga_runtime::{TaskInstance, TaskStatus};

/// Step `n`'s output: 10 kB.
fn output(n: usize) -> String {
    format!("{n:02}{}", "x".repeat(10_238))
}

/// Forty steps, each returning 10 kB.
struct Long;

#[saga(name = "long")]
impl Long {
    #[saga_step(1)]
    async fn s1(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(1))
    }
    #[saga_step(2)]
    async fn s2(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(2))
    }
    #[saga_step(3)]
    async fn s3(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(3))
    }
    #[saga_step(4)]
    async fn s4(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(4))
    }
    #[saga_step(5)]
    async fn s5(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(5))
    }
    #[saga_step(6)]
    async fn s6(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(6))
    }
    #[saga_step(7)]
    async fn s7(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(7))
    }
    #[saga_step(8)]
    async fn s8(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(8))
    }
    #[saga_step(9)]
    async fn s9(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(9))
    }
    #[saga_step(10)]
    async fn s10(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(10))
    }
    #[saga_step(11)]
    async fn s11(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(11))
    }
    #[saga_step(12)]
    async fn s12(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(12))
    }
    #[saga_step(13)]
    async fn s13(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(13))
    }
    #[saga_step(14)]
    async fn s14(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(14))
    }
    #[saga_step(15)]
    async fn s15(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(15))
    }
    #[saga_step(16)]
    async fn s16(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(16))
    }
    #[saga_step(17)]
    async fn s17(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(17))
    }
    #[saga_step(18)]
    async fn s18(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(18))
    }
    #[saga_step(19)]
    async fn s19(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(19))
    }
    #[saga_step(20)]
    async fn s20(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(20))
    }
    #[saga_step(21)]
    async fn s21(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(21))
    }
    #[saga_step(22)]
    async fn s22(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(22))
    }
    #[saga_step(23)]
    async fn s23(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(23))
    }
    #[saga_step(24)]
    async fn s24(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(24))
    }
    #[saga_step(25)]
    async fn s25(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(25))
    }
    #[saga_step(26)]
    async fn s26(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(26))
    }
    #[saga_step(27)]
    async fn s27(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(27))
    }
    #[saga_step(28)]
    async fn s28(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(28))
    }
    #[saga_step(29)]
    async fn s29(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(29))
    }
    #[saga_step(30)]
    async fn s30(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(30))
    }
    #[saga_step(31)]
    async fn s31(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(31))
    }
    #[saga_step(32)]
    async fn s32(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(32))
    }
    #[saga_step(33)]
    async fn s33(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(33))
    }
    #[saga_step(34)]
    async fn s34(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(34))
    }
    #[saga_step(35)]
    async fn s35(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(35))
    }
    #[saga_step(36)]
    async fn s36(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(36))
    }
    #[saga_step(37)]
    async fn s37(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(37))
    }
    #[saga_step(38)]
    async fn s38(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(38))
    }
    #[saga_step(39)]
    async fn s39(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(39))
    }
    #[saga_step(40)]
    async fn s40(&self, _previous: String) -> Result<String, StepError> {
        Ok(output(40))
    }
}

async fn engine(redis: &TestRedis, workers: usize) -> Engine {
    let config = RedisConfig {
        block: Duration::from_millis(50),
        ..RedisConfig::default()
    };
    Engine::builder()
        .backend(
            RedisBackend::connect_with(&redis.url(), config)
                .await
                .unwrap(),
        )
        .saga(Long)
        .workers(workers)
        .build()
        .await
        .unwrap()
}

fn assert_whole(task: &TaskInstance) {
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(
        task.output.as_ref().and_then(|o| o.as_str()),
        Some(output(40).as_str())
    );
    assert_eq!(task.steps.len(), 40);
    for (i, step) in task.steps.iter().enumerate() {
        assert_eq!(
            step.output.as_ref().and_then(|o| o.as_str()),
            Some(output(i + 1).as_str()),
            "step {}",
            i + 1
        );
    }
}

/// Step 40 of a 40-step saga with 10 kB outputs sends no more than step 2
/// (each write carries the output of the step that just completed, once),
/// where layout 1 sent every earlier output again: 390 kB at step 40.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_40_writes_no_more_than_step_2() {
    let redis = TestRedis::start_with_aof(false);
    let engine = engine(&redis, 1).await;
    assert!(
        engine_writes_apart(&redis).await,
        "a fresh deployment writes layout 2"
    );
    let monitor = redis.monitor();
    let id = engine.start::<Long>("go".to_owned()).await.unwrap();
    let task = engine.wait(id).await.unwrap();
    let seen = monitor.stop();
    engine.shutdown().await;
    assert_whole(&task);
    // The writes in order: the step's attempt (step 1), then each next
    // attempt with the outcome before it (steps 2..40), then the commit.
    let writes: Vec<usize> = seen
        .iter()
        .filter(|(cmd, len)| cmd == "EVALSHA" && *len > 1_000)
        .map(|(_, len)| *len)
        .collect();
    assert!(writes.len() >= 40, "{writes:?}");
    let (step_2, step_40) = (writes[0], writes[38]);
    let largest = writes[..39].iter().max().copied().unwrap();
    let commit = writes[39];
    println!(
        "bytes sent (MONITOR line): step 2 {step_2}, step 40 {step_40}, \
         largest step write {largest}, commit {commit}"
    );
    assert!(
        step_40 <= step_2 + 1_024,
        "step 40 sent {step_40}, step 2 {step_2}"
    );
    assert!(
        largest <= step_2 + 1_024,
        "a write sent {largest}, step 2 {step_2}"
    );
    // The commit carries the last step's output twice: as the step's and
    // as the task's.
    assert!(commit <= 2 * step_2 + 1_024, "the commit sent {commit}");
}

async fn engine_writes_apart(redis: &TestRedis) -> bool {
    let backend = RedisBackend::connect(&redis.url()).await.unwrap();
    backend.writes_steps_apart().await.unwrap()
}

/// The fields of task `id`'s hash.
fn fields(redis: &TestRedis, id: TaskId) -> std::collections::HashMap<String, String> {
    let mut conn = redis.conn();
    redis::cmd("HGETALL")
        .arg(format!("saga:{{saga:0}}:task:{id}"))
        .query(&mut conn)
        .unwrap()
}

/// A deployment that ran before layout 2 (its key layout recorded, no
/// record layout): new engines write layout 1, as engines of earlier
/// versions read it (the whole record in `doc`, no step fields), until
/// the operator switches; tasks in flight finish in layout 1, tasks
/// started after it are created in layout 2, and every task completes
/// whole, with engines that saw the switch and engines that did not yet
/// side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_deployment_moves_to_layout_2_when_its_operator_says() {
    let redis = TestRedis::start_with_aof(false);
    // What an earlier version leaves: the key layout, nothing else.
    let _: () = redis::cmd("SET")
        .arg("saga:layout")
        .arg("1")
        .query(&mut redis.conn())
        .unwrap();
    let first = engine(&redis, 2).await;
    assert!(!engine_writes_apart(&redis).await);
    let before = first.start::<Long>("a".to_owned()).await.unwrap();
    let task = first.wait(before).await.unwrap();
    assert_whole(&task);
    let stored = fields(&redis, before);
    assert!(!stored.contains_key("n"), "layout 1: {:?}", stored.keys());
    // What an engine of an earlier version reads: `doc`, the whole record.
    let old_reader: TaskInstance = serde_json::from_str(&stored["doc"]).unwrap();
    assert_eq!(old_reader.steps.len(), 40);
    assert_eq!(old_reader.steps[39].output, task.steps[39].output);

    // Tasks in flight across the switch, on two engines: one switched by
    // the call, one that learns of it later.
    let second = engine(&redis, 2).await;
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(first.start::<Long>(format!("t{n}")).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let operator = RedisBackend::connect(&redis.url()).await.unwrap();
    operator.write_steps_apart().await.unwrap();
    assert!(engine_writes_apart(&redis).await);
    for id in &ids {
        assert_whole(&second.wait(*id).await.unwrap());
        assert!(!fields(&redis, *id).contains_key("n"), "stays in layout 1");
    }
    // A task started after the switch, once every engine has looked again.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let after = second.start::<Long>("b".to_owned()).await.unwrap();
    assert_whole(&first.wait(after).await.unwrap());
    let stored = fields(&redis, after);
    assert_eq!(stored.get("n").map(String::as_str), Some("40"));
    assert!(stored.contains_key("h") && !stored["doc"].contains("steps"));
    // An engine of an earlier version refuses such a record rather than
    // running a task it would see without steps.
    assert!(serde_json::from_str::<OldRecord>(&stored["doc"]).is_err());
    first.shutdown().await;
    second.shutdown().await;
}

/// How an engine before layout 2 read `steps`: a list, nothing else.
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct OldRecord {
    steps: Vec<serde_json::Value>,
}
