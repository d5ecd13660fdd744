//! The process-manager scripts, case by case: the commit (conflict,
//! tombstone, a correlation entry taken, a tally that exists, the normal
//! path), entry claims, due timeouts, and tallies.

use super::Fixture;
use crate::backend::redis::scripts::{
    self as s, EntryClaim, Holding, ProcessCommitted, RefusalCode, Refused, SettleArgv,
    TallyFinished,
};
use crate::model::tally::TallyProgress;

const GROUP: &str = "workers";

fn refused(refusal: RefusalCode, detail: Option<&str>) -> Refused {
    Refused {
        refusal,
        detail: detail.map(str::to_owned),
    }
}

fn committed(version: u64) -> ProcessCommitted {
    ProcessCommitted {
        version,
        relayed: Vec::new(),
    }
}

impl Fixture {
    /// Every key and its `DUMP`: what a refused write must leave as it
    /// was.
    async fn snapshot(&mut self) -> Vec<(String, Vec<u8>)> {
        let mut keys: Vec<String> = self.cmd(&["KEYS", "*"]).await;
        keys.sort();
        let mut all = Vec::new();
        for key in keys {
            let dump: Vec<u8> = self.cmd(&["DUMP", &key]).await;
            all.push((key, dump));
        }
        all
    }

    fn correlation(&self, value: &str) -> s::Correlation {
        s::Correlation {
            entry: self.keys.correlation("orders", "order", value),
            tombstone: self.keys.correlation_tombstone("orders", "order", value),
        }
    }

    /// Instance `id` of `orders` written at `version`, claiming order 42,
    /// with a message out, a timeout and an endpoint message.
    fn process_commit(&self, id: &str, version: u64) -> s::ProcessCommit<'static> {
        let k = &self.keys;
        let part = k.process_partition(k.pm_k("orders", id));
        s::ProcessCommit {
            instance: k.instance("orders", id),
            instances: k.instances("orders", 0),
            queue: k.queue(part),
            dead: k.dead(part),
            schedule: k.scheduled(0),
            claim: vec![self.correlation("42")],
            release: Vec::new(),
            endpoints: vec![s::EndpointMessage {
                stream: k.endpoint("billing"),
                relay_to: None,
                payload: "bill".to_owned(),
            }],
            tombstone: k.tombstone("orders", id),
            tallies: Vec::new(),
            open_tallies: k.open_tallies(0),
            join_shared: Vec::new(),
            leave_shared: Vec::new(),
            members: Some(k.partition_members()),
            has_instance: true,
            version,
            doc: format!(r#"{{"v":{version}}}"#),
            id: id.to_owned(),
            delete: false,
            generation: "g1",
            settle: SettleArgv::Keep,
            group: GROUP,
            dead_cap: 100,
            endpoint_cap: 100,
            handling: Some("m1"),
            tombstone_ttl_ms: 60_000,
            deleted_handled: Vec::new(),
            batched: Vec::new(),
            enqueue: vec![(k.queue(k.process_partition(3)), "out".to_owned())],
            timeouts: vec![(5000, "later".to_owned())],
            release_held: Vec::new(),
        }
    }

    /// The keys of the messages held for instance `id` of `orders`.
    fn held(&self, id: &str) -> s::HeldKeys {
        let k = &self.keys;
        s::HeldKeys {
            list: k.held("orders", "", id, ""),
            payloads: k.held("orders", "", id, ":p"),
            schedule: k.scheduled(0),
            queue: k.queue(k.process_route("orders", id)),
        }
    }

    /// A hold of message `m` (payload `m`, due at 9000) for instance `id`.
    fn hold<'a>(&self, id: &str, m: &'a str, cap: usize) -> s::ProcessHold<'a> {
        let k = &self.keys;
        s::ProcessHold {
            owner: k.instance("orders", id),
            tombstone: k.tombstone("orders", id),
            held: self.held(id),
            settle: None,
            message_id: m,
            payload: format!("payload-{m}"),
            until_ms: 9000,
            cap,
        }
    }

    fn open_tally(&self, name: &str, items: &[&str]) -> s::OpenTally {
        let tally = format!("saga:{{saga:pm}}:tally:orders:{name}:g:i1");
        s::OpenTally {
            hash: tally.clone(),
            pending: format!("{tally}:pending"),
            checked: format!("{tally}:checked"),
            keep_ms: 60_000,
            completion: "done".to_owned(),
            completion_late: "late".to_owned(),
            completion_queue: self.keys.queue(self.keys.process_partition(1)),
            items: items.iter().map(|i| (*i).to_owned()).collect(),
            member: format!("member:{name}"),
        }
    }
}

