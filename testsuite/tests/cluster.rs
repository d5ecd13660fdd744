//! Redis Cluster: the backend conformance suite on a real local cluster
//! (three primaries, three replicas), and the engine running sagas whose
//! partitions spread over its shards.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::redis_cluster::TestCluster;
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::Backend;
use saga_runtime::prelude::*;

/// Test-sized timeouts: messages of a stopped worker come back after
/// 800 ms, idle reads block 100 ms.
fn config(prefix: &str) -> RedisConfig {
    RedisConfig {
        prefix: prefix.to_owned(),
        visibility_timeout: Duration::from_millis(800),
        block: Duration::from_millis(100),
        response_timeout: Duration::from_secs(2),
        ..RedisConfig::default()
    }
}

async fn backend(cluster: &TestCluster, config: RedisConfig) -> RedisBackend {
    cluster.backend(config).await
}

mod conformance {
    use super::*;
    use saga_runtime::testing::conformance::VISIBILITY;

    async fn start() -> TestCluster {
        TestCluster::start()
    }

    /// A backend under a prefix of its own: the cases share the cluster.
    async fn fresh(cluster: &TestCluster) -> (Arc<dyn Backend>, ()) {
        let prefix = format!("c{}", uuid::Uuid::new_v4().simple());
        // Blocking reads of the default length: a case that waits for a
        // write to wake a blocked read must not see the read give up
        // first (a write on a cluster may take a relay more).
        let config = RedisConfig {
            visibility_timeout: VISIBILITY,
            block: Duration::from_secs(1),
            partitions: Some(3),
            ..super::config(&prefix)
        };
        (Arc::new(backend(cluster, config).await), ())
    }

    saga_runtime::backend_conformance!(on_a_cluster, in_turn: fresh, sharing: start);
}

/// Three quick steps; the last counts its calls by input.
struct Quick {
    done: Arc<Mutex<HashMap<u64, usize>>>,
}

