//! Durability checked, not assumed, against private redis-servers:
//!
//! - a server whose `maxmemory-policy` evicts keys is refused at connect
//!   (an evicting server deletes tasks silently), unless the user opts out;
//!   a server that refuses `CONFIG` (managed Redis) is connected to,
//!   unchecked;
//! - `Durability::Replicated` waits for a replica after each write: with
//!   the replica paused (SIGSTOP) a write reports the durability failure
//!   within the timeout, and stays applied on the primary;
//! - `Durability::Fsynced` is refused at connect by a server without the
//!   append-only file, and by one without `WAITAOF` (before Redis 7.2);
//! - on a cluster, a process-manager message forwarded to another shard
//!   waits for that shard's replica before the source lets it go.
//!
//! These wait on a real server's `WAIT` timeout, so they run on the wall
//! clock, not tokio's paused one.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::redis_cluster::TestCluster;
use common::redis_server::{free_port, TestRedis};
use saga_runtime::backend::redis::{Durability, RedisBackend, RedisConfig};
use saga_runtime::backend::{BackendError, QueueMessage, TaskStore};
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

fn config(durability: Durability) -> RedisConfig {
    RedisConfig {
        visibility_timeout: Duration::from_millis(800),
        block: Duration::from_millis(100),
        durability,
        ..RedisConfig::default()
    }
}

fn set(redis: &TestRedis, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(&mut redis.conn())
        .unwrap();
}

fn info(port: u16, section: &str) -> String {
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("INFO").arg(section).query(&mut conn).unwrap()
}

fn field(info: &str, name: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| v.trim().to_owned())
}