#[tokio::test]
async fn process_commit_writes_the_instance_and_its_outbox() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    assert_eq!(
        f.call(&f.process_commit("i1", 0)).await.unwrap(),
        Ok(committed(1))
    );
    let record: Vec<String> = f.cmd(&["HGETALL", &k.instance("orders", "i1")]).await;
    assert_eq!(record, ["doc", r#"{"v":0}"#, "version", "1", "gen", "g1"]);
    let owner: String = f
        .cmd(&["GET", &k.correlation("orders", "order", "42")])
        .await;
    let members: Vec<String> = f.cmd(&["SMEMBERS", &k.instances("orders", 0)]).await;
    assert_eq!((owner.as_str(), members), ("i1", vec!["i1".to_owned()]));
    let endpoint = f.entries(&k.endpoint("billing")).await;
    assert_eq!(endpoint[0].1, ["envelope", "bill"]);
    let scheduled: Vec<(String, u64)> = f
        .cmd(&["ZRANGE", &k.scheduled(0), "0", "-1", "WITHSCORES"])
        .await;
    assert_eq!(scheduled, [("later".to_owned(), 5000)]);
    // No engine reads partitions yet: the shared stream.
    let shared = f.entries(&k.queue(k.process_stream())).await;
    assert_eq!(shared[0].1, ["payload", "out"]);

    // The next version; a message relayed to an endpoint in another slot,
    // a tally opened, the delivery acknowledged.
    let queue = k.queue(k.process_partition(k.pm_k("orders", "i1")));
    f.group(&queue).await;
    let entry = f.add(&queue, "in").await;
    f.read(&queue, "c1").await;
    let mut next = f.process_commit("i1", 1);
    next.endpoints[0] = s::EndpointMessage {
        stream: k.relays(0),
        relay_to: Some(k.endpoint("elsewhere")),
        payload: "far".to_owned(),
    };
    next.tallies = vec![f.open_tally("items", &["a", "b", "a"])];
    next.settle = SettleArgv::Ack { entry };
    next.handling = Some("m2");
    let reply = f.call(&next).await.unwrap().unwrap();
    let relays = f.entries(&k.relays(0)).await;
    assert_eq!(reply.version, 2);
    assert_eq!(reply.relayed, [relays[0].0.clone()]);
    assert_eq!(
        relays[0].1,
        ["relay", &k.endpoint("elsewhere"), "envelope", "far"]
    );
    assert!(f.entries(&queue).await.is_empty(), "acknowledged");
    let tally = &next.tallies[0];
    let hash: Vec<String> = f.cmd(&["HGETALL", &tally.hash]).await;
    assert_eq!(
        hash,
        [
            "total",
            "2",
            "done",
            "0",
            "completion",
            "done",
            "completion_late",
            "late"
        ]
    );
    let mut pending: Vec<String> = f.cmd(&["SMEMBERS", &tally.pending]).await;
    pending.sort();
    assert_eq!(pending, ["a", "b"]);
    let open: Vec<String> = f.cmd(&["ZRANGE", &k.open_tallies(0), "0", "-1"]).await;
    assert_eq!(open, ["member:items"]);
}

#[tokio::test]
async fn process_commit_refuses_before_writing() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    f.call(&f.process_commit("i1", 0)).await.unwrap().unwrap();
    let _: () = f.cmd(&["SADD", &k.tombstone("orders", "i1"), "m9"]).await;
    let _: () = f
        .cmd(&["SET", &k.correlation("orders", "order", "7"), "i9"])
        .await;
    let existing = f.open_tally("items", &["a"]);
    let _: () = f.cmd(&["HSET", &existing.hash, "total", "1"]).await;
    let before = f.snapshot().await;

    let stale = f.process_commit("i1", 0);
    let mut reborn = f.process_commit("i1", 1);
    reborn.generation = "g2";
    let mut tombstoned = f.process_commit("i1", 1);
    tombstoned.handling = Some("m9");
    let mut batched = f.process_commit("i1", 1);
    batched.handling = None;
    batched.batched = vec![s::BatchedMessage {
        message_id: "m9".to_owned(),
        queue: k.queue(0),
        entry: "1-1".to_owned(),
    }];
    let mut taken = f.process_commit("i1", 1);
    taken.claim.push(f.correlation("7"));
    let mut tally = f.process_commit("i1", 1);
    tally.tallies = vec![f.open_tally("new", &["x"]), existing];
    let cases = [
        (
            "stale version",
            stale,
            refused(RefusalCode::Conflict, Some("1")),
        ),
        (
            "another generation",
            reborn,
            refused(RefusalCode::Conflict, Some("1")),
        ),
        (
            "tombstoned",
            tombstoned,
            refused(RefusalCode::Tombstoned, None),
        ),
        (
            "tombstoned batch",
            batched,
            refused(RefusalCode::Tombstoned, None),
        ),
        (
            "entry taken",
            taken,
            refused(RefusalCode::Taken, Some("i9")),
        ),
        (
            "tally exists",
            tally,
            refused(RefusalCode::TallyExists, Some("2")),
        ),
    ];
    for (case, commit, expected) in cases {
        assert_eq!(f.call(&commit).await.unwrap(), Err(expected), "{case}");
        assert_eq!(f.snapshot().await, before, "{case}: nothing written");
    }
}