#[saga(name = "quick")]
impl Quick {
    #[saga_step(1)]
    async fn one(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(2)]
    async fn two(&self, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
    #[saga_step(3)]
    async fn three(&self, n: u64) -> Result<u64, StepError> {
        *self.done.lock().unwrap().entry(n).or_default() += 1;
        Ok(n)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_spreads_over_every_shard_and_every_task_completes() {
    let cluster = TestCluster::start();
    let done = Arc::new(Mutex::new(HashMap::new()));
    let engine = Engine::builder()
        .backend(backend(&cluster, config("saga")).await)
        .saga(Quick { done: done.clone() })
        .workers(2)
        .build()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..120u64 {
        ids.push(engine.start::<Quick>(n).await.unwrap());
    }
    for id in &ids {
        let task = tokio::time::timeout(Duration::from_secs(30), engine.wait(*id))
            .await
            .expect("every task ends")
            .unwrap();
        assert_eq!(task.status, TaskStatus::Completed, "{task:?}");
    }
    let done = done.lock().unwrap().clone();
    assert_eq!(done.len(), 120);
    assert!(done.values().all(|n| *n == 1), "each last step once");
    // The tasks' records sit on every primary: the partitions spread.
    let mut per_primary: BTreeMap<u16, usize> = BTreeMap::new();
    for port in cluster.primaries() {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_connection()
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("saga:*:task:*")
            .query(&mut c)
            .unwrap();
        per_primary.insert(port, keys.len());
    }
    assert_eq!(per_primary.values().sum::<usize>(), 120, "{per_primary:?}");
    assert!(
        per_primary.values().all(|n| *n > 0),
        "every primary holds tasks: {per_primary:?}"
    );
    engine.shutdown().await;
}

/// A message a process-manager commit left for an endpoint in another
/// slot, which its process died before relaying, is relayed by
/// housekeeping (once it is older than the grace the commit had).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn housekeeping_relays_what_a_dead_process_left_for_an_endpoint() {
    use saga_runtime::backend::{
        Endpoints, Housekeeping, InstanceStatus, ProcessCommit, ProcessInstance, ProcessStore,
        Retention, Settle,
    };
    let cluster = TestCluster::start();
    let b = backend(&cluster, config("rel")).await;
    let now = saga_runtime::task::Timestamp::now();
    let instance = ProcessInstance {
        process: "pm".into(),
        id: "x".into(),
        generation: "x-1".into(),
        started_by: None,
        state: serde_json::json!({}),
        status: InstanceStatus::Active,
        version: 0,
        keys: vec![],
        processed: vec![],
        audit_log: vec![],
        created_at: now,
        updated_at: now,
    };
    let mut commit = ProcessCommit::new(Some(&instance), Settle::Nothing);
    commit.endpoints = vec![("billing".into(), "first".into())];
    b.process_commit("pm", commit)
        .await
        .unwrap()
        .expect("written");
    assert_eq!(b.endpoint_messages("billing").await.unwrap(), ["first"]);
    // What a commit whose process died at once leaves: an entry on the
    // partition's relay stream, relayed by nobody.
    let mut relays = Vec::new();
    for port in cluster.primaries() {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_connection()
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("rel:*:relay").query(&mut c).unwrap();
        relays.extend(keys);
    }
    assert_eq!(relays.len(), 1, "the commit's relay stream: {relays:?}");
    let mut conn = cluster.conn();
    let _: () = redis::cmd("DEL").arg(&relays[0]).query(&mut conn).unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&relays[0])
        .arg("1-0")
        .arg("relay")
        .arg("rel:{rel:endpoint:billing}")
        .arg("envelope")
        .arg("left-behind")
        .query(&mut conn)
        .unwrap();
    let retention = Retention {
        dead_letters: None,
        dead_letters_max: 1000,
        idle_consumers: Duration::from_secs(3600),
        batch: 100,
    };
    let done = b.housekeep(&retention).await.unwrap();
    assert_eq!(done.relayed, 1);
    assert_eq!(
        b.endpoint_messages("billing").await.unwrap(),
        ["first", "left-behind"]
    );
    let left: usize = redis::cmd("XLEN").arg(&relays[0]).query(&mut conn).unwrap();
    assert_eq!(left, 0, "relayed once: the entry is gone");
    let again = b.housekeep(&retention).await.unwrap();
    assert_eq!(again.relayed, 0);
}

/// Structural costs on a cluster, counted with `MONITOR` on every primary
/// (commands scripts run inside Redis excluded): round trips per step of a
/// chain of steps, and what an idle engine sends.
mod costs {
    use super::*;
    use sagas::NoOp;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn tally(seen: &[String]) -> BTreeMap<String, usize> {
        let mut by = BTreeMap::new();
        for cmd in seen {
            *by.entry(cmd.clone()).or_default() += 1;
        }
        by
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_step_costs_few_round_trips_and_an_idle_engine_little() {
        let cluster = TestCluster::start_with(3, 0);
        let done = Arc::new(AtomicU64::new(0));
        let client = Engine::builder()
            .backend(backend(&cluster, config("saga")).await)
            .saga(NoOp { done: done.clone() })
            .workers(0)
            .build()
            .await
            .unwrap();
        const TASKS: u64 = 600;
        for n in 0..TASKS {
            client.start::<NoOp>(n).await.unwrap();
        }
        let monitor = tokio::task::block_in_place(|| cluster.monitor());
        // The default blocking period (1 s): the watchers block for it.
        let workers = Engine::builder()
            .backend(
                backend(
                    &cluster,
                    RedisConfig {
                        block: Duration::from_secs(1),
                        ..config("saga")
                    },
                )
                .await,
            )
            .saga(NoOp { done: done.clone() })
            .workers(2)
            .worker_concurrency(8)
            .build()
            .await
            .unwrap();
        while done.load(Ordering::Relaxed) < TASKS {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let seen = tokio::task::block_in_place(|| monitor.stop(&cluster));
        // Loading a script (`SCRIPT LOAD` after a `NOSCRIPT`) happens once
        // per script and node connection, however many steps run: not a
        // cost per step (how many depends on which connection a call took).
        let loads = tally(&seen).get("SCRIPT").copied().unwrap_or(0);
        let per_step = (seen.len() - loads) as f64 / (TASKS * 3) as f64;
        eprintln!("{per_step:.2} round trips per step: {:?}", tally(&seen));
        // As on one server (`tests/round_trips.rs`): a read takes several
        // messages of a partition, and a step is one write.
        assert!(
            per_step <= 2.0,
            "{per_step:.2} round trips per step: {:?}",
            tally(&seen)
        );

        // Idle: the workers' rounds of reads (one call per partition each
        // blocking period), the watchers, the timer poller (a call per
        // slot each poll) and the heartbeats.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let monitor = tokio::task::block_in_place(|| cluster.monitor());
        tokio::time::sleep(Duration::from_secs(3)).await;
        let seen = tokio::task::block_in_place(|| monitor.stop(&cluster));
        let per_second = seen.len() as f64 / 3.0;
        eprintln!("idle: {per_second:.0} commands/s: {:?}", tally(&seen));
        // About 730 of them are the timer poller's: a call per slot (73
        // with 24 saga and 24 process-manager partitions) each 100 ms; the
        // rest the two workers' rounds (25 calls each a second) and the
        // watchers (24, each once a second).
        assert!(
            per_second <= 900.0,
            "an idle engine sends {per_second:.0} commands/s: {:?}",
            tally(&seen)
        );
        workers.shutdown().await;
    }
}

/// An engine that shuts down gives up its share of the partitions to
/// watch at once: a task started on one of them right after is taken
/// promptly by the engine left, not after the membership's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_engine_hands_its_partitions_to_watch_over_at_once() {
    let cluster = TestCluster::start_with(3, 0);
    let done = Arc::new(Mutex::new(HashMap::new()));
    let engine = |workers| {
        let done = done.clone();
        let cluster = &cluster;
        async move {
            Engine::builder()
                .backend(backend(cluster, config("saga")).await)
                .saga(Quick { done })
                .workers(workers)
                .build()
                .await
                .unwrap()
        }
    };
    let leaving = engine(1).await;
    let staying = engine(1).await;
    let client = engine(0).await;
    // Both have taken their places among the readers.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    leaving.shutdown().await;
    // The one left renews its place (once a second) and finds itself
    // alone.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut slow = Vec::new();
    for n in 0..24u64 {
        let started = tokio::time::Instant::now();
        let id = client.start::<Quick>(n).await.unwrap();
        client.wait(id).await.unwrap();
        let took = started.elapsed();
        if took > Duration::from_millis(500) {
            slow.push((n, took));
        }
        // Idle again before the next one.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        slow.is_empty(),
        "tasks waited for the idle workers' round of reads: {slow:?}"
    );
    staying.shutdown().await;
}

/// A write that claimed correlation entries in other slots than its
/// instance's, and then failed (here: its version was stale), gives them
/// up: another instance claims the values at once, not after the claims
/// lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_gives_up_the_entries_it_claimed() {
    use saga_runtime::backend::{
        InstanceStatus, ProcessCommit, ProcessInstance, ProcessRefusal, ProcessStore, Settle,
    };
    let cluster = TestCluster::start_with(3, 0);
    let b = backend(&cluster, config("claims")).await;
    let instance = |id: &str, keys: Vec<(String, String)>, version| {
        let now = saga_runtime::task::Timestamp::now();
        ProcessInstance {
            process: "pm".into(),
            id: id.into(),
            generation: format!("{id}-1"),
            started_by: None,
            state: serde_json::json!({}),
            status: InstanceStatus::Active,
            version,
            keys,
            processed: vec![],
            audit_log: vec![],
            created_at: now,
            updated_at: now,
        }
    };
    let a = instance("a", vec![], 0);
    b.process_commit("pm", ProcessCommit::new(Some(&a), Settle::Nothing))
        .await
        .unwrap()
        .expect("written");
    // Sixteen values: most live in other slots than "a".
    for n in 0..16 {
        let value = format!("v-{n}");
        let key = vec![("ref".to_owned(), value.clone())];
        let stale = instance("a", key.clone(), 0);
        let mut write = ProcessCommit::new(Some(&stale), Settle::Nothing);
        write.add_keys = key.clone();
        let refused = b.process_commit("pm", write).await;
        assert!(
            matches!(refused, Ok(Err(ProcessRefusal::Conflict))),
            "{refused:?}"
        );
        let other = instance(&format!("b-{n}"), key.clone(), 0);
        let mut write = ProcessCommit::new(Some(&other), Settle::Nothing);
        write.add_keys = key;
        b.process_commit("pm", write)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{value} still held by the failed write: {e}"));
        let found = b.process_find("pm", "ref", &value).await.unwrap().unwrap();
        assert_eq!(found.id, format!("b-{n}"));
    }
}

/// Flow-control limits on a cluster: each `(limit, key)` lives in a slot
/// of its own (one script per call), so keys of one limit spread over the
/// shards, and two limits whose keys sit on different primaries hold,
/// queue and hand on their slots each on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_with_keys_on_different_shards_each_hold() {
    use saga_runtime::backend::{LimitDecision, LimitRequest};
    use saga_runtime::limit::LimitConfig;