/// `replica` made a replica of `primary`, in sync.
fn attach_replica(primary: &TestRedis, replica: &TestRedis) {
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port())
        .query(&mut replica.conn())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while field(&info(primary.port(), "replication"), "slave0")
        .is_none_or(|s| !s.contains("state=online"))
    {
        assert!(Instant::now() < deadline, "the replica did not sync");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid of the server on `port`.
fn pid(port: u16) -> String {
    field(&info(port, "server"), "process_id").unwrap()
}

/// Sends `signal` (`-STOP`, `-CONT`) to process `pid`.
fn signal(pid: &str, signal: &str) {
    let status = Command::new("kill").args([signal, pid]).status().unwrap();
    assert!(status.success());
}

fn task() -> (TaskInstance, QueueMessage) {
    let task = TaskInstance::new("noop", serde_json::json!(1), [("one".to_owned(), 1)]);
    let first = QueueMessage {
        task_id: task.id,
        saga: "noop".into(),
        seq: 0,
    };
    (task, first)
}

fn misconfigured(result: Result<RedisBackend, BackendError>) -> String {
    match result {
        Err(BackendError::Misconfigured(why)) => why,
        Err(other) => panic!("expected a refusal, got {other}"),
        Ok(_) => panic!("expected a refusal, connected"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_server_is_refused_unless_the_user_opts_out() {
    let redis = TestRedis::start();
    for policy in ["allkeys-lru", "volatile-lru"] {
        set(&redis, "maxmemory-policy", policy);
        let why = misconfigured(
            RedisBackend::connect_with(&redis.url(), config(Durability::Primary)).await,
        );
        assert!(why.contains(policy), "{why}");
        assert!(why.contains("allow_eviction"), "says how to opt out: {why}");
        assert!(why.contains("noeviction"), "says what to set: {why}");
    }
    let opted_out = RedisConfig {
        allow_eviction: true,
        ..config(Durability::Primary)
    };
    RedisBackend::connect_with(&redis.url(), opted_out)
        .await
        .expect("accepted with the opt-out");
    set(&redis, "maxmemory-policy", "noeviction");
    RedisBackend::connect_with(&redis.url(), config(Durability::Primary))
        .await
        .expect("noeviction is accepted");
}

/// A server with `CONFIG` renamed away (as managed Redis does): its
/// settings cannot be read, so it is connected to unchecked (and logged),
/// not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_hides_its_settings_is_connected_to_unchecked() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server: Child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--maxmemory-policy", "allkeys-lru"])
        .args(["--rename-command", "CONFIG", ""])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("redis://127.0.0.1:{port}/");
    let client = redis::Client::open(url.as_str()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.get_connection().is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(25));
    }
    let connected = RedisBackend::connect_with(&url, config(Durability::Primary)).await;
    let _ = server.kill();
    let _ = server.wait();
    connected.expect("connected although its settings could not be read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_write_waits_for_the_replica_and_fails_in_time_without_it() {
    let primary = TestRedis::start();
    let replica = TestRedis::start();
    attach_replica(&primary, &replica);
    let timeout = Duration::from_millis(400);
    let replicated = Durability::Replicated {
        replicas: 1,
        timeout,
    };
    let durable = RedisBackend::connect_with(&primary.url(), config(replicated))
        .await
        .unwrap();
    let plain = RedisBackend::connect_with(&primary.url(), config(Durability::Primary))
        .await
        .unwrap();

    // With the replica up, the write is acknowledged, after a `WAIT`.
    let waits = |port| {
        field(&info(port, "commandstats"), "cmdstat_wait")
            .and_then(|s| {
                s.split(['=', ','])
                    .nth(1)
                    .map(|n| n.parse::<u64>().unwrap())
            })
            .unwrap_or(0)
    };
    let before = waits(primary.port());
    let (t, first) = task();
    durable.create_task(&t, &first).await.unwrap();
    // (Redis counts a `WAIT` that blocked once when it blocks and once
    // when it answers.)
    assert!(
        waits(primary.port()) > before,
        "the start waited for the replica"
    );

    // With the replica paused, the default level does not notice...
    let replica_pid = pid(replica.port());
    signal(&replica_pid, "-STOP");
    let (t, first) = task();
    let started = Instant::now();
    plain.create_task(&t, &first).await.unwrap();
    assert!(
        started.elapsed() < timeout,
        "the default level waits for nobody"
    );

    // ...and the replicated one reports it, within the timeout.
    let (t, first) = task();
    let started = Instant::now();
    let error = durable.create_task(&t, &first).await.unwrap_err();
    let took = started.elapsed();
    signal(&replica_pid, "-CONT");
    assert!(error.is_transient(), "{error}");
    let text = error.to_string();
    assert!(text.contains("0 of the 1 replica"), "{text}");
    assert!(text.contains("not undone"), "{text}");
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(2),
        "reported after {took:?}, the timeout is {timeout:?}"
    );
    // The write happened on the primary, and is not undone: the retry
    // finds it (the start is idempotent), now that the replica is back.
    assert!(durable.load_task(t.id).await.unwrap().is_some());
    match durable.create_task(&t, &first).await.unwrap() {
        saga_runtime::backend::Created::Existing(_) => {}
        other => panic!("the retry must find the start done: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fsynced_level_is_refused_by_a_server_that_cannot_give_it() {
    let fsynced = Durability::Fsynced {
        replicas: 0,
        timeout: Duration::from_millis(500),
    };
    let no_aof = TestRedis::start_with_aof(false);
    let why = misconfigured(RedisBackend::connect_with(&no_aof.url(), config(fsynced)).await);
    assert!(why.contains("appendonly"), "{why}");

    let aof = TestRedis::start();
    let version = field(&info(aof.port(), "server"), "redis_version").unwrap();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let at_least_7_2 = (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (7, 2);
    let connected = RedisBackend::connect_with(&aof.url(), config(fsynced)).await;
    match at_least_7_2 {
        false => {
            let why = misconfigured(connected);
            assert!(why.contains("WAITAOF") && why.contains("7.2"), "{why}");
        }
        true => {
            let backend = connected.expect("Redis 7.2+ with the AOF gives the level");
            let (t, first) = task();
            backend.create_task(&t, &first).await.unwrap();
        }
    }
}

#[derive(Debug, Message, Serialize, Deserialize)]
struct Opened {
    #[correlation_id]
    account: String,
    number: String,
}

/// Known by the number alone: found through a correlation value whose
/// entry sits in another partition, so it is forwarded there.
#[derive(Debug, Message, Serialize, Deserialize)]
struct Funded {
    number: String,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Account {
    number: String,
    funded: u32,
}

struct Accounts;

#[process_manager(name = "accounts", state = Account)]
impl Accounts {
    #[starts]
    async fn opened(
        &self,
        msg: Opened,
        state: &mut Account,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.number = msg.number;
        Ok(())
    }

    #[handles]
    #[correlate(state.number = msg.number)]
    async fn funded(
        &self,
        _msg: Funded,
        state: &mut Account,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.funded += 1;
        ctx.mark_complete();
        Ok(())
    }
}

/// Every command a node runs, as `(client, command line)`, until stopped.
struct Monitor {
    child: Child,
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl Monitor {
    fn start(port: u16) -> Self {
        let mut child = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "monitor"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                // `<time> [<db> <client>] "CMD" ...`
                let Some((head, cmd)) = line.split_once("] ") else {
                    continue;
                };
                let client = head.rsplit(' ').next().unwrap_or("").to_owned();
                sink.lock().unwrap().push((client, cmd.to_owned()));
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        Monitor { child, seen }
    }

    fn stop(mut self) -> Vec<(String, String)> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_forwarded_to_another_shard_waits_for_its_replica() {
    let cluster = TestCluster::start();
    let monitors: Vec<Monitor> = cluster
        .primaries()
        .into_iter()
        .map(Monitor::start)
        .collect();
    let config = RedisConfig {
        visibility_timeout: Duration::from_millis(1000),
        block: Duration::from_millis(100),
        response_timeout: Duration::from_secs(2),
        durability: Durability::Replicated {
            replicas: 1,
            timeout: Duration::from_secs(2),
        },
        ..RedisConfig::default()
    };
    let engine = Engine::builder()
        .backend(cluster.backend(config).await)
        .process_manager(Accounts)
        .workers(2)
        .worker_concurrency(4)
        .build()
        .await
        .unwrap();
    const N: usize = 12;
    for i in 0..N {
        engine
            .publish(Opened {
                account: format!("a-{i}"),
                number: format!("N-{i}"),
            })
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..N {
        while engine
            .process_instance::<Accounts>(&format!("a-{i}"))
            .await
            .unwrap()
            .is_none()
        {
            assert!(Instant::now() < deadline, "account {i} not opened");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for i in 0..N {
        engine
            .publish(Funded {
                number: format!("N-{i}"),
            })
            .await
            .unwrap();
    }
    for i in 0..N {
        loop {
            let instance = engine
                .process_instance::<Accounts>(&format!("a-{i}"))
                .await
                .unwrap()
                .unwrap();
            if instance.status == saga_runtime::backend::InstanceStatus::Completed {
                let state: Account = serde_json::from_value(instance.state).unwrap();
                assert_eq!(state.funded, 1, "a-{i}: applied once");
                break;
            }
            assert!(Instant::now() < deadline, "account {i} not funded");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let forwarded = engine
        .process_metrics()
        .forwarded
        .load(std::sync::atomic::Ordering::Relaxed);
    engine.shutdown().await;
    assert!(forwarded > 0, "the test needs forwarded messages");

    // Each forwarded copy (an `XADD` carrying `unanswered`) was followed on
    // its client, on the target shard, by a `WAIT` for one replica.
    let mut copies = 0;
    for monitor in monitors {
        let seen = monitor.stop();
        for (i, (client, cmd)) in seen.iter().enumerate() {
            if !(cmd.starts_with("\"XADD\"") && cmd.contains("\"unanswered\"")) {
                continue;
            }
            copies += 1;
            let next = seen[i + 1..].iter().find(|(c, _)| c == client);
            assert!(
                next.is_some_and(|(_, cmd)| cmd.starts_with("\"WAIT\" \"1\"")),
                "a forwarded copy not waited for: {cmd} then {next:?}"
            );
        }
    }
    assert!(
        copies as u64 >= forwarded,
        "{copies} copies seen, {forwarded} forwarded"
    );
}

/// A limit's grant is a write an attempt starts on: at
/// `Durability::Replicated` it waits for the replica (a failover to it
/// loses no slot given), and with the replica paused it reports the
/// failure; the grant stays on the primary, and the retry by the same
/// holder finds its slot, taking no second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_grant_waits_for_the_replica() {
    use saga_runtime::backend::{LimitDecision, LimitRequest, Limits};
    use saga_runtime::limit::LimitConfig;

    let primary = TestRedis::start();
    let replica = TestRedis::start();
    attach_replica(&primary, &replica);
    let timeout = Duration::from_millis(400);
    let durable = RedisBackend::connect_with(
        &primary.url(),
        config(Durability::Replicated {
            replicas: 1,
            timeout,
        }),
    )
    .await
    .unwrap();
    let two = LimitConfig {
        concurrency: Some(2),
        rate: None,
    };
    let request = |holder| LimitRequest {
        limit: "psp",
        key: None,
        config: two,
        holder,
        waiter: holder,
        hold_for: Duration::from_secs(30),
        wake: Some(holder),
    };
    let granted = durable.limit_acquire(&request("h1")).await.unwrap();
    assert_eq!(granted.decision, LimitDecision::Granted);
    let replicated: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg("saga:{saga:limit:psp}:holders")
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut replica.conn())
        .unwrap();
    assert_eq!(replicated.len(), 1, "the replica holds the grant");
    assert_eq!(replicated[0].0, "h1");

    let replica_pid = pid(replica.port());
    signal(&replica_pid, "-STOP");
    let error = durable.limit_acquire(&request("h2")).await.unwrap_err();
    signal(&replica_pid, "-CONT");
    assert!(error.is_transient(), "{error}");
    assert!(error.to_string().contains("0 of the 1 replica"), "{error}");
    // The replica, resumed, catches up: the retry by the same holder (as
    // many times as a busy machine needs) finds its slot.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let again = loop {
        match durable.limit_acquire(&request("h2")).await {
            Ok(again) => break again,
            Err(error) if tokio::time::Instant::now() < deadline => {
                assert!(error.is_transient(), "{error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("the replica never caught up: {error}"),
        }
    };
    assert_eq!(again.decision, LimitDecision::Granted);
    let usage = durable.limit_usage("psp", None, two).await.unwrap();
    assert_eq!(usage.in_use, 2, "h2's retry took no second slot");
}