#[tokio::test]
async fn process_commit_deletes_and_remembers_what_was_handled() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    f.call(&f.process_commit("i1", 0)).await.unwrap().unwrap();
    let mut delete = f.process_commit("i1", 1);
    delete.delete = true;
    delete.claim = Vec::new();
    delete.release = vec![f.correlation("42")];
    delete.deleted_handled = vec!["m1".to_owned(), "m2".to_owned()];
    assert_eq!(f.call(&delete).await.unwrap(), Ok(committed(0)));
    let exists: u64 = f
        .cmd(&[
            "EXISTS",
            &k.instance("orders", "i1"),
            &k.correlation("orders", "order", "42"),
        ])
        .await;
    assert_eq!(exists, 0);
    for tombstone in [
        k.tombstone("orders", "i1"),
        k.correlation_tombstone("orders", "order", "42"),
    ] {
        let mut handled: Vec<String> = f.cmd(&["SMEMBERS", &tombstone]).await;
        handled.sort();
        let ttl: i64 = f.cmd(&["PTTL", &tombstone]).await;
        assert_eq!(handled, ["m1", "m2"], "{tombstone}");
        assert!(ttl > 0 && ttl <= 60_000, "{tombstone}: {ttl}");
    }
    // A late duplicate of a handled message, claiming the value again.
    let mut late = f.process_commit("i2", 0);
    late.handling = Some("m2");
    late.tombstone = k.tombstone("orders", "i2");
    assert_eq!(
        f.call(&late).await.unwrap(),
        Err(refused(RefusalCode::Tombstoned, None))
    );
    // A settle-only write (no instance) still settles, as a dead letter.
    let queue = k.queue(k.process_partition(2));
    f.group(&queue).await;
    let entry = f.add(&queue, "bad").await;
    f.read(&queue, "c1").await;
    let mut settle_only = f.process_commit("", 0);
    settle_only.has_instance = false;
    settle_only.queue = queue.clone();
    settle_only.dead = k.dead(k.process_partition(2));
    settle_only.settle = SettleArgv::Dead {
        entry,
        payload: "bad",
        reason: "no handler",
        size: None,
    };
    assert_eq!(f.call(&settle_only).await.unwrap(), Ok(committed(0)));
    let letters = f.entries(&k.dead(k.process_partition(2))).await;
    assert_eq!(
        letters[0].1[..6],
        ["payload", "bad", "reason", "no handler", "task", ""]
    );
    assert!(f.entries(&queue).await.is_empty());
}