    let cluster = TestCluster::start();
    let b: Arc<dyn Backend> = Arc::new(backend(&cluster, config("lim")).await);
    let limits = b.clone().limits().expect("the Redis backend shares limits");
    let one = LimitConfig {
        concurrency: Some(1),
        rate: None,
    };
    let ask = |limit: &'static str, key: String, holder: &'static str| {
        let limits = limits.clone();
        async move {
            let request = LimitRequest {
                limit,
                key: Some(&key),
                config: one,
                holder,
                waiter: holder,
                hold_for: Duration::from_secs(30),
                wake: Some(holder),
            };
            limits.limit_acquire(&request).await.unwrap()
        }
    };
    // Where a key's state lives: the primary serving its slot.
    let mut conn = cluster.conn();
    let mut home = |limit: &str, n: u32| {
        let key = format!("lim:{{lim:limit:{limit}={n}}}:holders");
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query(&mut conn)
            .unwrap();
        let exists: bool = redis::cmd("EXISTS").arg(&key).query(&mut conn).unwrap();
        (exists, cluster.primary_of_slot(slot))
    };
    assert_eq!(
        ask("psp", "0".to_owned(), "h1").await.decision,
        LimitDecision::Granted
    );
    let (held, a_home) = home("psp", 0);
    assert!(held, "psp's slot is held in its key's slot");
    let mut other = None;
    for n in 0..16 {
        let got = ask("mail", n.to_string(), "h1").await;
        assert_eq!(got.decision, LimitDecision::Granted, "mail key {n}");
        let (held, at) = home("mail", n);
        assert!(held, "mail key {n}");
        if at != a_home {
            other.get_or_insert(n);
        }
    }
    let b_key = other.expect("16 keys spread over more than one primary");
    // Two limits, whose keys' state lives on different primaries.
    let waits = |d: &LimitDecision| matches!(d, LimitDecision::Wait { .. });
    assert!(waits(&ask("psp", "0".to_owned(), "h2").await.decision));
    assert!(waits(&ask("mail", b_key.to_string(), "h3").await.decision));
    let released = limits
        .limit_release("psp", Some("0"), "h1", one)
        .await
        .unwrap();
    assert!(released.released);
    assert_eq!(released.wake, ["h2"], "only psp's line is woken");
    let usage = limits
        .limit_usage("mail", Some(&b_key.to_string()), one)
        .await
        .unwrap();
    assert_eq!((usage.in_use, usage.waiting), (1, 1), "mail is untouched");
    let released = limits
        .limit_release("mail", Some(&b_key.to_string()), "h1", one)
        .await
        .unwrap();
    assert_eq!(released.wake, ["h3"]);
    assert_eq!(
        ask("psp", "0".to_owned(), "h2").await.decision,
        LimitDecision::Granted
    );
    assert_eq!(
        ask("mail", b_key.to_string(), "h3").await.decision,
        LimitDecision::Granted
    );
}
