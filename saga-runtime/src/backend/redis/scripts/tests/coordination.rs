//! Named leases, shared circuit breakers, partition balancing, runners,
//! readers, and housekeeping's scripts, case by case.

use std::time::Duration;

use super::Fixture;
use crate::backend::redis::scripts as s;
use crate::backend::{BreakerChange, BreakerDecision};
use crate::model::task::{TaskId, TaskStatus};

#[tokio::test]
async fn named_lease_is_held_by_one_token_at_a_time() {
    let mut f = Fixture::new().await;
    let lease = f.keys.lease("janitor");
    let take = |token| s::NamedLease {
        lease: lease.clone(),
        token,
        ttl_ms: 10_000,
    };
    let cases = [
        ("free: taken", "a", true),
        ("renewed by its holder", "a", true),
        ("held by another", "b", false),
    ];
    for (case, token, held) in cases {
        assert_eq!(f.call(&take(token)).await.unwrap(), held, "{case}");
    }
    let release = |token| s::Unlock {
        lock: lease.clone(),
        token,
    };
    assert!(!f.call(&release("b")).await.unwrap());
    assert!(f.call(&release("a")).await.unwrap());
    assert!(f.call(&take("b")).await.unwrap(), "free again");
}

#[tokio::test]
async fn a_shared_breaker_opens_lets_one_probe_through_and_closes() {
    let mut f = Fixture::new().await;
    let breaker = f.keys.breaker("payments");
    let acquire = |token| s::BreakerAcquire {
        breaker: breaker.clone(),
        probe_ttl_ms: 60_000,
        token,
    };
    let report = |probe, failed| s::BreakerReport {
        breaker: breaker.clone(),
        probe,
        failed,
        threshold: 2,
        open_ms: 500,
        keep_ms: 60_000,
    };
    let call = |probe, counting| BreakerDecision::Call { probe, counting };
    assert_eq!(f.call(&acquire("t")).await.unwrap(), call(false, false));
    // Failures counted up to the threshold, which opens it.
    assert_eq!(f.call(&report(None, Some(true))).await.unwrap(), None);
    assert_eq!(f.call(&acquire("t")).await.unwrap(), call(false, true));
    assert_eq!(
        f.call(&report(None, Some(true))).await.unwrap(),
        Some(BreakerChange::Opened)
    );
    let decision = f.call(&acquire("t")).await.unwrap();
    assert!(
        matches!(decision, BreakerDecision::Open { retry_after } if retry_after <= Duration::from_millis(500)),
        "{decision:?}"
    );
    tokio::time::sleep(Duration::from_millis(550)).await;
    // Half-open: one probe, the others wait for it.
    assert_eq!(f.call(&acquire("p1")).await.unwrap(), call(true, false));
    let decision = f.call(&acquire("p2")).await.unwrap();
    assert!(
        matches!(decision, BreakerDecision::Open { .. }),
        "{decision:?}"
    );
    // A report under another token is not the probe's.
    assert_eq!(
        f.call(&report(Some("p2"), Some(false))).await.unwrap(),
        None
    );
    // The probe that did not call gives its slot back.
    assert_eq!(f.call(&report(Some("p1"), None)).await.unwrap(), None);
    assert_eq!(f.call(&acquire("p3")).await.unwrap(), call(true, false));
    assert_eq!(
        f.call(&report(Some("p3"), Some(false))).await.unwrap(),
        Some(BreakerChange::Closed)
    );
    let exists: u64 = f.cmd(&["EXISTS", &breaker]).await;
    assert_eq!(exists, 0, "a closed breaker keeps no state");
}

#[tokio::test]
async fn balance_spreads_partitions_over_members() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let balance = |member, leaving| s::Balance {
        members: k.partition_members(),
        owner_prefix: k.partition_owner_prefix(),
        member,
        ttl_ms: 10_000,
        partitions: 4,
        leaving,
        pm_prefix: Some(k.process_prefix(k.process_stream())),
        busy: Vec::new(),
    };
    assert_eq!(f.call(&balance("a", false)).await.unwrap(), [0, 1, 2, 3]);
    // `b` joins: the ones `a` holds are not free for it yet.
    assert!(f.call(&balance("b", false)).await.unwrap().is_empty());
    // `a` still handles a message of partition 1: it keeps it, unread.
    let busy = s::Balance {
        busy: vec![1],
        ..balance("a", false)
    };
    assert_eq!(f.call(&busy).await.unwrap(), [0, 2]);
    assert_eq!(f.call(&balance("b", false)).await.unwrap(), [3]);
    assert_eq!(f.call(&balance("a", false)).await.unwrap(), [0, 2]);
    assert_eq!(f.call(&balance("b", false)).await.unwrap(), [1, 3]);
    // Due hand-backs move onto the owner's partitions.
    let delayed = format!("{}:delayed:1", k.process_prefix(k.process_stream()));
    let _: () = f.cmd(&["ZADD", &delayed, "0", "0:back"]).await;
    f.call(&balance("b", false)).await.unwrap();
    let moved = f.entries(&k.queue(k.process_partition(1))).await;
    assert_eq!(moved[0].1, ["payload", "back"]);
    // Leaving lets go of all of them.
    assert!(f.call(&balance("b", true)).await.unwrap().is_empty());
    assert_eq!(f.call(&balance("a", false)).await.unwrap(), [0, 1, 2, 3]);
}

