//! Process-manager partitions on a private redis-server: each partition is
//! read by one engine at a time, so the messages of one instance have one
//! writer across processes; partitions move when engines join, leave or
//! die; a message for a process manager its partition's owner does not run
//! still reaches one that does.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::redis_server::TestRedis;
use common::until;
use saga_runtime::backend::{Interest, Partitions, WorkItem, WorkQueue};
use saga_runtime::engine::ProcessMetrics;
use saga_runtime::prelude::*;
use saga_runtime::process::{Envelope, EnvelopeKind};
use serde::{Deserialize, Serialize};

/// Process-manager partitions (of the default prefix, `saga`).
const PARTITIONS: usize = 16;

#[derive(Message, Serialize, Deserialize)]
struct Add {
    #[correlation_id]
    key: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Sum {
    n: u64,
}

/// Counts the `Add`s of each key.
struct Adder;

#[process_manager(name = "adder", state = Sum)]
impl Adder {
    #[starts]
    async fn add(
        &self,
        _m: Add,
        s: &mut Sum,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.n += 1;
        Ok(())
    }
}

#[derive(Message, Serialize, Deserialize)]
struct Ping {
    #[correlation_id]
    key: String,
}

/// A second process manager, for engines that run one but not the other.
struct Pinger;

#[process_manager(name = "pinger", state = Sum)]
impl Pinger {
    #[starts]
    async fn ping(
        &self,
        _m: Ping,
        s: &mut Sum,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.n += 1;
        Ok(())
    }
}

enum Runs {
    Adder,
    Pinger,
}

/// An engine with `workers` workers; partitions are granted for the task
/// lease (`lease`) and renewed every heartbeat (a third of it, at most 1 s).
async fn engine(redis: &TestRedis, runs: Runs, workers: usize, lease: Duration) -> Engine {
    let builder = Engine::builder()
        .backend(redis.backend().await)
        .lock_ttl(lease)
        .worker_concurrency(4)
        .workers(workers);
    match runs {
        Runs::Adder => builder.process_manager(Adder),
        Runs::Pinger => builder.process_manager(Pinger),
    }
    .build()
    .await
    .unwrap()
}

/// How many entries `stream` ever got (`XINFO STREAM`'s `entries-added`).
fn entries_added(redis: &TestRedis, stream: &str) -> u64 {
    let info: redis::Value = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(stream)
        .query(&mut redis.conn())
        .unwrap();
    let redis::Value::Array(fields) = info else {
        panic!("XINFO STREAM answered {info:?}")
    };
    let at = fields
        .iter()
        .position(|f| matches!(f, redis::Value::BulkString(b) if b == b"entries-added"))
        .expect("entries-added");
    match &fields[at + 1] {
        redis::Value::Int(n) => *n as u64,
        other => panic!("entries-added is {other:?}"),
    }
}

fn metric(engine: &Engine, pick: impl Fn(&ProcessMetrics) -> &std::sync::atomic::AtomicU64) -> u64 {
    pick(engine.process_metrics()).load(Ordering::Relaxed)
}

async fn sum<P: ProcessManager<State = Sum>>(engine: &Engine, key: &str) -> u64 {
    engine
        .process_state::<P>(key)
        .await
        .unwrap()
        .map_or(0, |s| s.n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_split_the_partitions_and_one_instance_has_one_writer() {
    let redis = TestRedis::start();
    let lease = Duration::from_secs(30);
    let a = engine(&redis, Runs::Adder, 2, lease).await;
    let b = engine(&redis, Runs::Adder, 2, lease).await;
    until("two engines owning eight partitions each", async || {
        let owners = redis.partition_owners();
        let set = redis.partition_owner_set().unwrap_or_default();
        set.len() == 2
            && set
                .iter()
                .all(|o| owners.iter().filter(|x| x.as_ref() == Some(o)).count() == 8)
    })
    .await;
    // A read in flight when the partitions moved (one block of 100 ms at
    // most) may still name the old ones: wait it out.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..1000 {
        a.publish(Add { key: "hot".into() }).await.unwrap();
    }
    until("1000 additions", async || {
        sum::<Adder>(&b, "hot").await >= 1000
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sum::<Adder>(&a, "hot").await, 1000, "none lost, none twice");
    // Every message of the instance went to one engine's partition: eight
    // workers in two processes, and no handler ever ran on a stale read.
    let handled = [&a, &b].map(|e| metric(e, |m| &m.handled));
    assert_eq!(handled.iter().sum::<u64>(), 1000);
    assert!(handled.contains(&0), "one writer: {handled:?}");
    let conflicts = [&a, &b].map(|e| metric(e, |m| &m.conflicts));
    assert_eq!(conflicts, [0, 0], "no handler re-ran on a conflict");

    // A leaving engine lets go at once: the other owns everything long
    // before the 30 s lease would have run out.
    let left = Instant::now();
    a.shutdown().await;
    until("the remaining engine owning all sixteen", async || {
        redis.partition_owner_set().is_some_and(|s| s.len() == 1)
    })
    .await;
    assert!(
        left.elapsed() < Duration::from_secs(10),
        "{:?}",
        left.elapsed()
    );
    b.publish(Add {
        key: "after".into(),
    })
    .await
    .unwrap();
    until("a message after the hand-over", async || {
        sum::<Adder>(&b, "after").await == 1
    })
    .await;
    b.shutdown().await;
    assert_eq!(
        redis.partition_owners(),
        vec![None; PARTITIONS],
        "all let go"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_of_a_dead_engine_are_read_by_no_one_else_until_its_lease_runs_out() {
    let redis = TestRedis::start();
    // An engine that took every partition and died without letting go.
    let ghost_lease = Duration::from_secs(3);
    let owned = redis
        .backend()
        .await
        .process_partitions("ghost", ghost_lease, 0)
        .await
        .unwrap();
    assert_eq!(owned, Some(0xffff));
    let granted = Instant::now();
    let a = engine(&redis, Runs::Adder, 1, Duration::from_millis(800)).await;
    for n in 0..5 {
        a.publish(Add {
            key: format!("k-{n}"),
        })
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ghost = Some("ghost".to_owned());
    assert!(
        granted.elapsed() < ghost_lease && redis.partition_owners().iter().all(|o| *o == ghost),
        "the ghost still owns every partition"
    );
    assert_eq!(metric(&a, |m| &m.handled), 0, "nothing read past its owner");
    until(
        "the five messages, once the ghost's lease ran out",
        async || metric(&a, |m| &m.handled) == 5,
    )
    .await;
    assert!(granted.elapsed() >= ghost_lease);
    for n in 0..5 {
        assert_eq!(sum::<Adder>(&a, &format!("k-{n}")).await, 1);
    }
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_for_a_process_manager_the_owner_does_not_run_moves_where_every_engine_reads() {
    let redis = TestRedis::start();
    let a = engine(&redis, Runs::Adder, 1, Duration::from_millis(800)).await;
    until("the adder engine owning every partition", async || {
        redis.partition_owner_set().is_some_and(|s| s.len() == 1)
    })
    .await;
    // A client (no workers, so it takes no partitions) that knows where
    // pings go.
    let client = engine(&redis, Runs::Pinger, 0, Duration::from_millis(800)).await;
    for n in 0..10 {
        client
            .publish(Ping {
                key: format!("p-{n}"),
            })
            .await
            .unwrap();
    }
    // The owner does not run `pinger`: it moves each ping off its
    // partition (where no engine that runs `pinger` would read it) to the
    // shared stream, and hands it back there like any message it cannot
    // handle.
    let on_shared = || {
        let mut conn = redis.conn();
        let queued: u64 = redis::cmd("XLEN")
            .arg("saga:{saga:pm}:queue")
            .query(&mut conn)
            .unwrap();
        let delayed: u64 = redis::cmd("ZCARD")
            .arg("saga:{saga:pm}:delayed")
            .query(&mut conn)
            .unwrap();
        queued + delayed
    };
    until("ten pings on the shared stream", async || on_shared() == 10).await;
    a.shutdown().await;
    let b = engine(&redis, Runs::Pinger, 1, Duration::from_millis(800)).await;
    until(
        "ten pings handled by the engine that runs pinger",
        async || metric(&b, |m| &m.handled) == 10,
    )
    .await;
    assert_eq!(metric(&a, |m| &m.dead_lettered), 0);
    for n in 0..10 {
        assert_eq!(sum::<Pinger>(&b, &format!("p-{n}")).await, 1);
    }
    b.shutdown().await;
}

#[derive(Message, Serialize, Deserialize)]
struct Nap {
    #[correlation_id]
    key: String,
}

#[derive(Message, Serialize, Deserialize)]
struct Wake;

/// Starts on a message by id and wakes on its own timeout.
struct Sleeper;

#[process_manager(name = "sleeper", state = Sum)]
impl Sleeper {
    #[starts]
    async fn nap(
        &self,
        _m: Nap,
        _s: &mut Sum,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.request_timeout(Duration::from_millis(1), Wake);
        Ok(())
    }

    #[timeout]
    async fn wake(
        &self,
        _t: Wake,
        s: &mut Sum,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.n += 1;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_goes_to_the_partition_of_the_messages_of_its_instance() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .process_manager(Sleeper)
        .timeout_poll_interval(Duration::from_millis(10))
        .workers(1)
        .build()
        .await
        .unwrap();
    until("the engine owning the partitions", async || {
        redis.partition_owner_set().is_some()
    })
    .await;
    for n in 0..8 {
        engine
            .publish(Nap {
                key: format!("n-{n}"),
            })
            .await
            .unwrap();
    }
    until("eight wakes", async || {
        let mut woken = 0;
        for n in 0..8 {
            woken += sum::<Sleeper>(&engine, &format!("n-{n}")).await;
        }
        woken == 8
    })
    .await;
    // The script that moves due timeouts routes them as the engine routes
    // messages: each partition stream got its naps and exactly as many
    // wakes, the shared stream nothing.
    let added = |stream: &str| entries_added(&redis, stream);
    assert_eq!(added("saga:{saga:pm}:queue"), 0);
    let per_partition: Vec<u64> = (0..PARTITIONS)
        .map(|k| added(&format!("saga:{{saga:pm}}:queue:{k}")))
        .collect();
    assert_eq!(per_partition.iter().sum::<u64>(), 16, "{per_partition:?}");
    assert!(
        per_partition.iter().all(|n| n % 2 == 0),
        "a nap and its wake in one partition: {per_partition:?}"
    );
    engine.shutdown().await;
}

#[derive(Message, Serialize, Deserialize)]
struct Entry {
    #[correlation_id]
    key: String,
    n: u32,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Journal {
    entries: Vec<u32>,
}

/// Appends each entry; an entry divisible by 7 fails on its first try (the
/// default `#[on_error]` retries it), in the middle of whatever batch it
/// lands in.
struct Journaler {
    failed: std::sync::Mutex<std::collections::HashSet<u32>>,
}

#[process_manager(name = "journal", state = Journal)]
impl Journaler {
    #[starts]
    async fn entry(
        &self,
        m: Entry,
        s: &mut Journal,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if m.n.is_multiple_of(7) && self.failed.lock().unwrap().insert(m.n) {
            return Err(ProcessError::new(format!("entry {} fails once", m.n)));
        }
        s.entries.push(m.n);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_waiting_for_one_instance_are_saved_together_each_exactly_once() {
    let redis = TestRedis::start();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .process_manager(Journaler {
            failed: Default::default(),
        })
        .worker_concurrency(16)
        .workers(1)
        .build()
        .await
        .unwrap();
    for n in 1..=600 {
        engine.publish(Entry { key: "j".into(), n }).await.unwrap();
    }
    let entries = || async {
        engine
            .process_state::<Journaler>("j")
            .await
            .unwrap()
            .map_or_else(Vec::new, |j| j.entries)
    };
    until("600 entries", async || entries().await.len() >= 600).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut got = entries().await;
    got.sort_unstable();
    assert_eq!(got, (1..=600).collect::<Vec<_>>(), "each once, none lost");
    let metrics = engine.process_metrics();
    let batched = metrics.batched.load(Ordering::Relaxed);
    // Handled counts each message once, batched or not. (A failure in a
    // batch is not `#[on_error]`'s yet: the message is handled again
    // alone, where this handler succeeds.)
    assert_eq!(metrics.handled.load(Ordering::Relaxed), 600);
    assert!(metrics.failed.load(Ordering::Relaxed) <= 85);
    assert!(
        batched > 100,
        "waiting messages share writes: {batched} batched"
    );
    engine.shutdown().await;
}

/// A worker that stalled past the visibility timeout while its message was
/// taken over must not copy that message to the shared stream: it is the
/// other consumer's now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_share_leaves_a_message_taken_over_by_another_consumer_alone() {
    let every_partition = Interest {
        sagas: false,
        ..Interest::ALL
    };
    let shared_only = Interest {
        process_partitions: 0,
        ..every_partition
    };
    let redis = TestRedis::start();
    let b = redis.backend().await; // visibility timeout 800 ms
    b.process_partitions("reader", Duration::from_secs(60), 0)
        .await
        .unwrap();
    let envelope = Envelope {
        message_id: "m-1".into(),
        process: "nobody".into(),
        message_type: "T".into(),
        payload: serde_json::json!({}),
        kind: EnvelopeKind::Message,
        instance_id: None,
        generation: None,
        failures: 0,
        key: Some("k".into()),
        key_field: None,
        traceparent: None,
        due_ms: None,
        hops: 0,
        hold_until: None,
    };
    b.enqueue(&[WorkItem::Process(envelope)]).await.unwrap();
    let first = b
        .receive("c1", every_partition, Duration::from_millis(100))
        .await
        .unwrap()
        .expect("c1 reads the message off its partition");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let second = b
        .receive("c2", every_partition, Duration::from_millis(100))
        .await
        .unwrap()
        .expect("c2 takes the message over");
    assert_eq!(second.id, first.id);
    assert!(b.share(&first).await.unwrap(), "c1 is answered");
    let third = b
        .receive("c3", shared_only, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(third.map(|d| d.id), None, "no copy on the shared stream");
    // c2, whose it is, moves it.
    b.share(&second).await.unwrap();
    let moved = b
        .receive("c3", shared_only, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(moved.is_some(), "the owner's share moves it");
}

/// A deployment upgraded from a version without partitions, producers
/// first: until an engine reads partitions, messages go to the stream the
/// older workers read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_an_engine_reads_partitions_messages_go_where_older_workers_read() {
    let redis = TestRedis::start();
    let client = engine(&redis, Runs::Adder, 0, Duration::from_millis(800)).await;
    client.publish(Add { key: "x".into() }).await.unwrap();
    let shared_len = || -> u64 {
        redis::cmd("XLEN")
            .arg("saga:{saga:pm}:queue")
            .query(&mut redis.conn())
            .unwrap()
    };
    assert_eq!(shared_len(), 1, "on the shared stream");
    let worker = engine(&redis, Runs::Adder, 1, Duration::from_millis(800)).await;
    until("the worker owning the partitions", async || {
        redis.partition_owner_set().is_some()
    })
    .await;
    client.publish(Add { key: "y".into() }).await.unwrap();
    until("both handled", async || {
        sum::<Adder>(&worker, "x").await == 1 && sum::<Adder>(&worker, "y").await == 1
    })
    .await;
    let on_partitions: u64 = (0..PARTITIONS)
        .map(|k| entries_added(&redis, &format!("saga:{{saga:pm}}:queue:{k}")))
        .sum();
    assert_eq!(on_partitions, 1, "once an engine reads them, partitions");
    assert_eq!(shared_len(), 0);
    worker.shutdown().await;
}

#[derive(Message, Serialize, Deserialize)]
struct Knock {
    #[correlation_id]
    key: String,
}

struct Door;

#[process_manager(name = "door", state = Sum, concurrency = pessimistic)]
impl Door {
    #[starts]
    async fn knock(
        &self,
        _m: Knock,
        s: &mut Sum,
        _ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        s.n += 1;
        Ok(())
    }
}

/// A message handed back with a delay onto its partition comes back even
/// while the timer poller is an engine that does not know partitions (a
/// rolling deploy): the partition's owner moves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_hand_back_on_a_partition_comes_back_without_the_timer_poller() {
    let redis = TestRedis::start();
    let mut conn = redis.conn();
    // Someone else polls the timers, and the instance's lease is busy for
    // a second: the message is handed back with a delay.
    let _: () = redis::cmd("SET")
        .arg("saga:{saga:pm}:lease:timers")
        .arg("an-older-engine")
        .arg("PX")
        .arg(60_000)
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("saga:{saga:pm}:lease:pm-lock:door:d1")
        .arg("someone")
        .arg("PX")
        .arg(1000)
        .query(&mut conn)
        .unwrap();
    let engine = Engine::builder()
        .backend(redis.backend().await)
        .lock_ttl(Duration::from_millis(800))
        .process_manager(Door)
        .workers(1)
        .build()
        .await
        .unwrap();
    until("the engine owning the partitions", async || {
        redis.partition_owner_set().is_some()
    })
    .await;
    engine.publish(Knock { key: "d1".into() }).await.unwrap();
    until("the knock, once the lease is free", async || {
        sum::<Door>(&engine, "d1").await == 1
    })
    .await;
    engine.shutdown().await;
}

/// Was (a minute, then dead letters): with an engine that runs `pinger`
/// alive beside a busier one that does not, a ping that the busier engine
/// took off the shared stream went back with a growing delay (1, 2, 4 ...
/// s, counted toward the delivery cap) as if no engine ran `pinger`, and
/// the busier engine kept taking it. Now it goes back at once, uncounted,
/// while an engine that runs it is alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_reaches_the_engine_that_runs_its_process_manager_promptly() {
    let redis = TestRedis::start();
    let lease = Duration::from_millis(800);
    let adders = engine(&redis, Runs::Adder, 4, lease).await;
    let pingers = engine(&redis, Runs::Pinger, 1, lease).await;
    until("both engines owning partitions", async || {
        redis.partition_owner_set().is_some_and(|s| s.len() == 2)
    })
    .await;
    let client = engine(&redis, Runs::Pinger, 0, lease).await;
    let started = Instant::now();
    for n in 0..20 {
        client
            .publish(Ping {
                key: format!("p-{n}"),
            })
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&pingers, |m| &m.handled) < 20 {
        assert!(Instant::now() < deadline, "pings still not handled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "20 pings took {took:?} to reach the engine that runs `pinger`"
    );
    assert_eq!(metric(&adders, |m| &m.dead_lettered), 0);
    for n in 0..20 {
        assert_eq!(sum::<Pinger>(&pingers, &format!("p-{n}")).await, 1);
    }
    adders.shutdown().await;
    pingers.shutdown().await;
}