#[tokio::test]
async fn claim_entry_swap_entry_and_remember() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let c = f.correlation("42");
    let marker = k.correlation_claim("orders", "order", "42");
    let claim = |id: &'static str, handled: &'static [&'static str]| s::ClaimEntry {
        entry: c.entry.clone(),
        tombstone: c.tombstone.clone(),
        marker: marker.clone(),
        id,
        handled,
        in_flight_ms: 30_000,
    };
    assert_eq!(
        f.call(&claim("i1", &["m1"])).await.unwrap(),
        Ok(EntryClaim::Claimed)
    );
    let ttl: i64 = f.cmd(&["PTTL", &marker]).await;
    assert!(ttl > 0, "the claim is in flight: {ttl}");
    assert_eq!(
        f.call(&claim("i1", &["m1"])).await.unwrap(),
        Ok(EntryClaim::Held)
    );
    assert_eq!(
        f.call(&claim("i2", &[])).await.unwrap(),
        Err(refused(RefusalCode::Taken, Some("i1")))
    );

    let swap = |expected: &'static str, owner| s::SwapEntry {
        entry: c.entry.clone(),
        expected,
        owner,
    };
    assert!(!f.call(&swap("i2", None)).await.unwrap(), "not i2's");
    assert!(f.call(&swap("i1", Some("i3"))).await.unwrap());
    assert!(f.call(&swap("i3", None)).await.unwrap());
    let exists: u64 = f.cmd(&["EXISTS", &c.entry]).await;
    assert_eq!(exists, 0);

    let handled = ["m7".to_owned()];
    let remember = |members| s::Remember {
        set: c.tombstone.clone(),
        ttl_ms: 60_000,
        members,
    };
    assert!(
        !f.call(&remember(&[])).await.unwrap(),
        "nothing to remember"
    );
    assert!(f.call(&remember(&handled)).await.unwrap());
    assert_eq!(
        f.call(&claim("i4", &["m0", "m7"])).await.unwrap(),
        Err(refused(RefusalCode::Tombstoned, None))
    );
}

#[tokio::test]
async fn release_due_routes_timeouts_to_their_partitions() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let schedule = k.scheduled(0);
    let timeout = r#"{"process":"orders","instance_id":"i1"}"#;
    for (due, payload) in [("100", timeout), ("200", "not json"), ("9000", "later")] {
        let _: () = f.cmd(&["ZADD", &schedule, due, payload]).await;
    }
    let release = |members: Option<String>| s::ReleaseDue {
        schedule: schedule.clone(),
        queue: k.queue(k.process_stream()),
        members,
        due_by_ms: 1000,
        limit: 10,
        pm_prefix: k.process_prefix(k.process_stream()),
        partitions: k.pm_count(),
    };
    // A live member reads partitions: routed, but what does not decode
    // goes to the shared stream.
    let _: () = f
        .cmd(&["ZADD", &k.partition_members(), "99999999999999", "e1"])
        .await;
    assert_eq!(
        f.call(&release(Some(k.partition_members()))).await.unwrap(),
        2
    );
    let routed = f.entries(&k.queue(k.process_route("orders", "i1"))).await;
    assert_eq!(routed[0].1, ["payload", timeout]);
    let shared = f.entries(&k.queue(k.process_stream())).await;
    assert_eq!(shared[0].1, ["payload", "not json"]);
    let left: Vec<String> = f.cmd(&["ZRANGE", &schedule, "0", "-1"]).await;
    assert_eq!(left, ["later"], "each exactly once");
}