#[tokio::test]
async fn runners_and_readers_count_live_members() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let announce = |member, ttl_ms| s::Announce {
        runner_sets: vec![k.process_runners("orders"), k.process_runners("billing")],
        member,
        ttl_ms,
    };
    let runners = |name| s::Runners {
        runners: k.process_runners(name),
    };
    assert_eq!(f.call(&runners("orders")).await.unwrap(), 0);
    f.call(&announce("e1", Some(10_000))).await.unwrap();
    f.call(&announce("e2", Some(10_000))).await.unwrap();
    assert_eq!(f.call(&runners("orders")).await.unwrap(), 2);
    f.call(&announce("e1", None)).await.unwrap();
    assert_eq!(f.call(&runners("billing")).await.unwrap(), 1);

    let readers = |member, ttl_ms| s::Readers {
        readers: k.saga_readers(),
        member,
        ttl_ms,
    };
    assert_eq!(
        f.call(&readers("b", Some(10_000))).await.unwrap(),
        Some((0, 1))
    );
    assert_eq!(
        f.call(&readers("a", Some(10_000))).await.unwrap(),
        Some((0, 2))
    );
    assert_eq!(
        f.call(&readers("b", Some(10_000))).await.unwrap(),
        Some((1, 2))
    );
    assert_eq!(f.call(&readers("a", None)).await.unwrap(), Some((0, 1)));
}

#[tokio::test]
async fn purge_removes_expired_tasks_but_not_a_new_one_under_the_same_id() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let gone: TaskId = "00000000-0000-0000-0000-000000000001".parse().unwrap();
    let back: TaskId = "00000000-0000-0000-0000-000000000002".parse().unwrap();
    let expiring = k.expiring(0);
    let done = k.index(0, "orders", Some(TaskStatus::Completed));
    for id in [gone, back] {
        let member = format!("{id}|Completed|orders");
        let _: () = f.cmd(&["ZADD", &expiring, "1", &member]).await;
        let _: () = f.cmd(&["ZADD", &done, "1", &id.to_string()]).await;
        let _: () = f
            .cmd(&["ZADD", &k.index(0, "orders", None), "1", &id.to_string()])
            .await;
        let _: () = f.cmd(&["SET", &k.fence(id), "3"]).await;
    }
    // `back` was created again since (Running, no expiry).
    let _: () = f.cmd(&["HSET", &k.task(back), "status", "Running"]).await;
    let expired = s::Expired {
        expiring: expiring.clone(),
        limit: 10,
    };
    let members = f.call(&expired).await.unwrap();
    assert_eq!(members.len(), 2);
    let purge = s::Purge {
        expiring: expiring.clone(),
        tasks: [gone, back]
            .into_iter()
            .map(|id| s::PurgedTask {
                task: k.task(id),
                fence: k.fence(id),
                cancel: k.cancel(id),
                claims: k.claims(id),
                lock: k.lock(id),
                index_all: k.index(0, "orders", None),
                index_status: done.clone(),
                audit: k.audit(id),
                member: format!("{id}|Completed|orders"),
                id: id.to_string(),
                status: TaskStatus::Completed,
            })
            .collect(),
    };
    assert_eq!(f.call(&purge).await.unwrap(), 1);
    let exists: u64 = f
        .cmd(&["EXISTS", &k.fence(gone), &k.task(back), &k.fence(back)])
        .await;
    assert_eq!(exists, 2, "the old task's keys gone, the new one's kept");
    let left: Vec<String> = f.cmd(&["ZRANGE", &done, "0", "-1"]).await;
    assert!(left.is_empty(), "no index entry of an old status: {left:?}");
    let all: Vec<String> = f
        .cmd(&["ZRANGE", &k.index(0, "orders", None), "0", "-1"])
        .await;
    assert_eq!(all, [back.to_string()]);
    assert!(f.call(&expired).await.unwrap().is_empty());
}

#[tokio::test]
async fn dead_letters_trimmed_by_age_and_consumers_that_left_removed() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let dead = k.dead(0);
    let _: String = f.cmd(&["XADD", &dead, "1-1", "payload", "old"]).await;
    let trim = |keep_ms| s::TrimDead {
        dead: dead.clone(),
        keep_ms,
    };
    assert_eq!(f.call(&trim(None)).await.unwrap(), 0, "no age limit");
    assert_eq!(f.call(&trim(Some(60_000))).await.unwrap(), 1);
    let exists: u64 = f.cmd(&["EXISTS", &dead]).await;
    assert_eq!(exists, 0, "an empty dead-letter stream goes");

    let queue = k.queue(0);
    f.group(&queue).await;
    f.add(&queue, "m").await;
    f.read(&queue, "busy").await;
    let _: u64 = f
        .cmd(&["XGROUP", "CREATECONSUMER", &queue, "workers", "idle"])
        .await;
    let reap = s::ReapConsumers {
        stream: queue.clone(),
        group: "workers",
        idle_ms: 0,
    };
    assert_eq!(
        f.call(&reap).await.unwrap(),
        1,
        "only the one holding nothing"
    );
    let leave = |consumer| s::LeaveGroup {
        stream: queue.clone(),
        group: "workers",
        consumer,
    };
    assert!(!f.call(&leave("busy")).await.unwrap(), "it holds a message");
    let _: u64 = f
        .cmd(&["XGROUP", "CREATECONSUMER", &queue, "workers", "w"])
        .await;
    assert!(f.call(&leave("w")).await.unwrap());
    let missing = s::LeaveGroup {
        stream: k.queue(1),
        group: "workers",
        consumer: "w",
    };
    assert!(
        !f.call(&missing).await.unwrap(),
        "no group: nothing to leave"
    );
}
