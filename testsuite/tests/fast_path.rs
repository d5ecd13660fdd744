//! Regressions found by an adversarial review of the fast path (a worker
//! going on with its task, reads that take leases and load instances,
//! several messages at once, the audit list, finish notifications), each
//! against a private redis-server.

mod common;

mod audit_migration {
    //! A record written before the audit log had its own list carries its
    //! entries inline, and nothing capped them then: the first write after the
    //! upgrade moves them all. Lua cannot unpack more than about 8000 values at
    //! once; a script that failed half-way left the record written and the log
    //! lost.

    use std::time::Duration;

    use crate::common::redis_server::TestRedis;
    use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
    use saga_runtime::prelude::*;

    struct One;

    #[saga(name = "one")]
    impl One {
        #[saga_step(1)]
        async fn go(&self, n: u64) -> Result<u64, StepError> {
            Ok(n)
        }
    }

    fn config() -> RedisConfig {
        RedisConfig {
            block: Duration::from_millis(100),
            ..RedisConfig::default()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_old_record_with_a_long_inline_audit_log_still_runs() {
        let redis = TestRedis::start();
        let client = Engine::builder()
            .backend(
                RedisBackend::connect_with(&redis.url(), config())
                    .await
                    .unwrap(),
            )
            .saga(One)
            .workers(0)
            .build()
            .await
            .unwrap();
        let id = client.start::<One>(7).await.unwrap();
        let mut conn = redis.conn();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
        let task_key = keys
            .iter()
            .find(|k| k.ends_with(&format!(":task:{id}")))
            .unwrap()
            .clone();
        let audit_key = task_key.replace(":task:", ":audit:");
        let entry = serde_json::to_value(saga_runtime::AuditEntry::new(
            saga_runtime::AuditAction::StepCompleted,
        ))
        .unwrap();
        let doc: String = redis::cmd("HGET")
            .arg(&task_key)
            .arg("doc")
            .query(&mut conn)
            .unwrap();
        let mut doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
        // The old format: the log inline, no list.
        doc["audit_log"] = serde_json::Value::Array(vec![entry; 9000]);
        let _: () = redis::cmd("HSET")
            .arg(&task_key)
            .arg("doc")
            .arg(doc.to_string())
            .query(&mut conn)
            .unwrap();
        let _: () = redis::cmd("DEL").arg(&audit_key).query(&mut conn).unwrap();

        let _worker = Engine::builder()
            .backend(
                RedisBackend::connect_with(&redis.url(), config())
                    .await
                    .unwrap(),
            )
            .saga(One)
            .workers(1)
            .build()
            .await
            .unwrap();
        let task = tokio::time::timeout(Duration::from_secs(15), client.wait(id)).await;
        let now = client.task(id).await.unwrap().unwrap();
        let letters = client
            .dead_letters(Default::default())
            .await
            .unwrap()
            .letters;
        eprintln!(
            "status {:?}, audit {} entries, dead letters {:?}",
            now.status,
            now.audit_log.len(),
            letters.iter().map(|l| &l.reason).collect::<Vec<_>>()
        );
        let task = task.expect("the old task finishes").unwrap();
        assert_eq!(task.status, TaskStatus::Completed);
    }
}

mod delivery_cap {
    //! A worker goes on with a task under one message: crashes during
    //! different steps, each followed by progress, must not add up on that
    //! message's delivery count and dead-letter a task that keeps moving.

    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use crate::common::redis_server::TestRedis;
    use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
    use saga_runtime::prelude::*;

    static HUNG: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    static HANGS: AtomicUsize = AtomicUsize::new(0);

    /// The first execution of each step "crashes" its worker: it hangs, and the
    /// test then kills the worker's whole runtime (no graceful anything).
    async fn crash_once(step: &'static str) {
        let first = HUNG
            .lock()
            .unwrap()
            .get_or_insert_with(HashSet::new)
            .insert(step);
        if first {
            HANGS.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
    }

    struct Chain;

    #[saga(name = "chain")]
    impl Chain {
        #[saga_step(1)]
        #[retry_policy(max_retries = 5, backoff = constant, base_delay_ms = 0)]
        async fn one(&self, n: u64) -> Result<u64, StepError> {
            crash_once("one").await;
            Ok(n + 1)
        }
        #[saga_step(2)]
        #[retry_policy(max_retries = 5, backoff = constant, base_delay_ms = 0)]
        async fn two(&self, n: u64) -> Result<u64, StepError> {
            crash_once("two").await;
            Ok(n + 1)
        }
        #[saga_step(3)]
        #[retry_policy(max_retries = 5, backoff = constant, base_delay_ms = 0)]
        async fn three(&self, n: u64) -> Result<u64, StepError> {
            crash_once("three").await;
            Ok(n + 1)
        }
    }

    fn config() -> RedisConfig {
        RedisConfig {
            visibility_timeout: Duration::from_millis(600),
            block: Duration::from_millis(100),
            ..RedisConfig::default()
        }
    }

    /// Runs a worker engine on a runtime of its own until `HANGS` reaches
    /// `until`, then kills the runtime (like SIGKILL: nothing is released).
    fn worker_until(url: String, until: usize, max_deliveries: u32) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let engine = rt.block_on(async {
                Engine::builder()
                    .backend(RedisBackend::connect_with(&url, config()).await.unwrap())
                    .saga(Chain)
                    .lock_ttl(Duration::from_millis(600))
                    .max_deliveries(max_deliveries)
                    .workers(1)
                    .build()
                    .await
                    .unwrap()
            });
            let deadline = Instant::now() + Duration::from_secs(20);
            while HANGS.load(Ordering::SeqCst) < until && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            std::mem::forget(engine);
            rt.shutdown_background();
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn progress_between_crashes_is_not_poison() {
        let redis = TestRedis::start();
        let url = redis.url();
        let client = Engine::builder()
            .backend(RedisBackend::connect_with(&url, config()).await.unwrap())
            .saga(Chain)
            .workers(0)
            .build()
            .await
            .unwrap();
        let id = client.start::<Chain>(0).await.unwrap();
        // max_deliveries = 2: a message may crash one worker and be retried.
        // Each step crashes exactly one worker, and each redelivery makes
        // progress (completes the step that crashed).
        for crash in 1..=3 {
            worker_until(url.clone(), crash, 2).join().unwrap();
            let task = client.task(id).await.unwrap().unwrap();
            eprintln!(
                "after crash {crash}: {:?} steps {:?}",
                task.status,
                task.steps
                    .iter()
                    .map(|s| format!("{}:{:?}", s.name, s.status))
                    .collect::<Vec<_>>()
            );
            if task.status.is_terminal() {
                break;
            }
        }
        let last = worker_until(url.clone(), usize::MAX, 2);
        let task = tokio::time::timeout(Duration::from_secs(15), client.wait(id))
            .await
            .expect("task finishes")
            .unwrap();
        HANGS.store(usize::MAX, Ordering::SeqCst);
        let _ = last.join();
        assert_eq!(
            task.status,
            TaskStatus::Completed,
            "a task that progressed after each crash was treated as poison: {:?} {:?}",
            task.error,
            task.steps
        );
    }
}

mod recover_in_flight {
    //! After a failed read the Redis backend re-reads the consumer's own
    //! pending messages (a read whose reply was lost). With
    //! `worker_concurrency > 1` those include messages being worked on: they
    //! must not be handed out (and handed back under their handler's feet)
    //! again.

    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use crate::common::redis_server::TestRedis;
    use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
    use saga_runtime::prelude::*;

    struct Slow {
        calls: Arc<AtomicU64>,
    }

    #[saga(name = "slow")]
    impl Slow {
        #[saga_step(1)]
        async fn nap(&self, ms: u64) -> Result<u64, StepError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(ms)
        }
    }

    /// Returns how many XDELs (hand-backs) the server saw beyond the one the
    /// commit makes, for one task whose single step runs 3 s while all client
    /// connections are killed once.
    async fn run(concurrency: usize) -> (u64, TaskInstance) {
        let redis = TestRedis::start();
        let calls = Arc::new(AtomicU64::new(0));
        let config = RedisConfig {
            block: Duration::from_millis(100),
            visibility_timeout: Duration::from_secs(10),
            ..RedisConfig::default()
        };
        let engine = Engine::builder()
            .backend(
                RedisBackend::connect_with(&redis.url(), config)
                    .await
                    .unwrap(),
            )
            .saga(Slow {
                calls: calls.clone(),
            })
            .worker_concurrency(concurrency)
            .lock_retry_delay(Duration::from_millis(100))
            .workers(1)
            .build()
            .await
            .unwrap();
        let id = engine.start::<Slow>(3000).await.unwrap();
        while calls.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let before = redis.command_calls("xdel");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _: redis::Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query(&mut redis.conn())
            .unwrap();
        let task = tokio::time::timeout(Duration::from_secs(20), engine.wait(id))
            .await
            .expect("finishes")
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let xdel = redis.command_calls("xdel") - before;
        eprintln!(
            "concurrency {concurrency}: {xdel} XDELs after the step started, {} calls, {:?}",
            calls.load(Ordering::SeqCst),
            task.status
        );
        (xdel, task)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_read_does_not_hand_out_messages_in_flight() {
        let (one, t1) = run(1).await;
        let (four, t4) = run(4).await;
        assert_eq!(t1.status, TaskStatus::Completed);
        assert_eq!(t4.status, TaskStatus::Completed);
        assert!(
            four <= one,
            "at concurrency 4 the in-flight message was handed back {four} times vs {one} at concurrency 1"
        );
    }
}

mod wait_spin {
    //! `wait` hears of finished tasks through a subscription and remembers
    //! recent ones; a task that runs again under the same id (a keyed start
    //! after its predecessor expired, a requeue) must not be found "finished"
    //! again and again: the waiter would spin on Redis.

    use std::time::Duration;

    use crate::common::redis_server::TestRedis;
    use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
    use saga_runtime::prelude::*;

    struct Sleepy;

    #[saga(name = "sleepy")]
    impl Sleepy {
        #[saga_step(1)]
        async fn nap(&self, ms: u64) -> Result<u64, StepError> {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(ms)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wait_on_a_recreated_keyed_task_does_not_spin() {
        let redis = TestRedis::start();
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
            .saga(Sleepy)
            .retention(Some(Duration::from_millis(200)))
            .workers(1)
            .build()
            .await
            .unwrap();
        let id = engine.start_with_key::<Sleepy>("k", 1).await.unwrap();
        let first = engine.wait(id).await.unwrap();
        assert_eq!(first.status, TaskStatus::Completed);
        // Let the notification arrive and the task expire.
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(engine.task(id).await.unwrap().is_none(), "expired");
        let again = engine.start_with_key::<Sleepy>("k", 2000).await.unwrap();
        assert_eq!(again, id, "same keyed id");
        let before = redis.command_calls("hmget");
        let started = std::time::Instant::now();
        let task = engine.wait(id).await.unwrap();
        let took = started.elapsed();
        let loads = redis.command_calls("hmget") - before;
        assert_eq!(task.status, TaskStatus::Completed);
        eprintln!("wait took {took:?} and sent {loads} HMGETs");
        // Polling every 50 ms for 2 s is about 40 loads.
        assert!(
            loads < 200,
            "wait() spun: {loads} HMGET round trips in {took:?} (expected ~40 at the 50 ms poll)"
        );
    }
}