#[tokio::test]
async fn tally_finish_sends_a_completion_once() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let mut commit = f.process_commit("i1", 0);
    commit.tallies = vec![f.open_tally("items", &["a"])];
    f.call(&commit).await.unwrap().unwrap();
    let tally = &commit.tallies[0];
    let finish = |mover| s::TallyFinish {
        tally: tally.hash.clone(),
        pending: tally.pending.clone(),
        checked: tally.checked.clone(),
        queue: k.queue(k.process_partition(1)),
        open_tallies: k.open_tallies(0),
        members: Some(k.partition_members()),
        keep_ms: 1000,
        member: tally.member.clone(),
        mover,
    };
    let progress = |mark_deadline| s::TallyProgress {
        tally: tally.hash.clone(),
        pending: tally.pending.clone(),
        missing: 5,
        mark_deadline,
    };
    let expected = TallyProgress {
        total: 1,
        checked: 0,
        missing: vec!["a".to_owned()],
        complete: false,
        deadline_passed: true,
    };
    assert_eq!(f.call(&progress(true)).await.unwrap(), Some(expected));
    // An item unchecked: not yet.
    assert_eq!(f.call(&finish(true)).await.unwrap(), TallyFinished::NotSent);
    let _: u64 = f.cmd(&["SMOVE", &tally.pending, &tally.checked, "a"]).await;
    // A repair sends it (the late completion: the deadline passed); the
    // mover that checked the last item is answered "sent", once.
    assert_eq!(f.call(&finish(false)).await.unwrap(), TallyFinished::Sent);
    assert_eq!(f.call(&finish(true)).await.unwrap(), TallyFinished::Sent);
    assert_eq!(f.call(&finish(true)).await.unwrap(), TallyFinished::NotSent);
    let sent = f.entries(&k.queue(k.process_stream())).await;
    let payloads: Vec<&str> = sent.iter().map(|e| e.1[1].as_str()).collect();
    assert_eq!(payloads, ["out", "late"], "the late completion, once");
    let expected = TallyProgress {
        total: 1,
        checked: 1,
        missing: Vec::new(),
        complete: true,
        deadline_passed: true,
    };
    assert_eq!(f.call(&progress(false)).await.unwrap(), Some(expected));
    let ttl: i64 = f.cmd(&["PTTL", &tally.hash]).await;
    assert!(ttl > 0 && ttl <= 1000, "kept a while once complete: {ttl}");
    let _: () = f.cmd(&["DEL", &tally.hash]).await;
    assert_eq!(f.call(&finish(false)).await.unwrap(), TallyFinished::Gone);
    assert_eq!(f.call(&progress(false)).await.unwrap(), None);
}

#[tokio::test]
async fn holds_count_only_what_is_still_held_and_the_creating_commit_releases_them_in_order() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    for m in ["a", "b"] {
        assert_eq!(
            f.call(&f.hold("i9", m, 2)).await.unwrap(),
            Ok(Holding::Held)
        );
    }
    assert_eq!(
        f.call(&f.hold("i9", "a", 2)).await.unwrap(),
        Ok(Holding::Already)
    );
    assert_eq!(
        f.call(&f.hold("i9", "c", 2)).await.unwrap(),
        Err(refused(RefusalCode::HoldFull, Some("2")))
    );
    // "a" is no longer scheduled (its hold ended and the poller moved it):
    // it counts no longer, and "c" is held.
    let _: i64 = f.cmd(&["ZREM", &k.scheduled(0), "payload-a"]).await;
    assert_eq!(
        f.call(&f.hold("i9", "c", 2)).await.unwrap(),
        Ok(Holding::Held)
    );
    let ids: Vec<String> = f
        .cmd(&["LRANGE", &k.held("orders", "", "i9", ""), "0", "-1"])
        .await;
    assert_eq!(ids, ["b", "c"]);
    // The instance's creation moves "b" then "c" onto its queue.
    let mut create = f.process_commit("i9", 0);
    create.claim.clear();
    create.release_held = vec![f.held("i9")];
    assert_eq!(f.call(&create).await.unwrap(), Ok(committed(1)));
    let released: Vec<Vec<String>> = f
        .entries(&k.queue(k.process_stream()))
        .await
        .into_iter()
        .map(|(_, fields)| fields)
        .collect();
    assert!(
        released.starts_with(&[
            vec!["payload".to_owned(), "payload-b".to_owned()],
            vec!["payload".to_owned(), "payload-c".to_owned()],
        ]),
        "{released:?}"
    );
    let left: Vec<String> = f.cmd(&["KEYS", "*held*"]).await;
    assert!(left.is_empty(), "{left:?}");
    // The instance exists now: a hold for it is refused.
    assert_eq!(
        f.call(&f.hold("i9", "d", 2)).await.unwrap(),
        Err(refused(RefusalCode::Conflict, None))
    );
}
